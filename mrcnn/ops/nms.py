"""Non-maximum suppression with a fixed output size.

``nms_fixed`` solves G independent NMS problems of N candidates each and returns exactly
``max_out`` indices per problem, padded, plus a ``keep_valid`` mask. The kept set and its order
are those of ``torchvision.ops.batched_nms`` on the valid candidates of each problem.

Its two forms are two operators: ``mrcnn::nms_fixed`` (the pure-tensor fixed point, a
``CompositeImplicitAutograd`` op that decomposes into aten ops) and ``mrcnn::nms_fixed_tv``
(torchvision's kernel behind a fake kernel).
"""

import itertools

import torch
import torchvision
from torch import Tensor

from ._library import define_composite, resolve_impl


def nms_fixed(
    boxes: Tensor,
    scores: Tensor,
    valid: Tensor,
    iou_threshold: float,
    max_out: int,
    groups: Tensor | None = None,
    impl: str = "tensor",
    iterations: int = 16,
) -> tuple[Tensor, Tensor]:
    """Batched, class-aware NMS whose output shape depends only on ``max_out``.

    Args:
        boxes: [G, N, 4] (x1, y1, x2, y2). G independent problems (images, image x level, ...).
        scores: [G, N] float.
        valid: [G, N] bool. Invalid candidates are ignored: never kept, never suppress.
        iou_threshold: a candidate is suppressed by a kept higher-scoring one when IoU > threshold.
        max_out: number of output slots per problem; may exceed N (then padded).
        groups: [G, N] int64 or None. Candidates of different groups never suppress each other
            (per-class NMS, as ``torchvision.ops.batched_nms``'s ``idxs``).
        impl: "tensor", "torchvision" or "auto" (see :func:`mrcnn.ops.resolve_impl`).
        iterations: fixed-point steps of the "tensor" impl. It equals greedy NMS once this
            covers the steps the data needs (:func:`nms_convergence_steps`), at most the longest
            chain of would-be suppressions (a over b over c ...). RPN-like inputs (1000 to 4700
            clustered boxes, IoU 0.7) needed 4 to 11. With too few steps some boxes are wrongly
            kept or dropped. Ignored by the "torchvision" impl.

    Returns:
        keep: [G, max_out] int64 indices into N, highest score first. Padded slots hold 0.
        keep_valid: [G, max_out] bool, False on padded slots.

    Equal scores are ordered by index, as in torchvision's nms kernel. (``batched_nms`` on more
    than 1000 CPU boxes merges its per-class results with an unstable sort, so there the order of
    equal-scored kept boxes may differ; the kept set does not.) The "tensor" impl holds a few
    [G, N, N] temporaries in the boxes' dtype: 64 MB each for N = 4000 in float32.
    """
    if boxes.dim() != 3 or boxes.shape[-1] != 4:
        raise ValueError(f"boxes must be [G, N, 4], got {tuple(boxes.shape)}")
    if scores.shape != boxes.shape[:2] or valid.shape != boxes.shape[:2]:
        raise ValueError(f"scores and valid must be [G, N] = {tuple(boxes.shape[:2])}")
    if groups is not None and groups.shape != boxes.shape[:2]:
        raise ValueError(f"groups must be [G, N] = {tuple(boxes.shape[:2])}")
    if max_out < 0:
        raise ValueError(f"max_out must be >= 0, got {max_out}")
    valid = valid.to(torch.bool)
    if resolve_impl(impl, boxes.device) == "torchvision":
        if groups is None:
            groups = torch.zeros_like(scores, dtype=torch.int64)
        return torch.ops.mrcnn.nms_fixed_tv(boxes, scores, valid, groups, float(iou_threshold), max_out)
    return torch.ops.mrcnn.nms_fixed(boxes, scores, valid, groups, float(iou_threshold), max_out, iterations)


