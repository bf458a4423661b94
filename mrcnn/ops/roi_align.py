"""Multi-level (FPN) RoIAlign with a fixed output shape.

``multilevel_roi_align`` equals ``torchvision.ops.MultiScaleRoIAlign``: each RoI goes to the
FPN level chosen by torchvision's ``LevelMapper`` and is pooled there with
``roi_align(..., aligned=False)``. The "tensor" impl gathers the bilinear neighbours from all
levels at once, each RoI with its own level's offset, width and height, so there is no
data-dependent branch or shape anywhere.

Its two forms are two operators: ``mrcnn::multilevel_roi_align`` (the gather form, a
``CompositeImplicitAutograd`` op that decomposes into aten ops and is differentiated through them)
and ``mrcnn::multilevel_roi_align_tv`` (torchvision's kernels, with a registered backward op).

torchvision's CPU kernels run on one thread. On the CPU the ``*_tv`` ops split each level's RoIs
into ``torch.get_num_threads()`` chunks whose kernel calls run concurrently: see
:mod:`mrcnn.ops.parallel` (and its switch, ``THREADED``).
"""

import math

import torch
from torch import Tensor

from . import parallel
from ._library import define_composite, resolve_impl

_LEVEL_EPS = 1e-6  # torchvision LevelMapper's eps


def multilevel_roi_align(
    features: list[Tensor],
    boxes: Tensor,
    output_size: int,
    sampling_ratio: int = 2,
    canonical_scale: int = 224,
    canonical_level: int = 4,
    impl: str = "tensor",
    scales: list[float] | None = None,
    images: Tensor | None = None,
) -> Tensor:
    """Pool a fixed number of RoIs per image from an FPN pyramid.

    Args:
        features: L tensors [B, C, H_l, W_l], finest first (P2, P3, ...).
        boxes: [B, R, 4] (x1, y1, x2, y2) in input-image pixels. Boxes with x2 < x1 or y2 < y1
            have no level in torchvision (NaN area root) and pool to zeros here too.
        output_size: S, the side of the pooled grid.
        sampling_ratio: sample points per bin side; must be > 0 (a data-dependent grid, as
            torchvision's sampling_ratio <= 0, would not have a static shape).
        canonical_scale, canonical_level: torchvision LevelMapper's parameters.
        impl: "tensor", "torchvision" or "auto" (see :func:`mrcnn.ops.resolve_impl`).
        scales: spatial scale of each level (feature size / image size). If None, level 0 is taken
            to be stride 4 and level l gets ``2 ** round(log2(H_l / H_0)) / 4``, which is what
            torchvision infers when the image size is (4 * H_0, 4 * W_0).
        images: [B', R] int64, the image (index into the features' batch) each RoI is pooled
            from, with ``boxes`` [B', R, 4] for any B' (torchvision's roi format carries the same
            index). None: row b of ``boxes`` pools from image b (B' = B).

    Returns:
        [B', R, C, S, S] pooled features, in the features' dtype.

    The "tensor" impl computes sample positions in the boxes' dtype and differentiates w.r.t.
    ``features`` through gathers. The "torchvision" impl casts boxes to the features' dtype (its
    kernel requires one dtype) and registers torchvision's roi_align backward. Neither gives a
    gradient w.r.t. ``boxes``, as in torchvision.
    """
    if not features:
        raise ValueError("features must hold at least one level")
    if images is None:
        if boxes.dim() != 3 or boxes.shape[-1] != 4 or boxes.shape[0] != features[0].shape[0]:
            raise ValueError(f"boxes must be [B, R, 4] with B = {features[0].shape[0]}, got {tuple(boxes.shape)}")
    elif boxes.dim() != 3 or boxes.shape[-1] != 4 or tuple(images.shape) != tuple(boxes.shape[:2]):
        shapes = f"{tuple(boxes.shape)}, {tuple(images.shape)}"
        raise ValueError(f"boxes must be [B', R, 4] and images [B', R], got {shapes}")
    if sampling_ratio <= 0:
        raise ValueError(f"sampling_ratio must be > 0 for a static shape, got {sampling_ratio}")
    if scales is None:
        scales = infer_scales(features)
    if len(scales) != len(features):
        raise ValueError(f"{len(scales)} scales for {len(features)} levels")
    scales = [float(s) for s in scales]
    if resolve_impl(impl, boxes.device) == "torchvision":
        # The custom op takes every RoI's image explicitly (its schema has no optional tensor).
        images = _images(boxes, images).expand(boxes.shape[:2])
        return torch.ops.mrcnn.multilevel_roi_align_tv(
            list(features), boxes, scales, output_size, sampling_ratio, canonical_scale, canonical_level, images
        )
    return torch.ops.mrcnn.multilevel_roi_align(
        list(features), boxes, scales, output_size, sampling_ratio, canonical_scale, canonical_level, images
    )


