"""mrcnn.ops' multi-level RoIAlign against torchvision's MultiScaleRoIAlign, in both impls.

Values and gradients over every FPN level and the kernel's corner cases, gradcheck, opcheck of the
torchvision-kernel ops (forward and backward), and the threaded torchvision-kernel path: chunks
dealt evenly, run concurrently, equal to one call per level, under no_grad and in a forked child.
"""

from __future__ import annotations

import multiprocessing
import threading

import pytest
import torch
from torchvision.ops.poolers import initLevelMapper

import mrcnn.ops.roi_align as roi_align_module
from mrcnn.ops import multilevel_roi_align, parallel
from mrcnn.ops.roi_align import infer_scales
from tests.helpers.ops_inputs import IMPLS, pyramid, reference_roi_align, roi_boxes, roi_sample

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


def test_roi_align_with_images_pools_each_roi_from_its_image(roi_impl):
    """``images=``: the RoIs of two images shuffled into one row pool, and pass gradient back, as
    the same RoIs pooled image by image."""
    gen = torch.Generator().manual_seed(13)
    features = pyramid(gen, 2, 3, 12, 16)
    boxes = roi_boxes(gen, 2, (48, 64))  # [2, R, 4]
    r = boxes.shape[1]
    order = torch.randperm(2 * r, generator=gen)
    upstream = torch.randn(2 * r, 3, 7, 7, generator=gen)

    def pooled_and_grads(packed: bool):
        leaves = [f.clone().requires_grad_() for f in features]
        if packed:
            out = multilevel_roi_align(
                leaves, boxes.flatten(0, 1)[order][None], 7, impl=roi_impl, images=(order // r)[None]
            )[0]
        else:
            out = multilevel_roi_align(leaves, boxes, 7, impl=roi_impl).flatten(0, 1)[order]
        (out * upstream).sum().backward()
        return out.detach(), [f.grad for f in leaves]

    (got, got_grads), (ref, ref_grads) = pooled_and_grads(True), pooled_and_grads(False)
    assert got.shape == (2 * r, 3, 7, 7) and ref.abs().sum() > 0
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)
    for g_, r_ in zip(got_grads, ref_grads):
        assert g_.shape == r_.shape
        torch.testing.assert_close(g_, r_, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"images \[B', R\]"):
        multilevel_roi_align(features, boxes[:1], 7, impl=roi_impl, images=(order // r)[None])


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
    images = torch.randint(0, 2, boxes.shape[:2], generator=gen)  # RoIs of either image in each row
    # Inputs that require grad make test_autograd_registration and test_aot_dispatch_dynamic
    # exercise the registered backward (itself a custom op), with symbolic shapes.
    result = torch.library.opcheck(
        torch.ops.mrcnn.multilevel_roi_align_tv.default, (features, boxes, scales, 3, 2, 224, 4, images)
    )
    assert all(v == "SUCCESS" for v in result.values()), result

    # The backward op: double backward is not supported (no autograd formula of its own), so it
    # is checked without inputs that require grad, which makes test_autograd_registration vacuous.
    grad = torch.randn(2, boxes.shape[1], 3, 3, 3, generator=gen)
    heights, widths = [f.shape[2] for f in features], [f.shape[3] for f in features]
    result = torch.library.opcheck(
        torch.ops.mrcnn.multilevel_roi_align_tv_backward.default,
        (grad, boxes, scales, heights, widths, 2, 224, 4, 2, images),
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
    features, boxes = roi_sample(seed=4, requires_grad=True)
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
    features, boxes = roi_sample(seed=6)
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
