"""mrcnn.ops against torchvision: fixed-size NMS and multi-level RoIAlign, in both impls.

Each op is checked for equality with torchvision's dynamic reference, then for the static-shape
properties the model relies on: opcheck of the custom ops (the composite ``mrcnn::nms_fixed`` and
``mrcnn::multilevel_roi_align``, and the torchvision-kernel ``*_tv`` ones), tracing under
FakeTensorMode, torch.export and fullgraph torch.compile without recompilation, and XLA without CPU
fallbacks or recompilation.
"""

import multiprocessing
import os
import threading
from collections import OrderedDict

import pytest
import torch
import torchvision
from torch._dynamo.utils import counters
from torchvision.ops.poolers import initLevelMapper

import mrcnn.ops.roi_align as roi_align_module
from mrcnn import export
from mrcnn.ops import multilevel_roi_align, nms_fixed, parallel, resolve_impl
from mrcnn.ops._library import COMPOSITE_OPS
from mrcnn.ops.nms import _nms_fixed_tensor, nms_convergence_steps
from mrcnn.ops.roi_align import _roi_align_tensor, infer_scales

# The XLA runtime is started here, at collection, not inside the XLA test: the autograd engine
# sizes its per-device queues at the first backward of the process, so an XLA backward after any
# CPU backward that ran before the XLA device existed fails an internal assert in engine.cpp.
os.environ.setdefault("PJRT_DEVICE", "CPU")
try:
    import torch_xla
    import torch_xla.debug.metrics as xla_metrics

    torch_xla.device()
except ImportError as _e:  # pragma: no cover - depends on the environment
    torch_xla = xla_metrics = None
    XLA_MISSING = f"torch_xla is not importable: {_e}"

IMPLS = ["tensor", "torchvision"]


# ------------------------------------------------------------------------------------------------
# Data


def clustered_boxes(gen: torch.Generator, g: int, n: int, clusters: int, size=(480.0, 640.0)):
    """[G, N, 4] boxes jittered around a few objects, so NMS really suppresses; scores [G, N].

    Coordinates are multiples of 1/8 px: torchvision's batched_nms shifts each group by a large
    offset below 1000 boxes (the "coordinate trick"), and on such a grid the shift is exact, so
    its IoUs are bit-identical to the unshifted ones and the comparison cannot flip on rounding.
    Scores are distinct: batched_nms orders equal scores arbitrarily (its final sort is unstable).
    """
    h, w = size
    centre = torch.rand(g, clusters, 2, generator=gen) * torch.tensor([w, h])
    extent = torch.rand(g, clusters, 2, generator=gen) * 150 + 20
    pick = torch.randint(0, clusters, (g, n), generator=gen)[..., None].expand(g, n, 2)
    c, e = centre.gather(1, pick), extent.gather(1, pick)
    c = c + torch.randn(g, n, 2, generator=gen) * e * 0.12
    e = e * torch.exp(torch.randn(g, n, 2, generator=gen) * 0.15)
    boxes = torch.round(torch.cat([c - e / 2, c + e / 2], dim=-1) * 8) / 8
    scores = torch.stack([torch.randperm(n, generator=gen) for _ in range(g)]).float() / n + 0.01
    return boxes, scores


def reference_nms(boxes, scores, valid, groups, iou_threshold, max_out) -> list[torch.Tensor]:
    """Per problem, batched_nms on the valid subset, as indices into N."""
    out = []
    for g in range(boxes.shape[0]):
        idx = valid[g].nonzero().squeeze(1)
        grp = groups[g, idx] if groups is not None else torch.zeros_like(idx)
        out.append(idx[torchvision.ops.batched_nms(boxes[g, idx], scores[g, idx], grp, iou_threshold)][:max_out])
    return out


