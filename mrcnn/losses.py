"""Training losses on padded ground truth: torchvision's five losses with static shapes.

Each loss is the one torchvision computes (same matcher thresholds, encodings, smooth-L1 beta and
reductions), written so no shape depends on the data: per-sample terms are computed for a fixed
number of sampled slots and summed with ``torch.where`` on a validity mask, then divided by
counts that stay on the device. There is no ``.item()``, ``nonzero``, boolean indexing or Python
branch on tensor values between the images and the losses.

``check_targets`` is the host-side validation of :class:`~mrcnn.structures.Targets`; it runs
before the graph, never inside it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from mrcnn.box_ops import RPN_BOX_WEIGHTS, encode_boxes
from mrcnn.config import Config
from mrcnn.matching import Samples
from mrcnn.structures import ImageBatch, Targets

_SMOOTH_L1_BETA = 1.0 / 9  # torchvision's RPN and Fast R-CNN box losses

_MASK_DTYPES = (torch.uint8, torch.bool, torch.float16, torch.bfloat16, torch.float32, torch.float64)


# ------------------------------------------------------------------------------------------------
# Validation (host side)


def check_targets(targets: Targets, cfg: Config, batch: ImageBatch | None = None) -> None:
    """Raise ``ValueError`` if ``targets`` cannot be trained on; otherwise do nothing.

    Shapes and dtypes are always checked. Values (boxes with positive width and height, as
    torchvision requires, finite coordinates, labels in [1, num_classes)) are checked for the
    valid slots; this reads the tensors, so call it on the host, before moving a batch to an
    accelerator. ``batch`` adds the checks against the images: the batch size, and the canvas
    size for full-canvas masks.

    Masks are either cropped to their boxes, [B, G, S, S] with S = ``cfg.gt_mask_size`` (what the
    data pipeline produces), or full-canvas, [B, G, H, W] with (H, W) the batch's canvas.
    """
    if not isinstance(targets, Targets):
        raise ValueError(f"targets must be a mrcnn.structures.Targets, got {type(targets).__name__}")
    boxes, labels, masks, valid = targets
    for name, t in zip(Targets._fields, targets):
        if not isinstance(t, Tensor):
            raise ValueError(f"targets.{name} must be a tensor, got {type(t).__name__}")
    if boxes.dim() != 3 or boxes.shape[-1] != 4:
        raise ValueError(f"targets.boxes must be [B, G, 4], got {list(boxes.shape)}")
    b, g = boxes.shape[:2]
    if labels.shape != (b, g) or valid.shape != (b, g):
        raise ValueError(
            f"targets.labels and targets.valid must be [B, G] = {[b, g]} like the boxes, "
            f"got {list(labels.shape)} and {list(valid.shape)}"
        )
    if masks.dim() != 4 or masks.shape[:2] != (b, g):
        raise ValueError(f"targets.masks must be [B, G, S, S] with [B, G] = {[b, g]}, got {list(masks.shape)}")
    if not boxes.is_floating_point():
        raise ValueError(f"targets.boxes must be a float tensor, got {boxes.dtype}")
    if labels.dtype != torch.int64:
        raise ValueError(f"targets.labels must be int64, got {labels.dtype}")
    if valid.dtype != torch.bool:
        raise ValueError(f"targets.valid must be bool, got {valid.dtype}")
    if masks.dtype not in _MASK_DTYPES:
        raise ValueError(f"targets.masks must be uint8, bool or float, got {masks.dtype}")

    s = cfg.gt_mask_size
    canvas = None if batch is None else tuple(batch.tensors.shape[-2:])
    if batch is not None and batch.tensors.shape[0] != b:
        raise ValueError(f"targets are for {b} images but the image batch holds {batch.tensors.shape[0]}")
    if tuple(masks.shape[-2:]) != (s, s) and tuple(masks.shape[-2:]) != canvas:
        allowed = f"[{s}, {s}] (cropped to the box, cfg.gt_mask_size)"
        if canvas is not None:
            allowed += f" or {list(canvas)} (the full canvas)"
        raise ValueError(f"targets.masks must be [B, G, S, S] with S x S = {allowed}, got {list(masks.shape)}")

    if boxes.device.type != "cpu":
        return  # value checks would synchronise with the device; run them on the host copy
    bad_class = valid & ((labels < 1) | (labels >= cfg.num_classes))
    if bool(bad_class.any()):
        i, j = (int(v) for v in bad_class.nonzero()[0])
        raise ValueError(
            f"targets: image {i}, instance {j}: label {int(labels[i, j])} is out of range [1, {cfg.num_classes}) "
            f"(0 is the background; num_classes={cfg.num_classes} counts it)"
        )
    finite = torch.isfinite(boxes).all(-1)
    bad_box = valid & (~finite | (boxes[..., 2] <= boxes[..., 0]) | (boxes[..., 3] <= boxes[..., 1]))
    if bool(bad_box.any()):
        i, j = (int(v) for v in bad_box.nonzero()[0])
        box = [round(float(v), 2) for v in boxes[i, j]]
        raise ValueError(
            f"targets: image {i}, instance {j}: box {box} (x1, y1, x2, y2) must be finite with x2 > x1 and "
            f"y2 > y1 (positive width and height)"
        )


def masks_are_cropped(targets: Targets, cfg: Config, canvas: tuple[int, int]) -> bool:
    """True for masks cropped to their boxes ([B, G, S, S], S = gt_mask_size; wins when both fit),
    False for full-canvas masks ([B, G, H, W]); ValueError for any other shape."""
    size = tuple(targets.masks.shape[-2:])
    if size == (cfg.gt_mask_size, cfg.gt_mask_size):
        return True
    if size == tuple(canvas):
        return False
    raise ValueError(
        f"targets.masks must be [B, G, {cfg.gt_mask_size}, {cfg.gt_mask_size}] or full-canvas "
        f"[B, G, {canvas[0]}, {canvas[1]}], got {list(targets.masks.shape)}"
    )


# ------------------------------------------------------------------------------------------------
# Losses


def _count(mask: Tensor) -> Tensor:
    """Number of True entries as a float tensor, at least 1: a normaliser that never divides by 0."""
    return mask.sum().to(torch.float32).clamp(min=1.0)


def rpn_losses(
    objectness: Tensor,
    deltas: Tensor,
    anchors: Tensor,
    matched_boxes: Tensor,
    samples: Samples,
) -> dict[str, Tensor]:
    """torchvision's ``RegionProposalNetwork.compute_loss`` on sampled anchors.

    Args:
        objectness: [B, A] logits; deltas: [B, A, 4]; anchors: [A, 4].
        matched_boxes: [B, A, 4] ground-truth box matched to each anchor (any value where unmatched).
        samples: K sampled anchors per image.

    Both losses are normalised by the number of sampled anchors in the whole batch.
    """
    idx = samples.index
    logits = objectness.gather(1, idx).float()
    picked = deltas.gather(1, idx[..., None].expand(-1, -1, 4)).float()
    reference = anchors[idx]
    gt = matched_boxes.gather(1, idx[..., None].expand(-1, -1, 4))
    # Unmatched anchors encode garbage (log of 0, ...): zero their targets before the loss, since
    # where() after the loss would still send NaN gradients through it.
    regression = torch.where(samples.positive[..., None], encode_boxes(gt, reference, RPN_BOX_WEIGHTS), 0.0)
    count = _count(samples.valid)
    bce = F.binary_cross_entropy_with_logits(logits, samples.positive.to(logits.dtype), reduction="none")
    box = F.smooth_l1_loss(picked, regression, beta=_SMOOTH_L1_BETA, reduction="none").sum(-1)
    return {
        "loss_objectness": torch.where(samples.valid, bce, 0.0).sum() / count,
        "loss_rpn_box_reg": torch.where(samples.positive, box, 0.0).sum() / count,
    }


def fastrcnn_losses(
    class_logits: Tensor,
    deltas: Tensor,
    labels: Tensor,
    regression: Tensor,
    samples: Samples,
) -> dict[str, Tensor]:
    """torchvision's ``fastrcnn_loss`` on K sampled RoIs per image.

    Args:
        class_logits: [B, K, C]; deltas: [B, K, C, 4].
        labels: [B, K] int64 class of each sampled RoI (0 for negatives and padding).
        regression: [B, K, 4] targets, zero where not positive.
        samples: the sampled RoIs (valid, positive).

    Both losses are normalised by the number of sampled RoIs in the whole batch.
    """
    count = _count(samples.valid)
    ce = F.cross_entropy(class_logits.float().flatten(0, 1), labels.flatten(), reduction="none").view_as(labels)
    picked = deltas.gather(2, labels[:, :, None, None].expand(-1, -1, 1, 4))[:, :, 0].float()
    box = F.smooth_l1_loss(picked, regression, beta=_SMOOTH_L1_BETA, reduction="none").sum(-1)
    return {
        "loss_classifier": torch.where(samples.valid, ce, 0.0).sum() / count,
        "loss_box_reg": torch.where(samples.positive, box, 0.0).sum() / count,
    }


def mask_loss(logits: Tensor, targets: Tensor, weight: Tensor) -> Tensor:
    """torchvision's ``maskrcnn_loss``: mean BCE over the pixels of the weighted RoIs.

    Args:
        logits: [B, R, M, M] mask logits of each RoI's ground-truth class.
        targets: [B, R, M, M] float in [0, 1].
        weight: [B, R] bool, the RoIs that count (sampled positives). 0 when there are none.
    """
    # Targets of unweighted slots may be NaN (padded ground truth): zero them before the loss, as
    # NaN there would reach the gradient through the BCE's backward even behind where().
    targets = torch.where(weight[:, :, None, None], targets, 0.0)
    bce = F.binary_cross_entropy_with_logits(logits.float(), targets, reduction="none")
    pixels = logits.shape[-1] * logits.shape[-2]
    return torch.where(weight[:, :, None, None], bce, 0.0).sum() / (_count(weight) * pixels)


# ------------------------------------------------------------------------------------------------
# Mask targets


def max_sampling_grid(frame_cells: int, output_size: int, cropped: bool) -> int:
    """Static bound on the adaptive RoIAlign grid (sample points per bin side) of a mask target.

    Full-canvas masks: RoIs lie inside the canvas, so ceil(canvas side / M) bounds it. Cropped
    masks: a positive RoI overlaps its ground truth with IoU >= 0.5, so it spans at most twice the
    box along each side, i.e. 2 S cells.
    """
    extent = 2 * frame_cells if cropped else frame_cells
    return max(1, math.ceil(extent / output_size))


def _axis_weights(
    lo: Tensor, hi: Tensor, frame_lo: Tensor | None, frame_hi: Tensor | None, cells: int, size: int, max_grid: int
) -> Tensor:
    """Interpolation matrix of one axis of RoIAlign: [B, R] RoI extents -> [B, R, size, cells].

    RoIAlign with ``aligned=False``, spatial scale 1 and the adaptive grid (torchvision's mask
    target settings, ``sampling_ratio=-1``) is separable: output bin p along an axis is the mean,
    over ``grid`` sample points, of a bilinear interpolation along that axis, and the 2-D output is
    W_y @ mask @ W_x^T. The sample positions, the grid ``ceil(roi / size)`` and the kernel's border
    rules (zero beyond [-1, cells], clamp to the first cell, snap to the last) follow the kernel.

    Full-canvas masks: ``frame_lo`` is None and mask cell i sits at coordinate i (the kernel's
    convention). Cropped masks: the mask spans the frame [frame_lo, frame_hi] in ``cells - 2``
    cells plus a zero border cell each side (the object is empty outside its box); cell j was read
    at canvas coordinate frame_lo + (j + 0.5) * frame / S by the crop, so a canvas coordinate y
    maps to (y - frame_lo) * S / frame - 0.5 (+ 1 for the border). The grid counts frame cells.
    """
    roi = torch.clamp(hi - lo, min=1.0)
    bin_size = roi / size
    if frame_lo is None:
        scale, offset = None, None
        grid = torch.ceil(roi / size)
    else:
        scale = (cells - 2) / (frame_hi - frame_lo)
        offset = 1.0 - frame_lo * scale - 0.5
        grid = torch.ceil(roi * scale / size)
    grid = grid.clamp(min=1, max=max_grid)
    p = torch.arange(size, device=lo.device, dtype=lo.dtype)
    s = torch.arange(cells, device=lo.device, dtype=lo.dtype)
    start = lo[..., None] + p * bin_size[..., None]  # [B, R, size]
    out = None
    for i in range(max_grid):
        # The kernel's y = y1 + ph * bin + (iy + .5) * bin / grid, in its evaluation order.
        pos = start + ((i + 0.5) * bin_size / grid)[..., None]
        if scale is not None:
            pos = pos * scale[..., None] + offset[..., None]
        inside = (pos >= -1.0) & (pos <= cells) & (i < grid)[..., None]
        pos = pos.clamp(min=0, max=cells - 1)
        hat = torch.relu(1.0 - (pos[..., None] - s).abs())  # bilinear weights of both neighbours
        term = torch.where(inside[..., None], hat, 0.0)
        out = term if out is None else out + term
    return out / grid[..., None, None]


def mask_targets(masks: Tensor, gt_boxes: Tensor, gt_index: Tensor, rois: Tensor, size: int, cropped: bool) -> Tensor:
    """Mask targets of RoIs: torchvision's ``project_masks_on_boxes`` on padded ground truth.

    Args:
        masks: [B, G, S, S] cropped to ``gt_boxes`` (``cropped=True``), or [B, G, H, W] full canvas.
        gt_boxes: [B, G, 4] canvas coordinates (the frame of cropped masks).
        gt_index: [B, R] int64, the ground-truth slot of each RoI.
        rois: [B, R, 4] canvas coordinates.
        size: M, the side of the targets.

    Returns:
        [B, R, M, M] float32 in [0, 1]. With full-canvas masks this is RoIAlign of the mask at M x M
        with torchvision's settings (aligned=False, adaptive sampling), exactly as torchvision
        computes its targets. With cropped masks, the same sampling reads the S x S crop through the
        map from canvas to crop coordinates (see :func:`_axis_weights`).
    """
    b = masks.shape[0]
    picked = masks[torch.arange(b, device=masks.device)[:, None], gt_index].to(torch.float32)  # [B, R, h, w]
    rois = rois.detach().to(torch.float32)
    x1, y1, x2, y2 = rois.unbind(-1)
    if cropped:
        picked = F.pad(picked, (1, 1, 1, 1))
        frame = gt_boxes.to(torch.float32).gather(1, gt_index[..., None].expand(-1, -1, 4))
        fx1, fy1, fx2, fy2 = frame.unbind(-1)
    else:
        fx1 = fy1 = fx2 = fy2 = None
    cells_h, cells_w = picked.shape[-2:]
    grid_h = max_sampling_grid(cells_h - 2 if cropped else cells_h, size, cropped)
    grid_w = max_sampling_grid(cells_w - 2 if cropped else cells_w, size, cropped)
    wy = _axis_weights(y1, y2, fy1, fy2, cells_h, size, grid_h)  # [B, R, M, h]
    wx = _axis_weights(x1, x2, fx1, fx2, cells_w, size, grid_w)  # [B, R, M, w]
    # Targets are data, not activations: keep them in fp32 under autocast.
    with torch.autocast(device_type=masks.device.type, enabled=False):
        return torch.matmul(torch.matmul(wy, picked), wx.transpose(-1, -2))
