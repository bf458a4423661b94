"""Detection-count buckets for the mask branch (``Config.mask_detection_buckets``).

The staged path (box stage, host read of the valid counts, mask stage on the smallest bucket that
holds them) must give the single graph's outputs, pick its bucket by the documented rule, and
compile to one graph per canvas (box stage) plus one per (canvas, bucket) used (mask stage), under
torch.compile and on XLA (no CPU fallback op: the counts are copied to the host, not read by .item()).
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from mrcnn.config import get_config
from mrcnn.model import MaskRCNN
from mrcnn.staged import StagedDetector, mask_bucket, stages_masks
from mrcnn.structures import Detections, ImageBatch, canvas_of
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, textured_images

BUCKETS = (8, 16, 32, 64)  # K = 100 is appended
# With the tiny preset's synthetic weights (seed 0) and scores above 0.9, these images (seed 11)
# hold 5, 17 and 21 detections: buckets 8, 32 and 32; the first two are landscape (320, 448), the
# third portrait (448, 320). With the default threshold (0.05) each holds all K = 100.
FEW, MORE, PORTRAIT = textured_images(((240, 320), (300, 400), (320, 240)), seed=11)
RAISED_THRESH = 0.9


def _model(tiny_cfg, weights, impl: str = "torchvision", thresh: float | None = None) -> MaskRCNN:
    # NCHW and unfolded norms in eager too, as compiled stages keep them under "auto": outputs are
    # compared exactly.
    cfg = tiny_cfg.replace(ops_impl=impl, mask_detection_buckets=BUCKETS, channels_last=False, fold_batch_norm=False)
    if thresh is not None:
        cfg = cfg.replace(box_score_thresh=thresh)
    return load_torchvision_weights(MaskRCNN(cfg).eval(), weights)


def _assert_equal(got: Detections, expected: Detections, images: torch.Tensor | None = None) -> None:
    """Boxes, scores, labels and valid exactly; masks within 1e-6 (on the images that are not padding)."""
    keep = slice(None) if images is None else images
    for name in ("boxes", "scores", "labels", "valid"):
        assert torch.equal(getattr(got, name)[keep], getattr(expected, name)[keep]), name
    assert got.masks.shape == expected.masks.shape
    torch.testing.assert_close(got.masks[keep], expected.masks[keep], atol=1e-6, rtol=0)


# -- configuration and the bucket rule ----------------------------------------------------------


def test_config_buckets_default_and_k_appended():
    cfg = get_config("tiny")
    assert cfg.mask_detection_buckets == "auto" and cfg.mask_buckets == (8, 16, 32, 64, 100)
    assert cfg.replace(box_detections_per_img=32).mask_buckets == (8, 16, 32)
    assert cfg.replace(mask_detection_buckets=()).mask_buckets == (100,)
    assert cfg.replace(mask_detection_buckets=(8, 16)).mask_buckets == (8, 16, 100)
    assert cfg.replace(mask_detection_buckets=(8, 100)).mask_buckets == (8, 100)
    assert cfg.replace(box_detections_per_img=32, mask_detection_buckets=(8, 16)).mask_buckets == (8, 16, 32)
    # A list (as ``--set mask_detection_buckets=[8,16]`` parses) becomes a tuple.
    assert get_config("tiny", mask_detection_buckets=[8, 16]).mask_detection_buckets == (8, 16)


@pytest.mark.parametrize(
    ("buckets", "message"),
    [
        ((0, 8), "must be positive"),
        ((-8,), "must be positive"),
        ((16, 8), "strictly increasing"),
        ((8, 8, 16), "strictly increasing"),
        ((8, 200), "must not exceed box_detections_per_img (100)"),
        ((8.0, 16), "must be a tuple of ints"),
        ((True,), "must be a tuple of ints"),
        (8, "must be a tuple of ints"),
        ("on", "must be a tuple of ints, e.g. (8, 16, 32, 64) or 'auto'"),
    ],
)
def test_config_rejects_bad_buckets(buckets, message):
    with pytest.raises(ValueError, match="mask_detection_buckets") as info:
        get_config("tiny", mask_detection_buckets=buckets)
    assert message in str(info.value)


def test_bucket_rule_smallest_that_holds_the_batch_shared_evenly(tiny_cfg, tiny_weights):
    buckets = (8, 16, 100)
    assert [mask_bucket(buckets, c) for c in (0, 1, 8, 9, 16, 17, 100)] == [8, 8, 8, 16, 16, 100, 100]
    with pytest.raises(ValueError, match="exceed the largest"):
        mask_bucket(buckets, 101)

    detector = StagedDetector(_model(tiny_cfg, tiny_weights))
    one = torch.zeros(1, 100, dtype=torch.bool)
    assert detector.bucket(one) == 8  # an empty image takes the smallest bucket
    one[0, :17] = True
    assert detector.bucket(one) == 32  # one image: the bucket of its own count
    valid = torch.zeros(3, 100, dtype=torch.bool)
    assert detector.bucket(valid) == 3 * 8  # a batch packs B x s slots, s for the count shared evenly
    valid[0, :3] = True
    valid[2, :17] = True
    assert detector.bucket(valid) == 3 * 8  # 20 detections: 7 per image
    valid[1, :] = True
    assert detector.bucket(valid) == 3 * 64  # 120: 40 per image
    valid[:] = True
    assert detector.bucket(valid) == 3 * 100


def test_auto_stages_eager_cpu_only():
    auto = get_config("tiny")
    cpu, xla, cuda = torch.device("cpu"), torch.device("xla"), torch.device("cuda")
    assert stages_masks(auto, cpu)
    assert not stages_masks(auto, cpu, compiled=True)
    assert not stages_masks(auto, xla) and not stages_masks(auto, cuda)
    # Set buckets stage everywhere, none nowhere.
    for device in (cpu, xla, cuda):
        assert stages_masks(auto.replace(mask_detection_buckets=(8,)), device, compiled=True)
        assert not stages_masks(auto.replace(mask_detection_buckets=()), device)


def _forward_calls(model: MaskRCNN) -> list[int]:
    calls: list[int] = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls


def test_default_predict_stages_on_cpu_unless_compiled_in_place(tiny_cfg, tiny_weights, monkeypatch):
    """predict with the default config runs the staged path (no call of the single graph), with the
    single graph's outputs; a model compiled in place keeps its compiled forward."""
    cfg = tiny_cfg.replace(box_score_thresh=RAISED_THRESH, channels_last=False)
    auto = load_torchvision_weights(MaskRCNN(cfg).eval(), tiny_weights)
    single = load_torchvision_weights(MaskRCNN(cfg.replace(mask_detection_buckets=())).eval(), tiny_weights)
    auto_calls, single_calls = _forward_calls(auto), _forward_calls(single)
    got, expected = auto.predict([FEW, PORTRAIT]), single.predict([FEW, PORTRAIT])
    assert auto_calls == [] and len(single_calls) == 2  # one forward per canvas
    for g, e in zip(got, expected):
        for key in ("boxes", "scores", "labels"):
            assert torch.equal(g[key], e[key]), key
        torch.testing.assert_close(g["masks"], e["masks"], atol=1e-6, rtol=0)
    # nn.Module.compile wraps the call in torch.compile; an identity stands in for it here.
    monkeypatch.setattr(torch, "compile", lambda fn, *args, **kwargs: fn)
    auto.compile()
    auto.predict([FEW])
    assert auto_calls == [1]