def infer_scales(features: list[Tensor]) -> list[float]:
    """Spatial scale per level, assuming level 0 has stride 4 (P2) and strides double upward."""
    h0 = features[0].shape[-2]
    return [2.0 ** round(math.log2(f.shape[-2] / h0)) / 4.0 for f in features]


def _level_range(scales: list[float]) -> tuple[int, int]:
    """(k_min, k_max): the pyramid levels (log2 of stride) of the first and last feature map."""
    return round(-math.log2(scales[0])), round(-math.log2(scales[-1]))


def roi_levels(boxes: Tensor, scales: list[float], canonical_scale: int, canonical_level: int) -> tuple[Tensor, Tensor]:
    """torchvision's LevelMapper on [..., 4] boxes.

    Returns:
        level: [...] int64 in [0, L - 1], index into ``features``.
        has_level: [...] bool, False where torchvision assigns no level (NaN area root, i.e.
            x2 < x1 or y2 < y1): its int64 cast of NaN matches no level, so the RoI pools to zero.
    """
    k_min, k_max = _level_range(scales)
    x1, y1, x2, y2 = boxes.unbind(-1)
    s = torch.sqrt((x2 - x1) * (y2 - y1))
    # Same expression and operation order as LevelMapper: floor(k0 + log2(s / s0) + eps).
    lvl = torch.floor(canonical_level + torch.log2(s / canonical_scale) + _LEVEL_EPS)
    # Test for NaN before clamping: XLA's clamp turns NaN into a bound, torch's keeps it. And cast
    # only finite values: NaN -> int64 is platform-dependent.
    has_level = ~torch.isnan(lvl)
    lvl = torch.where(has_level, lvl, torch.full_like(lvl, k_min))
    lvl = torch.clamp(lvl, min=k_min, max=k_max)
    return (lvl.to(torch.int64) - k_min), has_level


def _images(boxes: Tensor, images: Tensor | None) -> Tensor:
    """The image index of each RoI: ``images``, or [B, 1] row numbers (broadcast over R) when None."""
    if images is not None:
        return images
    return torch.arange(boxes.shape[0], device=boxes.device)[:, None]


# ------------------------------------------------------------------------------------------------
# Pure-tensor implementation


def _lookup(level: Tensor, values: list[float] | list[int], dtype: torch.dtype) -> Tensor:
    """values[level] elementwise for a short per-level table, as a where-chain.

    A where-chain keeps the table as graph constants: no host-to-device copy on XLA and nothing
    for dynamo to guard on, and L <= 5 makes it as cheap as a gather.
    """
    out = torch.full(level.shape, values[0], dtype=dtype, device=level.device)
    for i in range(1, len(values)):
        out = torch.where(level == i, torch.full_like(out, values[i]), out)
    return out