def nms_fixed_segments(
    boxes: Tensor,
    scores: Tensor,
    valid: Tensor,
    sizes: list[int],
    iou_threshold: float,
    max_out: int,
    impl: str = "tensor",
    iterations: int = 16,
) -> tuple[Tensor, Tensor]:
    """:func:`nms_fixed` with consecutive segments of candidates as its groups, one problem per segment.

    The result equals ``nms_fixed(..., groups=segment index)``, ties included, but the pure-tensor
    form holds an [n, n] suppression matrix per problem and streams it ``iterations`` times, so L
    segments of k candidates cost L * k^2 instead of (L * k)^2 (the RPN's per-level NMS: 5 levels).

    Args:
        boxes: [B, N, 4], scores [B, N], valid [B, N] bool, with N = sum(sizes): segment s holds
            candidates sizes[0] + ... + sizes[s - 1] onwards.
        sizes: the segments' lengths, static ints, each > 0.
        iou_threshold, max_out, impl, iterations: as :func:`nms_fixed`.

    Returns:
        keep: [B, max_out] int64 indices into N, highest score first (equal scores: lower index
        first), padded slots 0. keep_valid: [B, max_out] bool.
    """
    if boxes.dim() != 3 or scores.shape != boxes.shape[:2] or valid.shape != boxes.shape[:2]:
        raise ValueError(f"boxes must be [B, N, 4] with scores and valid [B, N], got {tuple(boxes.shape)}")
    if not sizes or any(k <= 0 for k in sizes) or sum(sizes) != boxes.shape[1]:
        raise ValueError(f"sizes must be positive and sum to N = {boxes.shape[1]}, got {sizes}")
    b = boxes.shape[0]
    per = min(max_out, max(sizes))  # a segment keeps at most its own length

    keep, keep_valid = nms_fixed(
        _segmented(boxes, sizes, 0.0), _segmented(scores, sizes, 0.0), _segmented(valid.to(torch.bool), sizes, False),
        iou_threshold, per, impl=impl, iterations=iterations,
    )  # fmt: skip
    starts = itertools.accumulate(sizes[:-1], initial=0)
    offset = torch.cat([torch.full((per,), s, dtype=torch.int64, device=boxes.device) for s in starts])
    index = keep.view(b, -1) + offset  # [B, L * per] into N, each segment's kept best first
    kept = keep_valid.view(b, -1)
    if index.shape[1] < max_out:  # fewer candidates than slots: padded slots, never kept
        index = torch.cat([index, index.new_zeros((b, max_out - index.shape[1]))], 1)
        kept = torch.cat([kept, kept.new_zeros((b, max_out - kept.shape[1]))], 1)
    # Merge the segments best first. The stable sort keeps equal scores in segment order, then in
    # each segment's own order (lower index first): the order one NMS over all of N gives.
    key = torch.where(kept, scores.gather(1, index), torch.full_like(scores[:, :1], float("-inf")))
    order = torch.sort(key, dim=1, descending=True, stable=True).indices[:, :max_out]
    keep_valid = kept.gather(1, order)
    return torch.where(keep_valid, index.gather(1, order), torch.zeros_like(order)), keep_valid


def _segmented(t: Tensor, sizes: list[int], fill: float) -> Tensor:
    """[B, N, ...] -> [B * L, max(sizes), ...]: segment s of N in row s of each image, padded at its end
    with ``fill``. (Module level: this package keeps its annotations evaluated, see _library.py,
    and dynamo cannot trace a nested function annotated with a ``float | bool`` union.)"""
    b, widest = t.shape[0], max(sizes)
    parts, start = [], 0
    for k in sizes:
        part = t[:, start : start + k]
        if k < widest:
            part = torch.cat([part, part.new_full((b, widest - k, *t.shape[2:]), fill)], 1)
        parts.append(part)
        start += k
    return torch.stack(parts, 1).flatten(0, 1)


# ------------------------------------------------------------------------------------------------
# Pure-tensor implementation