# -- outputs equal the single graph -------------------------------------------------------------


@pytest.mark.parametrize("impl", ["torchvision", "tensor"])
def test_staged_equals_single_graph(tiny_cfg, tiny_weights, impl):
    few = _model(tiny_cfg, tiny_weights, impl, RAISED_THRESH)
    many = _model(tiny_cfg, tiny_weights, impl)
    with torch.no_grad():
        # Few detections, a batch of one, and a batch of two padded to three: 5 + 17 detections
        # packed into 3 x 8 slots, so MORE's detections also fill slots beside FEW's and the padding's.
        for images, batch_size, bucket in (([FEW], None, 8), ([FEW, MORE], 3, 24), ([MORE, FEW], 3, 24)):
            batch = to_image_batch(images, few.cfg, batch_size)
            detector = StagedDetector(few)
            got = detector(batch)
            assert list(detector.used) == [((320, 448), bucket)]
            assert not got.valid[len(images):].any()
            _assert_equal(got, few(batch), batch.valid)
        # Many detections: every slot valid, the last bucket (K), alone and packed.
        for images, bucket in (([MORE], 100), ([MORE, FEW], 200)):
            batch = to_image_batch(images, many.cfg)
            detector = StagedDetector(many)
            got = detector(batch)
            assert list(detector.used) == [((320, 448), bucket)] and bool(got.valid.all())
            _assert_equal(got, many(batch))


