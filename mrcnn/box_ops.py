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
