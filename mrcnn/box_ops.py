"""Box arithmetic on fixed-shape, batched tensors ([..., 4] boxes as x1, y1, x2, y2).

The decode follows torchvision's ``BoxCoder.decode_single`` operation for operation, so the
static model's boxes match torchvision's to the last bit on the same inputs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# torchvision's clamp on dw/dh before exp(): log(1000 / 16).
BBOX_XFORM_CLIP = math.log(1000.0 / 16)
# torchvision's RegionProposalNetwork box coder weights (the box head's are cfg.bbox_reg_weights).
RPN_BOX_WEIGHTS = (1.0, 1.0, 1.0, 1.0)


def decode_boxes(deltas: Tensor, boxes: Tensor, weights: tuple[float, float, float, float]) -> Tensor:
    """Apply regression ``deltas`` [..., C, 4] to reference ``boxes`` [..., 4] -> [..., C, 4]."""
    boxes = boxes.to(deltas.dtype)
    widths = boxes[..., 2] - boxes[..., 0]
    heights = boxes[..., 3] - boxes[..., 1]
    ctr_x = boxes[..., 0] + 0.5 * widths
    ctr_y = boxes[..., 1] + 0.5 * heights

    wx, wy, ww, wh = weights
    dx = deltas[..., 0] / wx
    dy = deltas[..., 1] / wy
    dw = torch.clamp(deltas[..., 2] / ww, max=BBOX_XFORM_CLIP)
    dh = torch.clamp(deltas[..., 3] / wh, max=BBOX_XFORM_CLIP)

    pred_ctr_x = dx * widths[..., None] + ctr_x[..., None]
    pred_ctr_y = dy * heights[..., None] + ctr_y[..., None]
    half_w = 0.5 * (torch.exp(dw) * widths[..., None])
    half_h = 0.5 * (torch.exp(dh) * heights[..., None])
    return torch.stack((pred_ctr_x - half_w, pred_ctr_y - half_h, pred_ctr_x + half_w, pred_ctr_y + half_h), -1)


def clip_boxes(boxes: Tensor, image_sizes: Tensor) -> Tensor:
    """Clip ``boxes`` [B, ..., 4] to per-image (height, width) ``image_sizes`` [B, 2]."""
    shape = (boxes.shape[0],) + (1,) * (boxes.dim() - 2)
    h = image_sizes[:, 0].to(boxes.dtype).reshape(shape)
    w = image_sizes[:, 1].to(boxes.dtype).reshape(shape)
    x1 = torch.minimum(boxes[..., 0].clamp(min=0), w)
    y1 = torch.minimum(boxes[..., 1].clamp(min=0), h)
    x2 = torch.minimum(boxes[..., 2].clamp(min=0), w)
    y2 = torch.minimum(boxes[..., 3].clamp(min=0), h)
    return torch.stack((x1, y1, x2, y2), -1)


def large_enough(boxes: Tensor, min_size: float) -> Tensor:
    """[..., 4] -> [...] bool: both sides at least ``min_size`` (torchvision's remove_small_boxes)."""
    return ((boxes[..., 2] - boxes[..., 0]) >= min_size) & ((boxes[..., 3] - boxes[..., 1]) >= min_size)


def box_iou(boxes1: Tensor, boxes2: Tensor) -> Tensor:
    """Pairwise IoU: [B, N, 4] x [B, M, 4] -> [B, N, M] (torchvision's ``box_iou``, batched).

    The same operations in the same order as torchvision's ``_box_inter_union``, so IoU values,
    and therefore matches and ties, agree bit for bit. Each coordinate is handled on its own rather
    than as [..., 2] pairs, which halves the largest temporaries (the matrix is [B, G, anchors]).
    """
    area1 = (boxes1[..., 2] - boxes1[..., 0]) * (boxes1[..., 3] - boxes1[..., 1])
    area2 = (boxes2[..., 2] - boxes2[..., 0]) * (boxes2[..., 3] - boxes2[..., 1])
    a, b = boxes1[:, :, None], boxes2[:, None]
    iw = (torch.minimum(a[..., 2], b[..., 2]) - torch.maximum(a[..., 0], b[..., 0])).clamp(min=0)
    ih = (torch.minimum(a[..., 3], b[..., 3]) - torch.maximum(a[..., 1], b[..., 1])).clamp(min=0)
    inter = iw * ih
    union = area1[:, :, None] + area2[:, None, :] - inter
    return inter / union


def encode_boxes(targets: Tensor, reference: Tensor, weights: tuple[float, float, float, float]) -> Tensor:
    """Regression targets of ``targets`` [..., 4] relative to ``reference`` [..., 4] -> [..., 4].

    torchvision's ``BoxCoder.encode_single`` operation for operation (the inverse of
    :func:`decode_boxes`).
    """
    wx, wy, ww, wh = weights
    ex_widths = reference[..., 2] - reference[..., 0]
    ex_heights = reference[..., 3] - reference[..., 1]
    ex_ctr_x = reference[..., 0] + 0.5 * ex_widths
    ex_ctr_y = reference[..., 1] + 0.5 * ex_heights

    gt_widths = targets[..., 2] - targets[..., 0]
    gt_heights = targets[..., 3] - targets[..., 1]
    gt_ctr_x = targets[..., 0] + 0.5 * gt_widths
    gt_ctr_y = targets[..., 1] + 0.5 * gt_heights

    dx = wx * (gt_ctr_x - ex_ctr_x) / ex_widths
    dy = wy * (gt_ctr_y - ex_ctr_y) / ex_heights
    dw = ww * torch.log(gt_widths / ex_widths)
    dh = wh * torch.log(gt_heights / ex_heights)
    return torch.stack((dx, dy, dw, dh), -1)