def test_predict_with_buckets_equals_predict_without(tiny_cfg, tiny_weights):
    staged = _model(tiny_cfg, tiny_weights, thresh=RAISED_THRESH)
    single = load_torchvision_weights(MaskRCNN(staged.cfg.replace(mask_detection_buckets=())).eval(), tiny_weights)
    got, expected = staged.predict([FEW, PORTRAIT]), single.predict([FEW, PORTRAIT])
    for g, e in zip(got, expected):
        assert 0 < len(e["scores"]) < 32
        for key in ("boxes", "scores", "labels"):
            assert torch.equal(g[key], e[key]), key
        torch.testing.assert_close(g["masks"], e["masks"], atol=1e-6, rtol=0)


# -- compiled: one graph per canvas and per (canvas, bucket) ------------------------------------


@pytest.mark.slow
def test_compiled_graphs_per_canvas_and_bucket(tiny_cfg, tiny_weights):
    model = _model(tiny_cfg, tiny_weights, thresh=RAISED_THRESH)
    batches = [to_image_batch([img], model.cfg) for img in (FEW, MORE, FEW, PORTRAIT, MORE)]
    torch._dynamo.reset()
    counters.clear()
    detector = StagedDetector.compiled(model, backend="aot_eager")
    with torch.no_grad():
        for batch in batches:
            _assert_equal(detector(batch), model(batch))
    landscape, portrait = (320, 448), (448, 320)
    assert detector.used == {(landscape, 8): 2, (landscape, 32): 2, (portrait, 32): 1}
    canvases = {canvas for canvas, _ in detector.used}
    # One box-stage graph per canvas, one mask-stage graph per (canvas, bucket); fullgraph=True
    # raises on any graph break, and the repeated (canvas, bucket) pairs compiled nothing new.
    # (The eager single-graph forward above runs outside dynamo.)
    assert counters["stats"]["unique_graphs"] == len(canvases) + len(detector.used), dict(counters["stats"])
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])


@pytest.mark.slow
def test_compiled_packed_batch_is_one_graph_per_canvas_and_width(tiny_cfg, tiny_weights):
    """A batch of two packs its detections into one row: the mask stage's graph takes the images
    each slot belongs to, compiles without a break, and is reused by a batch in the other order."""
    model = _model(tiny_cfg, tiny_weights, thresh=RAISED_THRESH)
    torch._dynamo.reset()
    counters.clear()
    detector = StagedDetector.compiled(model, backend="aot_eager")
    with torch.no_grad():
        for images in ([FEW, MORE], [MORE, FEW]):
            batch = to_image_batch(images, model.cfg)
            _assert_equal(detector(batch), model(batch))
    assert detector.used == {((320, 448), 32): 2}  # 22 detections, 2 x 16 slots
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])


@pytest.mark.slow
def test_warmup_builds_every_bucket_ahead(tiny_cfg, tiny_weights):
    model = _model(tiny_cfg, tiny_weights, thresh=RAISED_THRESH)
    torch._dynamo.reset()
    counters.clear()
    detector = StagedDetector.compiled(model, backend="aot_eager")
    landscape = (320, 448)
    detector.warmup(canvases=[landscape])
    built = counters["stats"]["unique_graphs"]
    # The box stage with and without the padding masks (told whether a batch fills its canvas).
    assert built == 2 + len(model.cfg.mask_buckets)
    with torch.no_grad():
        for img in (FEW, MORE):
            detector(to_image_batch([img], model.cfg))
    assert counters["stats"]["unique_graphs"] == built  # nothing compiled after the warm-up