def _pairwise_iou(boxes: Tensor) -> Tensor:
    """[G, N, 4] -> [G, N, N] IoU, computed as torchvision's nms kernel does.

    Same formula and operation order (area from (x2 - x1) * (y2 - y1), intersection clamped at 0,
    inter / (area_i + area_j - inter)), so the strict ``> threshold`` test agrees with the kernel
    bit for bit rather than only up to rounding.
    """
    x1, y1, x2, y2 = boxes.unbind(-1)
    area = (x2 - x1) * (y2 - y1)
    # In-place on the fresh [G, N, N] temporaries: each one is 64 MB at N = 4000, and eager CPU
    # time goes mostly to allocating and streaming them. Dynamo and XLA functionalise these.
    iw = torch.minimum(x2[:, :, None], x2[:, None, :])
    iw -= torch.maximum(x1[:, :, None], x1[:, None, :])
    ih = torch.minimum(y2[:, :, None], y2[:, None, :])
    ih -= torch.maximum(y1[:, :, None], y1[:, None, :])
    inter = iw.clamp_(min=0).mul_(ih.clamp_(min=0))
    union = area[:, :, None] + area[:, None, :]
    return inter.div_(union.sub_(inter))


def _suppression_matrix(boxes: Tensor, valid: Tensor, groups: Tensor | None, iou_threshold: float) -> Tensor:
    """M[g, i, j] = 1 when sorted candidate j (scored higher than i) would suppress i if kept.

    Inputs are already in descending score order: boxes [G, N, 4], valid [G, N], groups [G, N].
    Returns [G, N, N] in the boxes' dtype, ready for a batched mat-vec.
    """
    n = boxes.shape[1]
    pos = torch.arange(n, device=boxes.device)
    earlier = pos[None, :] < pos[:, None]  # [N, N]: column j precedes row i in score order
    m = (_pairwise_iou(boxes) > iou_threshold) & earlier & valid[:, None, :]
    if groups is not None:
        m = m & (groups[:, :, None] == groups[:, None, :])
    return m.to(boxes.dtype)