def _axis_samples(
    start: Tensor, length: Tensor, size: Tensor, output_size: int, ratio: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Bilinear sample positions along one axis, following torchvision's roi_align kernel.

    Args:
        start: [B, R] RoI start on the feature map (box coordinate * scale).
        length: [B, R] RoI length on the feature map, already clamped to >= 1.
        size: [B, R] feature map size along this axis (H or W of the RoI's level), float.

    Returns [B, R, S, ratio] each: low index (int64), high index (int64), and the weights of the
    low and high neighbours, both zero for a sample off the map (the kernel's empty sample).
    Bilinear weights are separable, so the 2D taps are products of these 1D ones.
    """
    dtype = start.dtype
    bin_size = (length / output_size)[:, :, None, None]
    p = torch.arange(output_size, device=start.device, dtype=dtype)[:, None]  # bin index
    frac = torch.arange(ratio, device=start.device, dtype=dtype) + 0.5  # sample index + 0.5
    # start + p * bin + (i + .5) * bin / ratio, in the kernel's evaluation order.
    pos = (start[:, :, None, None] + p * bin_size) + frac * bin_size / ratio
    size = size[:, :, None, None]
    inside = (pos >= -1.0) & (pos <= size)
    pos = pos.clamp(min=0)
    low = torch.floor(pos)
    at_edge = low >= size - 1  # the kernel snaps both neighbours (and the sample) to the last row
    low = torch.where(at_edge, size - 1, low)
    pos = torch.where(at_edge, low, pos)
    high = torch.where(at_edge, low, low + 1)
    frac_high = pos - low
    frac_low = 1.0 - frac_high
    zero = torch.zeros_like(pos)
    w_low = torch.where(inside, frac_low, zero)
    w_high = torch.where(inside, frac_high, zero)
    # Off-map (and NaN) samples read index 0 with zero weight: a legal index, so no gather faults.
    low = torch.where(inside, low, zero).to(torch.int64)
    high = torch.where(inside, high, zero).to(torch.int64)
    return low, high, w_low, w_high


def _weighted_rows(table: Tensor, index: Tensor, weight: Tensor) -> Tensor:
    """out[m] = sum_k weight[m, k] * table[index[m, k]]: table [T, C], index/weight [M, K] -> [M, C].

    Materialising all taps as one [M, K, C] gather takes a lot of memory (hundreds of MB for a
    thousand RoIs at 7x7 with 256 channels) and is slow on every backend, so each device gets the
    form it runs best: :func:`_weighted_rows_bag` on CPU/CUDA, :func:`_weighted_rows_taps` elsewhere.
    """
    if table.device.type in ("cpu", "cuda"):
        return _weighted_rows_bag(table, index, weight)
    return _weighted_rows_taps(table, index, weight)


def _weighted_rows_bag(table: Tensor, index: Tensor, weight: Tensor) -> Tensor:
    """:func:`_weighted_rows` as one ``embedding_bag`` with per-sample weights.

    It never materialises the taps and is multi-threaded on the CPU, where torchvision's roi_align
    kernel is not. XLA has no lowering for it (it would fall back to the CPU).
    """
    return torch.nn.functional.embedding_bag(index, table, mode="sum", per_sample_weights=weight)


def _weighted_rows_taps(table: Tensor, index: Tensor, weight: Tensor) -> Tensor:
    """:func:`_weighted_rows` as K separate [M, C] gathers: XLA fuses each into the running sum."""
    out = table.index_select(0, index[:, 0]) * weight[:, :1]
    for k in range(1, index.shape[1]):
        out = out + table.index_select(0, index[:, k]) * weight[:, k : k + 1]
    return out


def _roi_align_tensor(
    features: list[Tensor],
    boxes: Tensor,
    scales: list[float],
    output_size: int,
    sampling_ratio: int,
    canonical_scale: int,
    canonical_level: int,
    images: Tensor | None = None,
) -> Tensor:
    """Kernel of ``mrcnn::multilevel_roi_align``; :func:`multilevel_roi_align` checks the arguments."""
    b, r = boxes.shape[:2]
    c = features[0].shape[1]
    s, q = output_size, sampling_ratio
    heights = [f.shape[-2] for f in features]
    widths = [f.shape[-1] for f in features]
    offsets = [0]
    for h, w in zip(heights, widths):
        offsets.append(offsets[-1] + h * w)
    per_image = offsets[-1]

    # All levels flattened channels-last into one table: row b * sum(HW) + offset_l + y * W_l + x.
    # Channels-last makes each gathered row one contiguous C-vector.
    # cat writes the transposed views straight into its output: a single copy of the pyramid.
    table = torch.cat([f.flatten(2).transpose(1, 2) for f in features], dim=1).reshape(-1, c)

    level, has_level = roi_levels(boxes, scales, canonical_scale, canonical_level)
    dtype = boxes.dtype
    scale = _lookup(level, scales, dtype)
    height = _lookup(level, heights, dtype)
    width = _lookup(level, widths, dtype)
    row_stride = _lookup(level, widths, torch.int64)
    base = _lookup(level, offsets[:-1], torch.int64)
    base = base + _images(boxes, images) * per_image  # [B, R]

    x1, y1, x2, y2 = boxes.unbind(-1)
    start_x, start_y = x1 * scale, y1 * scale
    # aligned=False: malformed RoIs are forced to at least 1x1 feature cells.
    roi_w = torch.clamp(x2 * scale - start_x, min=1.0)
    roi_h = torch.clamp(y2 * scale - start_y, min=1.0)
    y_lo, y_hi, wy_lo, wy_hi = _axis_samples(start_y, roi_h, height, s, q)
    x_lo, x_hi, wx_lo, wx_hi = _axis_samples(start_x, roi_w, width, s, q)
    # RoIs without a level (torchvision leaves them at zero) contribute nothing.
    wy_lo = wy_lo * has_level[:, :, None, None]
    wy_hi = wy_hi * has_level[:, :, None, None]

    # Separable -> 2D over [B, R, S(y), S(x), q(y), q(x)], then 4 neighbours stacked last.
    def grid_y(t: Tensor) -> Tensor:
        return t[:, :, :, None, :, None]

    def grid_x(t: Tensor) -> Tensor:
        return t[:, :, None, :, None, :]

    rows_lo = grid_y(base[:, :, None, None] + y_lo * row_stride[:, :, None, None])
    rows_hi = grid_y(base[:, :, None, None] + y_hi * row_stride[:, :, None, None])
    cols_lo, cols_hi = grid_x(x_lo), grid_x(x_hi)
    index = torch.stack([rows_lo + cols_lo, rows_lo + cols_hi, rows_hi + cols_lo, rows_hi + cols_hi], dim=-1)
    weight = torch.stack(
        [
            grid_y(wy_lo) * grid_x(wx_lo),
            grid_y(wy_lo) * grid_x(wx_hi),
            grid_y(wy_hi) * grid_x(wx_lo),
            grid_y(wy_hi) * grid_x(wx_hi),
        ],
        dim=-1,
    )
    # [B*R*S*S, K] with K = q*q*4 taps per output cell.
    k = q * q * 4
    index = index.reshape(b * r * s * s, k)
    # The kernel sums the taps and divides by the count last; folding 1/count into the weights
    # is the same up to rounding, and exact for the usual power-of-two counts (ratio 2 -> 4).
    weight = (weight / (q * q)).reshape(b * r * s * s, k).to(table.dtype)

    pooled = _weighted_rows(table, index, weight)  # [B*R*S*S, C]
    return pooled.view(b, r, s, s, c).permute(0, 1, 4, 2, 3).contiguous()


# The gather form as an operator (see mrcnn/ops/_library.py). Its kernel is the function above,
# with the features' gradient from the aten ops it decomposes into, as before.
define_composite(
    "multilevel_roi_align",
    "(Tensor[] features, Tensor boxes, float[] scales, int output_size, int sampling_ratio, int canonical_scale,"
    " int canonical_level, Tensor? images=None) -> Tensor",
    _roi_align_tensor,
)


# ------------------------------------------------------------------------------------------------
# torchvision kernels behind fixed-shape custom ops


def _rois(boxes: Tensor, dtype: torch.dtype, images: Tensor) -> Tensor:
    """[B, R, 4] boxes, [B, R] images -> [B*R, 5] (image index, x1, y1, x2, y2), torchvision's roi format."""
    b, r = boxes.shape[:2]
    index = images.to(dtype)[:, :, None].expand(b, r, 1)
    return torch.cat([index, boxes.to(dtype)], dim=2).reshape(b * r, 5)


def _level_members(boxes: Tensor, scales: list[float], canonical_scale: int, canonical_level: int) -> list[Tensor]:
    """Per level, the flat indices (into B*R) of the RoIs pooled from it. Dynamic shapes."""
    level, has_level = roi_levels(boxes.reshape(-1, 4), scales, canonical_scale, canonical_level)
    return [torch.where(has_level & (level == i))[0] for i in range(len(scales))]


@torch.library.custom_op("mrcnn::multilevel_roi_align_tv", mutates_args=())
def _multilevel_roi_align_tv(
    features: list[Tensor],
    boxes: Tensor,
    scales: list[float],
    output_size: int,
    sampling_ratio: int,
    canonical_scale: int,
    canonical_level: int,
    images: Tensor,
) -> Tensor:
    """Real kernel: MultiScaleRoIAlign's per-level loop over ``torchvision::roi_align``, each level's
    RoIs split into concurrent chunks on the CPU (:mod:`mrcnn.ops.parallel`)."""
    b, r = boxes.shape[:2]
    c = features[0].shape[1]
    rois = _rois(boxes, features[0].dtype, images)
    out = features[0].new_zeros((b * r, c, output_size, output_size))
    members = _level_members(boxes, scales, canonical_scale, canonical_level)
    # The kernel makes its input NCHW-contiguous at every call: once per level here, not per chunk.
    features = [f.detach().contiguous() for f in features]

    def pool(level: int, idx: Tensor) -> Tensor:
        return torch.ops.torchvision.roi_align(
            features[level], rois[idx], scales[level], output_size, output_size, sampling_ratio, False
        )

    groups = parallel.deal(members, parallel.num_chunks(boxes.device))
    for group, results in zip(groups, parallel.run_groups(pool, groups)):
        for (_, idx), pooled in zip(group, results):
            out[idx] = pooled
    return out.view(b, r, c, output_size, output_size)


@_multilevel_roi_align_tv.register_fake
def _multilevel_roi_align_tv_fake(
    features: list[Tensor],
    boxes: Tensor,
    scales: list[float],
    output_size: int,
    sampling_ratio: int,
    canonical_scale: int,
    canonical_level: int,
    images: Tensor,
) -> Tensor:
    b, r = boxes.shape[:2]
    return features[0].new_empty((b, r, features[0].shape[1], output_size, output_size))


# The backward is a custom op too: its real kernel selects RoIs per level (dynamic shapes), which
# AOTAutograd could not trace, while its fake kernel gives the fixed feature-shaped gradients.
@torch.library.custom_op("mrcnn::multilevel_roi_align_tv_backward", mutates_args=())
def _multilevel_roi_align_tv_backward(
    grad: Tensor,
    boxes: Tensor,
    scales: list[float],
    heights: list[int],
    widths: list[int],
    sampling_ratio: int,
    canonical_scale: int,
    canonical_level: int,
    batch: int,
    images: Tensor,
) -> list[Tensor]:
    """grad [B', R, C, S, S] -> one [batch, C, H_l, W_l] gradient per level."""
    b, r, c, s = grad.shape[:4]
    rois = _rois(boxes, grad.dtype, images)
    flat = grad.reshape(b * r, c, s, s)
    members = _level_members(boxes, scales, canonical_scale, canonical_level)

    def scatter(level: int, idx: Tensor) -> Tensor:  # a whole [B, C, H, W] gradient per call
        h, w = heights[level], widths[level]
        return torch.ops.torchvision._roi_align_backward(
            flat[idx].contiguous(), rois[idx], scales[level], s, s, batch, c, h, w, sampling_ratio, False
        )

    groups = parallel.deal(members, parallel.num_chunks(grad.device))
    # Chunks of a level scatter into the same map, so each writes its own and they are summed.
    grads: list[Tensor | None] = [None] * len(scales)
    for group, results in zip(groups, parallel.run_groups(scatter, groups)):
        for (level, _), part in zip(group, results):
            grads[level] = part if grads[level] is None else grads[level].add_(part)
    return [
        g if g is not None else grad.new_zeros((batch, c, h, w)) for g, h, w in zip(grads, heights, widths)
    ]


@_multilevel_roi_align_tv_backward.register_fake
def _multilevel_roi_align_tv_backward_fake(
    grad: Tensor,
    boxes: Tensor,
    scales: list[float],
    heights: list[int],
    widths: list[int],
    sampling_ratio: int,
    canonical_scale: int,
    canonical_level: int,
    batch: int,
    images: Tensor,
) -> list[Tensor]:
    c = grad.shape[2]
    return [grad.new_empty((batch, c, h, w)) for h, w in zip(heights, widths)]


def _setup_context(ctx, inputs, output) -> None:
    features, boxes, scales, _, sampling_ratio, canonical_scale, canonical_level, images = inputs
    ctx.save_for_backward(boxes, images)
    ctx.batch = features[0].shape[0]
    ctx.heights = [f.shape[-2] for f in features]
    ctx.widths = [f.shape[-1] for f in features]
    ctx.args = (scales, sampling_ratio, canonical_scale, canonical_level)


def _backward(ctx, grad: Tensor):
    boxes, images = ctx.saved_tensors
    scales, sampling_ratio, canonical_scale, canonical_level = ctx.args
    grads = torch.ops.mrcnn.multilevel_roi_align_tv_backward(
        grad.contiguous(),
        boxes,
        scales,
        ctx.heights,
        ctx.widths,
        sampling_ratio,
        canonical_scale,
        canonical_level,
        ctx.batch,
        images,
    )
    # Boxes get no gradient, as with torchvision's roi_align.
    return list(grads), None, None, None, None, None, None, None


_multilevel_roi_align_tv.register_autograd(_backward, setup_context=_setup_context)