def test_auto_in_eager_runs_the_mask_branch_on_the_detections_slots(tiny_cfg, tiny_weights):
    """Eager builds no graph per bucket: with "auto" every count is a bucket, so one image's mask
    branch runs on its detections' slots (FEW: 5) and a batch's on B x its count shared evenly
    (5 + 17 over 2 images: 2 x 11), with the single graph's outputs; compiled, "auto" keeps the
    powers of two."""
    model = _model(tiny_cfg, tiny_weights, thresh=RAISED_THRESH)
    auto = load_torchvision_weights(MaskRCNN(model.cfg.replace(mask_detection_buckets="auto")).eval(), tiny_weights)
    detector = StagedDetector(auto)
    assert detector.buckets == tuple(range(1, 101))
    with torch.no_grad():
        for images, n in (([FEW], 5), ([FEW, MORE], 22)):
            batch = to_image_batch(images, auto.cfg)
            got = detector(batch)
            _assert_equal(got, model(batch))
            assert detector.used.pop((canvas_of(batch), n)) == 1 and not detector.used
    assert StagedDetector(auto, wrap=lambda fn: fn).buckets == auto.cfg.mask_buckets == (8, 16, 32, 64, 100)


def test_blank_batch_takes_smallest_bucket(tiny_cfg, tiny_weights):
    model = _model(tiny_cfg, tiny_weights, thresh=0.999)
    batch = to_image_batch([FEW], model.cfg)
    detector = StagedDetector(model)
    with torch.no_grad():
        got = detector(batch)
        expected = model(batch)
    assert not expected.valid.any() and list(detector.used) == [((320, 448), 8)]
    _assert_equal(got, expected)


@pytest.mark.slow
@pytest.mark.xla
def test_xla_compiles_per_canvas_and_bucket_without_fallback(tiny_cfg, tiny_weights):
    pytest.importorskip("torch_xla", reason="torch_xla is not installed")
    import torch_xla  # optional dependency: skipped above when absent
    import torch_xla.debug.metrics as met

    device = torch_xla.device()
    model = _model(tiny_cfg, tiny_weights, "tensor", RAISED_THRESH)
    images = (FEW, MORE, FEW)
    with torch.no_grad():
        cpu_counts = [int(model(to_image_batch([img], model.cfg)).valid.sum()) for img in images]
    detector = StagedDetector(model.to(device))
    met.clear_all()
    compiles, counts = [], []
    with torch.no_grad():
        for img in images:
            batch = ImageBatch(*(t.to(device) for t in to_image_batch([img], model.cfg)))
            det = Detections(*(t.cpu() for t in detector(batch)))
            compiles.append(met.counter_value("UncachedCompile") or 0)
            counts.append(int(det.valid.sum()))
    assert counts == cpu_counts
    # The box stage with the count (one graph), then the mask stage on bucket 8 and on bucket 32;
    # the box stage's outputs stay on the device between them, and the repeat compiles nothing.
    assert compiles == [2, 3, 3], compiles
    assert detector.used == {((320, 448), 8): 2, ((320, 448), 32): 1}
    assert met.executed_fallback_ops() == [], met.executed_fallback_ops()


def test_warm_ahead_runs_every_bucket_of_a_canvas_at_its_first_batch(tiny_cfg, tiny_weights):
    """The compiled and XLA rows' mode: the graphs built never depend on the images' object counts."""
    model = _model(tiny_cfg, tiny_weights, thresh=RAISED_THRESH)
    slots: list[int] = []

    def wrap(fn):
        def call(*args):
            if fn.__name__ == "mask_stage":
                slots.append(args[1].valid.shape[1])
            return fn(*args)

        return call

    staged = StagedDetector(model, wrap, warm_ahead=True)
    batch = to_image_batch([FEW], model.cfg)
    with torch.no_grad():
        expected = model(batch)
        _assert_equal(staged(batch), expected)
        assert slots[:-1] == list(model.cfg.mask_buckets) and slots[-1] == 8  # every bucket, then FEW's
        slots.clear()
        _assert_equal(staged(batch), expected)
        assert slots == [8], "a canvas already seen runs its own bucket only"
        # A batch of two: every bucket's 2 x s packed slots, then 5 + 17 detections in 2 x 16.
        slots.clear()
        batch = to_image_batch([FEW, MORE], model.cfg)
        _assert_equal(StagedDetector(model, wrap, warm_ahead=True)(batch), model(batch))
    assert slots == [2 * s for s in model.cfg.mask_buckets] + [32], slots