def _sorted_problem(
    boxes: Tensor, scores: Tensor, valid: Tensor, groups: Tensor | None, iou_threshold: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Sort each problem by descending score and build its suppression matrix.

    Returns order [G, N] (sorted position -> original index), the sorted valid mask [G, N] and
    the suppression matrix [G, N, N] (see :func:`_suppression_matrix`).
    """
    g, n = scores.shape
    # Invalid candidates sort last; the stable sort breaks score ties by index, as the kernel does.
    masked = torch.where(valid, scores, torch.full_like(scores, float("-inf")))
    order = torch.sort(masked, dim=1, descending=True, stable=True).indices
    s_boxes = boxes.gather(1, order[:, :, None].expand(g, n, 4))
    s_valid = valid.gather(1, order)
    s_groups = None if groups is None else groups.gather(1, order)
    return order, s_valid, _suppression_matrix(s_boxes, s_valid, s_groups, iou_threshold)


def _fixed_point_step(m: Tensor, s_valid: Tensor, keep: Tensor) -> Tensor:
    """keep_i <- valid_i & !any_j(M_ij & keep_j), the "any" as a batched mat-vec (one dot on XLA)."""
    hits = torch.bmm(m, keep.to(m.dtype)[:, :, None])[:, :, 0]
    return s_valid & (hits <= 0)


def _nms_fixed_tensor(
    boxes: Tensor,
    scores: Tensor,
    valid: Tensor,
    groups: Tensor | None,
    iou_threshold: float,
    max_out: int,
    iterations: int,
) -> tuple[Tensor, Tensor]:
    """Kernel of ``mrcnn::nms_fixed``; :func:`nms_fixed` checks the arguments before calling it."""
    g, n = scores.shape
    if n == 0 or max_out == 0:
        zeros = torch.zeros((g, max_out), dtype=torch.int64, device=boxes.device)
        return zeros, zeros.to(torch.bool)
    order, s_valid, m = _sorted_problem(boxes, scores, valid.to(torch.bool), groups, iou_threshold)

    # Greedy NMS is the unique fixed point of keep_i = valid_i & !any_j(M_ij & keep_j), because M
    # is strictly lower triangular. Starting from keep = valid, step t settles every candidate
    # whose longest chain of would-be suppressors (j over i, k over j, ...) has t links, so the
    # result is exact once `iterations` covers the longest chain; in practice it settles sooner
    # (see nms_convergence_steps).
    keep = s_valid
    for _ in range(iterations):
        keep = _fixed_point_step(m, s_valid, keep)

    # First max_out kept candidates in sorted order: rank kept ones by earliness, others at 0.
    # float32 ranks are exact below 2**24 candidates.
    rank = (n - torch.arange(n, device=boxes.device)).to(torch.float32)
    key = torch.where(keep, rank, torch.zeros_like(rank))
    if max_out > n:
        key = torch.nn.functional.pad(key, (0, max_out - n))
    top_key, top_pos = key.topk(max_out, dim=1)
    keep_valid = top_key > 0
    idx = order.gather(1, top_pos.clamp(max=n - 1))
    return torch.where(keep_valid, idx, torch.zeros_like(idx)), keep_valid


# The pure-tensor form as an operator, so that graphs show one node per NMS (until decomposed) and
# the op can be opchecked; see mrcnn/ops/_library.py.
define_composite(
    "nms_fixed",
    "(Tensor boxes, Tensor scores, Tensor valid, Tensor? groups, float iou_threshold, int max_out, int iterations)"
    " -> (Tensor keep, Tensor keep_valid)",
    _nms_fixed_tensor,
)


@torch.no_grad()
def nms_convergence_steps(
    boxes: Tensor,
    scores: Tensor,
    valid: Tensor,
    iou_threshold: float,
    groups: Tensor | None = None,
    max_steps: int = 1000,
) -> Tensor:
    """Diagnostic (eager only, data-dependent loop): fixed-point steps each problem needs.

    Returns [G] int64: the smallest ``iterations`` for which the "tensor" impl of
    :func:`nms_fixed` equals greedy NMS on these inputs. Use it to choose ``iterations`` for a
    data distribution; it is not meant to run inside a compiled graph.
    """
    g, n = scores.shape
    steps = torch.zeros(g, dtype=torch.int64, device=boxes.device)
    if n == 0:
        return steps
    _, s_valid, m = _sorted_problem(boxes, scores, valid.to(torch.bool), groups, float(iou_threshold))
    keep = s_valid
    for t in range(1, max_steps + 1):
        new = _fixed_point_step(m, s_valid, keep)
        changed = (new != keep).any(dim=1)
        if not changed.any():
            return steps
        steps[changed] = t
        keep = new
    raise RuntimeError(f"NMS fixed point not reached in {max_steps} steps")


# ------------------------------------------------------------------------------------------------
# torchvision kernel behind a fixed-shape custom op


@torch.library.custom_op("mrcnn::nms_fixed_tv", mutates_args=())
def _nms_fixed_tv(
    boxes: Tensor, scores: Tensor, valid: Tensor, groups: Tensor, iou_threshold: float, max_out: int
) -> tuple[Tensor, Tensor]:
    """Real kernel: per problem, ``batched_nms`` on the valid subset, truncated and padded."""
    g = boxes.shape[0]
    keep = torch.zeros((g, max_out), dtype=torch.int64, device=boxes.device)
    keep_valid = torch.zeros((g, max_out), dtype=torch.bool, device=boxes.device)
    for i in range(g):
        idx = valid[i].nonzero().squeeze(1)
        kept = torchvision.ops.batched_nms(boxes[i, idx], scores[i, idx], groups[i, idx], iou_threshold)
        kept = idx[kept[:max_out]]
        keep[i, : kept.numel()] = kept
        keep_valid[i, : kept.numel()] = True
    return keep, keep_valid


@_nms_fixed_tv.register_fake
def _nms_fixed_tv_fake(
    boxes: Tensor, scores: Tensor, valid: Tensor, groups: Tensor, iou_threshold: float, max_out: int
) -> tuple[Tensor, Tensor]:
    g = boxes.shape[0]
    return (
        boxes.new_empty((g, max_out), dtype=torch.int64),
        boxes.new_empty((g, max_out), dtype=torch.bool),
    )
