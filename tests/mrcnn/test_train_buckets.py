"""Mask-RoI buckets in training (``Config.mask_train_buckets``): torchvision's loss on fewer slots.

The mask branch trains on the batch's sampled positives packed into the smallest bucket of slots
that holds them. The mask loss is a mean over the positives, so the losses and gradients must
equal the single graph's (all Q slots of every image), the bucket and packing must follow the
documented rule, and the compiled stages must build one graph per canvas plus one per (canvas,
bucket), whatever the ground truth holds.
Parity with torchvision's own training forward, buckets on, is in tests/mrcnn/test_training_parity.py.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from mrcnn.config import get_config
from mrcnn.model import MaskRCNN
from mrcnn.staged import StagedTrainer, mask_bucket, pack_positives, packs_mask_training
from mrcnn.transform import to_image_batch
from mrcnn.weights import textured_images
from tests.helpers.training import LOSS_NAMES, SMALL_SIZES, random_targets, small_cfg

BUCKETS = (2, 4)  # small_cfg's positive quota, 32 * 0.25 = 8, is appended
# Ground-truth counts per image over the steps: no positives at all, few, many.
STEPS = ([0, 0], [1, 0], [4, 3], [2, 1])


def _losses_and_mask_rois(cfg, weights, counts, seed):
    """One training forward and backward -> (losses, head gradients, RoIs per image the mask head saw)."""
    model = MaskRCNN(cfg).train()
    model.load_state_dict(weights)
    seen = []
    model.roi_heads.mask_head.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[0]))
    batch = to_image_batch(textured_images(SMALL_SIZES, seed=2), cfg)
    torch.manual_seed(seed)  # the same sampling keys in both runs
    losses = model(batch, random_targets(cfg, batch, counts, seed=seed))
    sum(losses.values()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in losses.items()}, grads, seen[0] // len(SMALL_SIZES)


def test_config_train_buckets_rule_and_errors(tiny_cfg):
    cfg = get_config("tiny", mask_train_buckets=())
    assert cfg.mask_positive_quota == 32 and cfg.mask_train_slots == (32,)
    assert cfg.replace(mask_train_buckets=(8, 16)).mask_train_slots == (8, 16, 32)
    assert cfg.replace(mask_train_buckets=(8, 32)).mask_train_slots == (8, 32)
    assert get_config("tiny", mask_train_buckets=[4, 8]).mask_train_buckets == (4, 8)
    for buckets, message in (
        ((8, 64), r"must not exceed the positive quota \(32\)"),
        ((16, 8), "strictly increasing"),
        ((0, 8), "must be positive"),
        ((2.5,), "tuple of ints"),
    ):
        with pytest.raises(ValueError, match=message):
            cfg.replace(mask_train_buckets=buckets)
    with pytest.raises(ValueError, match="set one"):
        cfg.replace(mask_train_buckets=(8,), mask_rois_per_image=8)
    assert cfg.replace(mask_train_buckets="auto", mask_rois_per_image=8).mask_rois_per_image == 8  # auto steps aside
    assert mask_bucket((2, 4, 8), 0) == 2 and mask_bucket((2, 4, 8), 3) == 4 and mask_bucket((2, 4, 8), 8) == 8


def test_auto_packs_the_eager_cpu_forward_only():
    """``mask_train_buckets="auto"`` (the default): powers of two below the quota, in the eager
    forward on the CPU (where it was measured faster); all Q slots on other devices, with
    ``mask_rois_per_image``, and for explicitly empty buckets. Set buckets pack on any device."""
    cfg = get_config("tiny")
    assert cfg.mask_train_buckets == "auto" and cfg.mask_train_slots == (8, 16, 32)
    assert get_config("coco_r50_fpn").mask_train_slots == (8, 16, 32, 64, 128)
    cpu, cuda, xla = torch.device("cpu"), torch.device("cuda"), torch.device("xla")
    assert packs_mask_training(cfg, cpu)
    assert not packs_mask_training(cfg, cuda) and not packs_mask_training(cfg, xla)
    assert not packs_mask_training(cfg.replace(mask_rois_per_image=8), cpu)  # it subsamples the slots instead
    assert not packs_mask_training(cfg.replace(mask_train_buckets=()), cpu)
    assert packs_mask_training(cfg.replace(mask_train_buckets=(8,)), cuda)


def test_the_default_eager_step_trains_the_mask_branch_on_a_bucket(tiny_cfg):
    """The default config's eager CPU step: the quota's losses and gradients on the smallest bucket."""
    base = small_cfg(tiny_cfg, box_batch_size_per_image=64, mask_train_buckets=())  # Q = 16
    default = base.replace(mask_train_buckets="auto")
    assert default.mask_train_slots == (8, 16)
    torch.manual_seed(0)
    weights = MaskRCNN(base).state_dict()
    # One object in the first image: at most Q = 16 positives in the batch, 8 per image shared.
    ref, ref_grads, quota = _losses_and_mask_rois(base, weights, [1, 0], seed=1)
    got, grads, n = _losses_and_mask_rois(default, weights, [1, 0], seed=1)
    assert (quota, n) == (16, 8)
    for name in LOSS_NAMES:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-7, msg=name)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-4, atol=1e-6 * float(ref_grads[name].abs().max()))


def test_eager_buckets_give_the_quotas_losses_and_gradients_on_fewer_rois(tiny_cfg):
    base = small_cfg(tiny_cfg, mask_train_buckets=())  # all Q slots of every image, unpacked
    torch.manual_seed(0)
    weights = MaskRCNN(base).state_dict()
    bucketed = base.replace(mask_train_buckets=BUCKETS)
    seen_sizes = set()
    for step, counts in enumerate(STEPS):
        ref, ref_grads, quota = _losses_and_mask_rois(base, weights, counts, seed=step)
        got, grads, n = _losses_and_mask_rois(bucketed, weights, counts, seed=step)
        assert quota == base.mask_positive_quota
        assert n in bucketed.mask_train_slots
        seen_sizes.add(n)
        assert set(got) == LOSS_NAMES
        for name in LOSS_NAMES:
            # The mask head's convolutions see a shorter batch: float summation order may differ.
            torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-7, msg=name)
        assert set(grads) == set(ref_grads)
        for name, g in grads.items():
            torch.testing.assert_close(g, ref_grads[name], rtol=1e-4, atol=1e-6 * float(ref_grads[name].abs().max()))
        if sum(counts) == 0:
            assert n == BUCKETS[0] and float(got["loss_mask"]) == 0
    # The steps exercise more than one bucket, and the smallest is below the quota.
    assert len(seen_sizes) > 1 and min(seen_sizes) < base.mask_positive_quota


def test_buckets_pack_the_positives_of_the_batch(tiny_cfg):
    """The batch's sampled positives, image by image, fill the first of n = B * s packed slots, s
    the smallest bucket that holds them shared evenly, and each packed slot names its image."""
    cfg = small_cfg(tiny_cfg, mask_train_buckets=BUCKETS)
    torch.manual_seed(0)
    model = MaskRCNN(cfg).train()
    batch = to_image_batch(textured_images(SMALL_SIZES, seed=2), cfg)
    b = len(SMALL_SIZES)
    for step, counts in enumerate(STEPS):
        torch.manual_seed(step)
        _, _, rois, _ = model.box_training_stage(batch, random_targets(cfg, batch, counts, seed=step))
        trainer = StagedTrainer(model)
        torch.manual_seed(step)
        trainer(batch, random_targets(cfg, batch, counts, seed=step))
        ((_, n),) = trainer.used
        total = int(rois.positive.sum())
        assert n == b * mask_bucket(cfg.mask_train_slots, -(-total // b)) and n >= total
        packed, images = pack_positives(rois, n)
        assert packed.boxes.shape == (1, n, 4) and images.shape == (1, n)
        assert int(packed.positive[0, :total].sum()) == total and not packed.positive[0, total:].any()
        for i in range(b):  # image i's positives, in the sampler's order, each with its image
            mine = images[0, :total] == i
            torch.testing.assert_close(packed.boxes[0, :total][mine], rois.boxes[i][rois.positive[i]])
            assert torch.equal(packed.gt_index[0, :total][mine], rois.gt_index[i][rois.positive[i]])


@pytest.mark.slow
def test_compiled_stages_build_one_graph_per_canvas_and_bucket(tiny_cfg):
    """fullgraph stages over varying ground truth: 1 box-stage graph + one per bucket, no breaks,
    losses equal to the eager single graph's."""
    cfg = small_cfg(tiny_cfg, mask_train_buckets=BUCKETS)
    torch.manual_seed(0)
    model = MaskRCNN(cfg).train()
    reference = MaskRCNN(cfg.replace(mask_train_buckets=())).train()
    reference.load_state_dict(model.state_dict())
    batch = to_image_batch(textured_images(SMALL_SIZES, seed=0), cfg)
    torch._dynamo.reset()
    counters.clear()
    trainer = StagedTrainer.compiled(model, warm_ahead=True, backend="aot_eager")
    for step, counts in enumerate(STEPS):
        targets = random_targets(cfg, batch, counts, seed=step)
        torch.manual_seed(step)
        losses = trainer(batch, targets)
        sum(losses.values()).backward()
        torch.manual_seed(step)
        with torch.no_grad():
            expected = reference(batch, targets)
        for name in LOSS_NAMES:
            torch.testing.assert_close(losses[name].detach(), expected[name], rtol=1e-5, atol=1e-7, msg=name)
    graphs = len(cfg.canvases) * (1 + len(cfg.mask_train_slots))
    assert counters["stats"]["unique_graphs"] == graphs, dict(counters["stats"])
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert len(trainer.used) >= 2, trainer.used  # the steps used more than one bucket


def test_run_counts_flops_per_config_override(monkeypatch):
    """A row whose case overrides the config (mask buckets) does other work than the same case
    without: its FLOPs are counted on its own, not taken from that row."""
    from mrcnn_bench.running import row_extras
    from mrcnn_bench.running.cases import CASES, Row
    from mrcnn_bench.running.records import RowResult

    counted = []

    def fake_flops(row, ctx):
        counted.append(row.case.name)
        return 100.0 if row.case.overrides else 300.0

    monkeypatch.setattr(row_extras, "case_flops", fake_flops)
    results = [RowResult(Row(CASES[name]), status="ok") for name in (
        "static/train", "static/train+buckets", "static/inductor-train", "static/inductor-train+buckets")]
    row_extras.count_row_flops(results, ctx=None, log=print)
    assert [r.flops for r in results] == [300.0, 100.0, 300.0, 100.0]
    assert counted == ["static/train", "static/train+buckets"]  # once per (impl, phase, overrides)