def pyramid(gen: torch.Generator, b: int, c: int, h0: int, w0: int, levels: int = 4, dtype=torch.float32):
    """FPN-like features: level l is ceil(h0 / 2**l) x ceil(w0 / 2**l), as strided convs give."""
    return [torch.randn(b, c, -(-h0 // 2**i), -(-w0 // 2**i), generator=gen, dtype=dtype) for i in range(levels)]


def roi_boxes(gen: torch.Generator, b: int, image_hw: tuple[int, int]) -> torch.Tensor:
    """[B, R, 4] boxes over all FPN levels plus the corner cases the kernel has rules for."""
    h, w = image_hw
    special = torch.tensor(
        [
            [10.0, 10.0, 10.0, 30.0],  # zero width
            [20.0, 20.0, 20.0, 20.0],  # a point: zero area, level k_min
            [40.0, 10.0, 30.0, 30.0],  # x2 < x1: NaN level in torchvision, pools to zero
            [-30.0, -20.0, w + 25.0, h + 40.0],  # over every border
            [w - 16.0, h - 12.0, float(w), float(h)],  # touching the bottom-right border
            [0.0, 0.0, 8.0, 8.0],  # touching the top-left border
            [w + 10.0, 5.0, w + 90.0, 60.0],  # entirely right of the image: samples beyond W
            [-90.0, -70.0, -6.0, -5.0],  # entirely above-left: samples below -1
            [4.0, 4.0, 4.5, 4.25],  # sub-pixel
            [-200.0, -150.0, 500.0, 450.0],  # huge: level 5
            [8.0, 12.0, 160.0, 172.0],  # ~150 px: level 3
            [-40.0, -30.0, 280.0, 260.0],  # ~300 px: level 4
            # Level 2 (scale 1/4), 112 px tall: at output size 7 the bins are 4 feature rows and
            # a sample lands exactly on y = -1, resp. y = H_0, where the kernel's bounds are
            # inclusive (the sample is clamped onto the map, not dropped).
            [10.0, -8.0, 60.0, 104.0],
            [10.0, h - 100.0, 60.0, h + 12.0],
        ]
    )
    n_random = 20
    centre = torch.rand(b, n_random, 2, generator=gen) * torch.tensor([w, h])
    # Log-uniform sizes from 1 to 700 px cover levels 2..5 (canonical 224 px -> level 4).
    extent = torch.exp(torch.rand(b, n_random, 2, generator=gen) * torch.log(torch.tensor(700.0)))
    random = torch.cat([centre - extent / 2, centre + extent / 2], dim=-1)
    return torch.cat([special.expand(b, -1, -1), random], dim=1)


def reference_roi_align(features, boxes, output_size, sampling_ratio=2):
    """torchvision.ops.MultiScaleRoIAlign with image size (4 H_0, 4 W_0), as [B, R, C, S, S]."""
    names = [f"p{i}" for i in range(len(features))]
    pooler = torchvision.ops.MultiScaleRoIAlign(names, output_size, sampling_ratio)
    h0, w0 = features[0].shape[-2:]
    image_sizes = [(4 * h0, 4 * w0)] * boxes.shape[0]
    out = pooler(OrderedDict(zip(names, features)), list(boxes), image_sizes)
    return out.view(*boxes.shape[:2], *out.shape[1:])


# The tensor RoIAlign has two gather strategies (embedding_bag on CPU/CUDA, per-tap gathers on
# XLA); tests run both on the CPU by swapping the device dispatch for one of them, plus the
# torchvision impl.
ROI_VARIANTS = [
    ("tensor", roi_align_module._weighted_rows_bag),
    ("tensor", roi_align_module._weighted_rows_taps),
    ("torchvision", None),
]


@pytest.fixture(params=ROI_VARIANTS, ids=["tensor-embedding_bag", "tensor-taps", "torchvision"])
def roi_impl(request, monkeypatch) -> str:
    impl, strategy = request.param
    if strategy is not None:
        monkeypatch.setattr(roi_align_module, "_weighted_rows", strategy)
    return impl


# ------------------------------------------------------------------------------------------------
# resolve_impl


def test_resolve_impl():
    assert resolve_impl("auto", torch.device("cpu")) == "torchvision"
    assert resolve_impl("auto", torch.device("cuda")) == "torchvision"
    assert resolve_impl("auto", torch.device("xla")) == "tensor"
    assert resolve_impl("auto", torch.device("meta")) == "tensor"
    assert resolve_impl("tensor", torch.device("cpu")) == "tensor"
    assert resolve_impl("torchvision", torch.device("xla")) == "torchvision"
    with pytest.raises(ValueError):
        resolve_impl("cuda", torch.device("cpu"))
    with pytest.raises(ValueError):
        nms_fixed(torch.zeros(1, 2, 4), torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), 0.5, 2, impl="x")


# ------------------------------------------------------------------------------------------------
# NMS


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("iou_threshold", [0.5, 0.7])
@pytest.mark.parametrize("use_groups", [False, True])
@pytest.mark.parametrize("max_out", [25, 700])
def test_nms_matches_batched_nms(impl, iou_threshold, use_groups, max_out):
    gen = torch.Generator().manual_seed(1000 + int(iou_threshold * 10) + 2 * use_groups)
    g, n = 3, 600
    boxes, scores = clustered_boxes(gen, g, n, clusters=12)
    valid = torch.rand(g, n, generator=gen) > 0.15
    groups = torch.randint(0, 3, (g, n), generator=gen) if use_groups else None

    keep, keep_valid = nms_fixed(boxes, scores, valid, iou_threshold, max_out, groups=groups, impl=impl)

    assert keep.shape == (g, max_out) and keep.dtype == torch.int64
    assert keep_valid.shape == (g, max_out) and keep_valid.dtype == torch.bool
    survivors = reference_nms(boxes, scores, valid, groups, iou_threshold, n)
    for i, all_kept in enumerate(survivors):
        # NMS must have had real work to do, or equality would prove little.
        assert len(all_kept) < 0.6 * valid[i].sum()
        r = all_kept[:max_out]
        k = len(r)
        assert int(keep_valid[i].sum()) == k
        assert torch.equal(keep[i, :k], r)
        assert keep_valid[i, :k].all() and not keep_valid[i, k:].any()
        assert (keep[i, k:] == 0).all()
    if max_out == 25:
        assert keep_valid.all()  # truncation case: more survivors than slots
    else:
        assert not keep_valid[:, -1].any()  # padding case: more slots than candidates


@pytest.mark.parametrize("impl", IMPLS)
def test_nms_all_invalid(impl):
    gen = torch.Generator().manual_seed(0)
    boxes, scores = clustered_boxes(gen, 2, 50, clusters=3)
    valid = torch.zeros(2, 50, dtype=torch.bool)
    keep, keep_valid = nms_fixed(boxes, scores, valid, 0.5, 10, impl=impl)
    assert keep.shape == (2, 10) and not keep_valid.any() and (keep == 0).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_nms_invalid_never_suppresses(impl):
    # The top-scoring box is invalid: its overlapping neighbour must survive.
    boxes = torch.tensor([[[0.0, 0.0, 10.0, 10.0], [0.5, 0.0, 10.5, 10.0], [50.0, 50.0, 60.0, 60.0]]])
    scores = torch.tensor([[0.9, 0.8, 0.7]])
    valid = torch.tensor([[False, True, True]])
    keep, keep_valid = nms_fixed(boxes, scores, valid, 0.5, 4, impl=impl)
    assert keep.tolist() == [[1, 2, 0, 0]] and keep_valid.tolist() == [[True, True, False, False]]


@pytest.mark.parametrize("impl", IMPLS)
def test_nms_threshold_is_strict(impl):
    # IoU(0, 1) is exactly 0.5 (kept: suppression needs IoU > threshold); IoU(0, 2) = 0.525.
    boxes = torch.tensor([[[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 5.0], [0.0, 0.0, 10.0, 5.25]]])
    scores = torch.tensor([[0.9, 0.8, 0.7]])
    valid = torch.ones(1, 3, dtype=torch.bool)
    keep, keep_valid = nms_fixed(boxes, scores, valid, 0.5, 3, impl=impl)
    assert keep[keep_valid].tolist() == [0, 1] == reference_nms(boxes, scores, valid, None, 0.5, 3)[0].tolist()


def test_nms_iterations_bound_a_suppression_chain():
    # A sliding row of boxes: each overlaps its neighbour (IoU 0.6) but not the next one (0.33),
    # so greedy keeps every other box, and deciding box k needs the whole chain before it.
    n = 9
    x = torch.arange(n, dtype=torch.float32) * 2.5
    boxes = torch.stack([x, torch.zeros(n), x + 10, torch.full((n,), 10.0)], dim=-1)[None]
    scores = torch.linspace(1.0, 0.5, n)[None]
    valid = torch.ones(1, n, dtype=torch.bool)
    ref = reference_nms(boxes, scores, valid, None, 0.5, n)[0]
    assert ref.tolist() == list(range(0, n, 2))

    steps = int(nms_convergence_steps(boxes, scores, valid, 0.5)[0])
    assert steps == n - 1

    def kept(iterations):
        keep, keep_valid = nms_fixed(boxes, scores, valid, 0.5, n, iterations=iterations)
        return keep[0][keep_valid[0]]

    assert torch.equal(kept(steps), ref)
    assert not torch.equal(kept(steps - 1), ref)  # one step short of the chain is not greedy NMS


def test_nms_default_iterations_cover_rpn_like_inputs():
    # RPN-like: 2000 proposals on ~25 objects, IoU 0.7. Measured chains on 1000-4700 such boxes
    # needed 4 to 11 steps; the default of 16 must cover them with margin.
    gen = torch.Generator().manual_seed(7)
    boxes, scores = clustered_boxes(gen, 2, 2000, clusters=25, size=(800.0, 1067.0))
    valid = torch.ones(2, 2000, dtype=torch.bool)
    steps = nms_convergence_steps(boxes, scores, valid, 0.7)
    assert (steps >= 3).all() and (steps <= 12).all(), steps
    keep, keep_valid = nms_fixed(boxes, scores, valid, 0.7, 1000)
    for i, r in enumerate(reference_nms(boxes, scores, valid, None, 0.7, 1000)):
        assert torch.equal(keep[i, : len(r)], r) and int(keep_valid[i].sum()) == len(r)


def test_nms_opcheck():
    gen = torch.Generator().manual_seed(0)
    boxes, scores = clustered_boxes(gen, 2, 40, clusters=4)
    valid = torch.rand(2, 40, generator=gen) > 0.2
    groups = torch.randint(0, 3, (2, 40), generator=gen)
    # test_autograd_registration is vacuous here: the outputs are int64/bool, so no input is
    # passed with requires_grad and the op needs no autograd formula.
    result = torch.library.opcheck(torch.ops.mrcnn.nms_fixed_tv.default, (boxes, scores, valid, groups, 0.5, 16))
    assert all(v == "SUCCESS" for v in result.values()), result
    assert set(result) >= {"test_schema", "test_faketensor", "test_aot_dispatch_dynamic"}


# ------------------------------------------------------------------------------------------------
# RoIAlign


@pytest.mark.parametrize("output_size", [7, 14])
def test_roi_align_matches_multiscale_roi_align(roi_impl, output_size):
    gen = torch.Generator().manual_seed(output_size)
    # Odd sizes at the coarse levels (24x30 -> 12x15 -> 6x8 -> 3x4) exercise scale inference.
    features = pyramid(gen, 2, 8, 24, 30)
    boxes = roi_boxes(gen, 2, (96, 120))
    levels = initLevelMapper(2, 5)(list(boxes))
    # (the inverted box's NaN level casts to a garbage int64 matching no level: hence <=)
    assert {0, 1, 2, 3} <= set(levels.tolist()), "the boxes must span all four levels"

    out = multilevel_roi_align(features, boxes, output_size, sampling_ratio=2, impl=roi_impl)

    assert out.shape == (2, boxes.shape[1], 8, output_size, output_size)
    assert torch.isfinite(out).all()
    ref = reference_roi_align(features, boxes, output_size)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert (out[:, 2] == 0).all() and (out[:, 6] == 0).all()  # inverted box, box right of image


def test_roi_align_explicit_scales_and_three_levels():
    gen = torch.Generator().manual_seed(3)
    features = pyramid(gen, 1, 4, 20, 20, levels=3)
    boxes = roi_boxes(gen, 1, (80, 80))
    assert infer_scales(features) == [0.25, 0.125, 0.0625]
    ref = reference_roi_align(features, boxes, 5)
    for impl in IMPLS:
        out = multilevel_roi_align(features, boxes, 5, impl=impl, scales=[0.25, 0.125, 0.0625])
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_roi_align_gradient_matches_torchvision(roi_impl):
    gen = torch.Generator().manual_seed(11)
    features = pyramid(gen, 2, 3, 12, 16)
    boxes = roi_boxes(gen, 2, (48, 64))
    upstream = torch.randn(2, boxes.shape[1], 3, 7, 7, generator=gen)

    def grads(fn):
        leaves = [f.clone().requires_grad_() for f in features]
        (fn(leaves) * upstream).sum().backward()
        return [f.grad for f in leaves]

    ref = grads(lambda f: reference_roi_align(f, boxes, 7))
    assert any(r.abs().sum() > 0 for r in ref[1:])  # coarse levels receive gradient too
    got = grads(lambda f: multilevel_roi_align(f, boxes, 7, impl=roi_impl))
    for g_, r in zip(got, ref):
        torch.testing.assert_close(g_, r, atol=1e-5, rtol=1e-5)


def test_roi_align_gradcheck(roi_impl):
    gen = torch.Generator().manual_seed(5)
    features = [f.requires_grad_() for f in pyramid(gen, 1, 2, 8, 8, dtype=torch.float64)]
    boxes = torch.tensor([[[1.0, 2.0, 20.0, 25.0], [0.0, 0.0, 31.0, 31.0], [-5.0, 3.0, 150.0, 120.0]]])
    boxes = boxes.to(torch.float64)
    assert torch.autograd.gradcheck(
        lambda *f: multilevel_roi_align(list(f), boxes, 2, impl=roi_impl), tuple(features), fast_mode=True
    )


@pytest.mark.parametrize("chunks", [1, 3])
def test_roi_align_opcheck(chunks, monkeypatch):
    # chunks: RoIs per level in one kernel call, or split three ways on the threaded path.
    monkeypatch.setattr(parallel, "num_chunks", lambda device: chunks)
    gen = torch.Generator().manual_seed(0)
    features = [f.requires_grad_() for f in pyramid(gen, 2, 3, 16, 20)]
    boxes = roi_boxes(gen, 2, (64, 80))
    scales = infer_scales(features)
    # Inputs that require grad make test_autograd_registration and test_aot_dispatch_dynamic
    # exercise the registered backward (itself a custom op), with symbolic shapes.
    result = torch.library.opcheck(
        torch.ops.mrcnn.multilevel_roi_align_tv.default, (features, boxes, scales, 3, 2, 224, 4)
    )
    assert all(v == "SUCCESS" for v in result.values()), result

    # The backward op: double backward is not supported (no autograd formula of its own), so it
    # is checked without inputs that require grad, which makes test_autograd_registration vacuous.
    grad = torch.randn(2, boxes.shape[1], 3, 3, 3, generator=gen)
    heights, widths = [f.shape[2] for f in features], [f.shape[3] for f in features]
    result = torch.library.opcheck(
        torch.ops.mrcnn.multilevel_roi_align_tv_backward.default,
        (grad, boxes, scales, heights, widths, 2, 224, 4),
    )
    assert all(v == "SUCCESS" for v in result.values()), result


# The torchvision-kernel ops split each level's RoIs into chunks run on as many threads.


def _tv_roi_align_both_ways(monkeypatch, chunks: int, features, boxes, output_size: int, upstream):
    """(forward, feature gradients) of the tv op with one kernel call per level, then threaded."""
    results = []
    for n in (1, chunks):
        monkeypatch.setattr(parallel, "num_chunks", lambda device, n=n: n)
        leaves = [f.clone().requires_grad_() for f in features]
        out = multilevel_roi_align(leaves, boxes, output_size, impl="torchvision")
        (out * upstream).sum().backward()
        results.append((out.detach(), [f.grad for f in leaves]))
    return results


@pytest.mark.parametrize("chunks", [2, 3])
@pytest.mark.parametrize("output_size", [7, 14])
def test_roi_align_threaded_equals_one_call_per_level(monkeypatch, chunks, output_size):
    gen = torch.Generator().manual_seed(21 + chunks)
    features = pyramid(gen, 2, 5, 24, 30)
    boxes = roi_boxes(gen, 2, (96, 120))
    upstream = torch.randn(2, boxes.shape[1], 5, output_size, output_size, generator=gen)
    (out_1, grads_1), (out_n, grads_n) = _tv_roi_align_both_ways(
        monkeypatch, chunks, features, boxes, output_size, upstream
    )
    # Forward: the same kernel pools each RoI whichever chunk holds it.
    assert torch.equal(out_n, out_1)
    # Backward: each chunk scatters into its own level map and the maps are summed, so only the
    # order of the float additions differs.
    for g_n, g_1 in zip(grads_n, grads_1):
        assert g_1.abs().sum() > 0  # every level pools some RoIs
        torch.testing.assert_close(g_n, g_1, atol=1e-5, rtol=1e-5)


def test_roi_align_threaded_by_default_follows_num_threads(monkeypatch):
    monkeypatch.setattr(parallel, "THREADED", True)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert parallel.num_chunks(torch.device("cpu")) == 3
        assert parallel.num_chunks(torch.device("meta")) == 1  # CPU kernels only
        monkeypatch.setattr(parallel, "THREADED", False)
        assert parallel.num_chunks(torch.device("cpu")) == 1
    finally:
        torch.set_num_threads(threads)


def test_roi_align_chunks_are_dealt_evenly():
    members = [torch.arange(0, 7), torch.arange(7, 8), torch.arange(8, 8), torch.arange(8, 13)]
    groups = parallel.deal(members, 2)
    assert len(groups) == 2
    dealt = sorted(torch.cat([idx for g in groups for _, idx in g]).tolist())
    assert dealt == list(range(13))  # every RoI exactly once; the empty level yields no task
    assert [sum(idx.numel() for _, idx in g) for g in groups] == [7, 6]  # odd RoIs go to the lighter
    assert all(set(idx.tolist()) <= set(members[level].tolist()) for g in groups for level, idx in g)
    assert len(parallel.deal(members, 1)) == 1


def test_roi_align_groups_run_concurrently():
    # Three groups, each blocked until all three are inside fn: only concurrent threads get past
    # the barrier (a sequential run would time out with BrokenBarrierError).
    barrier = threading.Barrier(3, timeout=30)
    seen = []

    def fn(level, idx):
        seen.append(threading.get_ident())
        barrier.wait()
        return idx * 2

    groups = [[(0, torch.tensor([i]))] for i in range(3)]
    results = parallel.run_groups(fn, groups)
    assert [r[0].item() for r in results] == [0, 2, 4]
    assert len(set(seen)) == 3 and threading.get_ident() in seen  # group 0 runs on the caller


def test_roi_align_threaded_in_inference_mode_and_no_grad(monkeypatch):
    monkeypatch.setattr(parallel, "num_chunks", lambda device: 2)
    features, boxes = _roi_sample(seed=4, requires_grad=True)
    ref = reference_roi_align([f.detach() for f in features], boxes, 7)
    for mode in (torch.inference_mode, torch.no_grad):
        with mode():
            out = multilevel_roi_align(features, boxes, 7, impl="torchvision")
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        assert not out.requires_grad


def test_roi_align_threaded_in_forked_child(monkeypatch):
    # The pool belongs to the process that made it: a forked child (a DataLoader worker) must get
    # its own, or it would queue work on threads that do not exist there and wait forever.
    monkeypatch.setattr(parallel, "num_chunks", lambda device: 2)
    features, boxes = _roi_sample(seed=6)
    expected = multilevel_roi_align(features, boxes, 7, impl="torchvision")  # the parent's pool exists
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()

    def child():
        # As a DataLoader worker does: OpenMP's own threads do not survive a fork either.
        torch.set_num_threads(1)
        out = multilevel_roi_align(features, boxes, 7, impl="torchvision")
        queue.put(bool(torch.equal(out, expected)))

    proc = ctx.Process(target=child)
    proc.start()
    try:
        assert queue.get(timeout=60) is True
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0


# ------------------------------------------------------------------------------------------------
# The pure-tensor forms as operators: mrcnn::nms_fixed and mrcnn::multilevel_roi_align

NMS_OP = torch.ops.mrcnn.nms_fixed.default
ROI_OP = torch.ops.mrcnn.multilevel_roi_align.default


def _nms_sample(seed: int = 0, g: int = 2, n: int = 40):
    gen = torch.Generator().manual_seed(seed)
    boxes, scores = clustered_boxes(gen, g, n, clusters=4)
    valid = torch.rand(g, n, generator=gen) > 0.2
    groups = torch.randint(0, 3, (g, n), generator=gen)
    return boxes, scores, valid, groups


def _roi_sample(seed: int = 0, requires_grad: bool = False):
    gen = torch.Generator().manual_seed(seed)
    features = [f.requires_grad_(requires_grad) for f in pyramid(gen, 2, 3, 16, 20)]
    return features, roi_boxes(gen, 2, (64, 80))


def test_composite_ops_are_registered_as_composite_only():
    assert dict(COMPOSITE_OPS) == {NMS_OP: _nms_fixed_tensor, ROI_OP: _roi_align_tensor}
    for op in COMPOSITE_OPS:
        name = op.name()
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd"), name
        # No kernel of their own for a backend, autograd or fake tensors: everything goes through the
        # decomposition, which is what lets XLA, AOTAutograd and export see aten ops only.
        for key in ("CPU", "CUDA", "XLA", "Meta", "Autograd", "CompositeExplicitAutograd"):
            assert not torch._C._dispatch_has_kernel_for_dispatch_key(name, key), (name, key)
        assert torch.Tag.pt2_compliant_tag in op.tags
        assert not export.has_cpp_cpu_kernel(name), "a Python-registered kernel must not count as C++"
    assert str(NMS_OP._schema) == (
        "mrcnn::nms_fixed(Tensor boxes, Tensor scores, Tensor valid, Tensor? groups, float iou_threshold, "
        "int max_out, int iterations) -> (Tensor keep, Tensor keep_valid)"
    )
    assert str(ROI_OP._schema) == (
        "mrcnn::multilevel_roi_align(Tensor[] features, Tensor boxes, float[] scales, int output_size, "
        "int sampling_ratio, int canonical_scale, int canonical_level) -> Tensor"
    )


@pytest.mark.parametrize("use_groups", [False, True])
def test_nms_op_equals_tensor_function(use_groups):
    boxes, scores, valid, groups = _nms_sample(4, g=3, n=300)
    groups = groups if use_groups else None
    # Keyword call of the plain function: a schema whose arguments are bound in another order
    # (threshold, max_out and iterations are all numbers) would not give the same result.
    want = _nms_fixed_tensor(
        boxes=boxes, scores=scores, valid=valid, groups=groups, iou_threshold=0.6, max_out=60, iterations=16
    )
    got = torch.ops.mrcnn.nms_fixed(boxes, scores, valid, groups, 0.6, 60, 16)
    assert want[1].sum() > 90 and not want[1].all()  # real suppression, and padded slots (33 to 73 survive)
    for g_, w in zip(got, want):
        assert g_.dtype == w.dtype and torch.equal(g_, w)
    # ... and the public function, which now goes through the op, still equals torchvision.
    keep, keep_valid = nms_fixed(boxes, scores, valid, 0.6, 60, groups=groups, impl="tensor")
    for i, r in enumerate(reference_nms(boxes, scores, valid, groups, 0.6, 60)):
        assert torch.equal(keep[i, : len(r)], r) and int(keep_valid[i].sum()) == len(r)


def test_roi_align_op_equals_tensor_function():
    features, boxes = _roi_sample(6, requires_grad=True)
    scales = infer_scales(features)
    upstream = torch.randn(2, boxes.shape[1], 3, 5, 5, generator=torch.Generator().manual_seed(1))

    def run(fn):
        out = fn()
        grads = torch.autograd.grad((out * upstream).sum(), features)
        return out.detach(), grads

    want, want_grads = run(lambda: _roi_align_tensor(
        features=features, boxes=boxes, scales=scales, output_size=5, sampling_ratio=2, canonical_scale=224,
        canonical_level=4,
    ))
    # Nothing registered on autograd keys: the gradient comes from the decomposition, as before.
    got, got_grads = run(lambda: torch.ops.mrcnn.multilevel_roi_align(features, boxes, scales, 5, 2, 224, 4))
    assert torch.equal(got, want)
    for g_, w in zip(got_grads, want_grads):
        assert torch.equal(g_, w)
    assert all(w.abs().sum() > 0 for w in want_grads)  # every level pooled something


def test_composite_ops_opcheck():
    # Real content: clustered boxes that suppress each other, with invalid candidates and groups.
    boxes, scores, valid, groups = _nms_sample()
    assert not nms_fixed(boxes, scores, valid, 0.5, 40)[1].all()
    for g in (groups, None):
        result = torch.library.opcheck(NMS_OP, (boxes, scores, valid, g, 0.5, 16, 16))
        assert all(v == "SUCCESS" for v in result.values()), result
        assert set(result) >= {"test_schema", "test_faketensor", "test_aot_dispatch_dynamic"}

    # Features that require grad: test_autograd_registration and test_aot_dispatch_dynamic then
    # check the backward too (through the decomposition, with symbolic shapes).
    features, rois = _roi_sample(requires_grad=True)
    result = torch.library.opcheck(ROI_OP, (features, rois, infer_scales(features), 3, 2, 224, 4))
    assert all(v == "SUCCESS" for v in result.values()), result
    assert set(result) >= {"test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"}


def test_composite_ops_trace_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    boxes, scores, valid, groups = _nms_sample()
    features, rois = _roi_sample()
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in (boxes, scores, valid, groups, rois, *features)]
        keep, keep_valid = nms_fixed(*fake[:3], 0.5, 25, groups=fake[3], impl="tensor")
        pooled = multilevel_roi_align(fake[5:], fake[4], 7, impl="tensor")
    assert keep.shape == (2, 25) and keep.dtype == torch.int64
    assert keep_valid.shape == (2, 25) and keep_valid.dtype == torch.bool
    assert pooled.shape == (2, rois.shape[1], 3, 7, 7) and pooled.dtype == torch.float32


class _BothOps(torch.nn.Module):
    def forward(self, boxes, scores, valid, groups, rois, *features):
        keep, keep_valid = nms_fixed(boxes, scores, valid, 0.5, 25, groups=groups, impl="tensor")
        return keep, keep_valid, multilevel_roi_align(list(features), rois, 7, impl="tensor")


def test_export_keeps_composite_ops_until_decomposed():
    boxes, scores, valid, groups = _nms_sample()
    features, rois = _roi_sample()
    args = (boxes, scores, valid, groups, rois, *features)
    ep = torch.export.export(_BothOps(), args)
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    # The op boundary is real: one node per op, not its hundred aten ops...
    assert targets.count(NMS_OP) == 1 and targets.count(ROI_OP) == 1
    assert torch.ops.aten.bmm.default not in targets
    # ... which a C++ process could not run, so check_exportable rejects them,
    with pytest.raises(RuntimeError, match=r"mrcnn::nms_fixed, not an aten op.*mrcnn::multilevel_roi_align"):
        export.check_exportable(ep)
    # and decompose_mrcnn_ops turns them into aten ops with C++ kernels, the same numbers.
    flat = export.decompose_mrcnn_ops(ep)
    export.check_exportable(flat)
    ops = {n.target for n in flat.graph.nodes if n.op == "call_function"}
    assert not ops & set(COMPOSITE_OPS) and torch.ops.aten.bmm.default in ops
    for g_, w in zip(flat.module()(*args), _BothOps()(*args)):
        assert torch.equal(g_, w)


def test_compile_sees_composite_ops_as_one_node():
    """Dynamo records each op as one call (the boundary), AOTAutograd then decomposes it."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    boxes, scores, valid, groups = _nms_sample()
    features, rois = _roi_sample()
    args = (boxes, scores, valid, groups, rois, *features)
    torch._dynamo.reset()
    out = torch.compile(_BothOps(), fullgraph=True, backend=backend)(*args)
    torch._dynamo.reset()
    (gm,) = graphs
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.mrcnn.nms_fixed) + targets.count(NMS_OP) == 1, targets
    assert targets.count(torch.ops.mrcnn.multilevel_roi_align) + targets.count(ROI_OP) == 1, targets
    for g_, w in zip(out, _BothOps()(*args)):
        assert torch.equal(g_, w)


# ------------------------------------------------------------------------------------------------
# torch.compile


def _compile_inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    boxes, scores = clustered_boxes(gen, 2, 120, clusters=6)
    valid = torch.rand(2, 120, generator=gen) > 0.1
    groups = torch.randint(0, 4, (2, 120), generator=gen)
    features = pyramid(gen, 2, 4, 16, 20)
    rois = roi_boxes(gen, 2, (64, 80))
    return boxes, scores, valid, groups, features, rois


def _both_ops_both_impls(boxes, scores, valid, groups, features, rois):
    out = []
    for impl in IMPLS:
        keep, keep_valid = nms_fixed(boxes, scores, valid, 0.6, 100, groups=groups, impl=impl)
        out += [keep, keep_valid, multilevel_roi_align(features, rois, 7, impl=impl)]
    return out


@pytest.mark.slow
def test_compile_fullgraph_no_recompile():
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(_both_ops_both_impls, fullgraph=True, backend="aot_eager")
    for seed in (1, 2):  # the second call has new data of the same shapes
        inputs = _compile_inputs(seed)
        with torch._dynamo.config.patch(error_on_recompile=seed > 1):
            got = compiled(*inputs)
        for g_, e in zip(got, _both_ops_both_impls(*inputs)):
            torch.testing.assert_close(g_, e, atol=1e-5, rtol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]
    torch._dynamo.reset()


@pytest.mark.slow
def test_compile_roi_align_backward():
    def loss(features, rois, impl):
        return multilevel_roi_align(features, rois, 7, impl=impl).square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    *_, features, rois = _compile_inputs(3)
    for impl in IMPLS:
        results = []
        for fn in (loss, compiled):
            leaves = [f.clone().requires_grad_() for f in features]
            fn(leaves, rois, impl).backward()
            results.append([f.grad for f in leaves])
        for g_, e in zip(*results):
            torch.testing.assert_close(g_, e, atol=1e-4, rtol=1e-5)
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------------------
# XLA


@pytest.mark.xla
@pytest.mark.slow
def test_xla_tensor_impls_no_fallback_no_recompile():
    if torch_xla is None:
        pytest.skip(XLA_MISSING)
    met = xla_metrics
    device = torch_xla.device()
    met.clear_all()

    def run(seed):
        boxes, scores, valid, groups, features, rois = _compile_inputs(seed)
        features = [f.requires_grad_() for f in features]
        xla_features = [f.detach().to(device).requires_grad_() for f in features]
        keep, keep_valid = nms_fixed(
            boxes.to(device), scores.to(device), valid.to(device), 0.6, 100, groups=groups.to(device)
        )
        pooled = multilevel_roi_align(xla_features, rois.to(device), 7)
        pooled.square().sum().backward()
        torch_xla.sync()
        got = [keep.cpu(), keep_valid.cpu(), pooled.cpu(), *[f.grad.cpu() for f in xla_features]]

        ref_keep, ref_valid = nms_fixed(boxes, scores, valid, 0.6, 100, groups=groups)
        ref_pooled = multilevel_roi_align(features, rois, 7)
        ref_pooled.square().sum().backward()
        ref = [ref_keep, ref_valid, ref_pooled, *[f.grad for f in features]]
        for g_, r in zip(got, ref):
            torch.testing.assert_close(g_, r, atol=1e-4, rtol=1e-5)
        assert ref_valid.any() and not ref_valid.all()

    run(1)
    compiles = met.counter_value("UncachedCompile")
    assert compiles, "nothing was compiled: the ops did not run on XLA"
    assert not met.executed_fallback_ops(), met.executed_fallback_ops()
    run(2)
    assert met.counter_value("UncachedCompile") == compiles, "new data of the same shape recompiled"
    assert not met.executed_fallback_ops(), met.executed_fallback_ops()


def test_torchvision_stable_ties_orders_equal_scores_by_index():
    """Above 1000 CPU boxes, batched_nms merges classes with an unstable sort, so equal scores come
    out in whatever order std::sort leaves; within ``torchvision_stable_ties`` they come out by index,
    which is the order of the pure-tensor NMS. The kept set is the same either way."""
    import torchvision.ops.boxes as tv_boxes

    from mrcnn.parity import torchvision_stable_ties

    gen = torch.Generator().manual_seed(7)
    n = 1500  # > 1000 boxes: batched_nms's per-class path on the CPU
    boxes, _ = clustered_boxes(gen, 1, n, clusters=200)
    scores = torch.ones(1, n)  # saturated: every score ties, as sigmoid(objectness) = 1.0 in fp32 does
    scores[0, : n // 3] = 0.5
    groups = torch.randint(0, 3, (1, n), generator=gen)
    shipped_fn = tv_boxes._batched_nms_vanilla
    shipped = torchvision.ops.batched_nms(boxes[0], scores[0], groups[0], 0.7)
    with torchvision_stable_ties():
        stable = torchvision.ops.batched_nms(boxes[0], scores[0], groups[0], 0.7)
    assert tv_boxes._batched_nms_vanilla is shipped_fn  # restored
    assert not torch.equal(shipped, stable), "std::sort kept the index order: the test shows nothing"
    assert sorted(shipped.tolist()) == sorted(stable.tolist())
    everything = torch.ones(1, n, dtype=torch.bool)
    keep, keep_valid = nms_fixed(boxes, scores, everything, 0.7, n, groups=groups, impl="tensor")
    assert torch.equal(keep[0, keep_valid[0]], stable)
