"""mrcnn.ops' fixed-size NMS against torchvision's batched_nms, in both impls.

Equality with the dynamic reference over thresholds, groups and output sizes (truncated and padded),
invalid candidates, the strict threshold, the iteration bound of the pure-tensor form, opcheck of
the torchvision-kernel op, and torchvision's tie order made stable (the order of the tensor form).
"""

from __future__ import annotations

import pytest
import torch
import torchvision

from mrcnn.ops import nms_fixed, nms_fixed_segments, resolve_impl
from mrcnn.ops.nms import nms_convergence_steps
from tests.helpers.ops_inputs import IMPLS, clustered_boxes, reference_nms

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
@pytest.mark.parametrize("max_out", [40, 300])
def test_nms_segments_equal_one_problem_grouped_by_segment(impl, max_out):
    # The RPN's per-level NMS: segments of unequal length (the last shorter than the widest, as the
    # coarse levels are), scores rounded so that equal scores meet across segments and inside them.
    gen = torch.Generator().manual_seed(11)
    sizes = [90, 90, 60, 17]
    boxes, scores = clustered_boxes(gen, 2, sum(sizes), clusters=10)
    scores = (scores * 16).round() / 16
    valid = torch.rand(2, sum(sizes), generator=gen) > 0.1
    level = torch.cat([torch.full((k,), i) for i, k in enumerate(sizes)]).expand(2, -1)

    keep, keep_valid = nms_fixed_segments(boxes, scores, valid, sizes, 0.6, max_out, impl=impl)
    ref_keep, ref_valid = nms_fixed(boxes, scores, valid, 0.6, max_out, groups=level, impl="tensor")

    assert keep.shape == keep_valid.shape == (2, max_out)
    assert torch.equal(keep_valid, ref_valid) and torch.equal(keep, ref_keep)
    assert 0 < int(keep_valid[0].sum()) < valid[0].sum()  # NMS had work to do
    assert keep_valid.all() if max_out == 40 else not keep_valid[:, -1].any()  # truncated / padded
    tied = scores.gather(1, keep)[keep_valid]
    assert len(tied.unique()) < len(tied)  # the tie order was exercised
    with pytest.raises(ValueError, match="sum to N"):
        nms_fixed_segments(boxes, scores, valid, [90, 90], 0.6, max_out)


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
