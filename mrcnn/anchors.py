"""Anchors for a canvas: the same boxes torchvision's AnchorGenerator makes, as one tensor.

Anchors depend only on the canvas and the feature-map sizes, both fixed per bucket, so under
torch.compile and XLA they fold into constants of the graph.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.models.detection.anchor_utils import AnchorGenerator

from mrcnn.config import Config, level_stride


class Anchors(torch.nn.Module):
    """Per-level cell anchors held as non-persistent buffers, so the state_dict is unchanged."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        generator = AnchorGenerator()  # only for its generate_anchors(): torchvision's rounding
        for level, size in enumerate(cfg.anchor_sizes):
            cell = generator.generate_anchors((size,), tuple(cfg.aspect_ratios))  # [A, 4]
            self.register_buffer(f"cell_{level}", cell, persistent=False)
        self.num_levels = len(cfg.anchor_sizes)

    def forward(
        self, canvas: tuple[int, int], feature_sizes: list[tuple[int, int]], extents: Tensor | None = None
    ) -> Tensor:
        """Anchors ordered (level, y, x, anchor) like the RPN head's outputs.

        Without ``extents``: [sum_l H_l * W_l * A, 4] for the canvas. With ``extents`` [B, 2]
        (torchvision's padded image sizes): [B, sum_l H_l * W_l * A, 4], each image's anchors at
        torchvision's strides for that size, extent // ceil(extent / stride). They equal the canvas
        strides except at the coarsest level when extent / 32 is odd (e.g. 352 // 6 = 58, not 64).
        """
        out = []
        for level, (h, w) in enumerate(feature_sizes):
            cell: Tensor = getattr(self, f"cell_{level}")
            ys = torch.arange(h, dtype=torch.int64, device=cell.device)[None, :]
            xs = torch.arange(w, dtype=torch.int64, device=cell.device)[None, :]
            if extents is None:  # Python strides keep the canvas's anchors graph constants
                ys, xs = ys * (canvas[0] // h), xs * (canvas[1] // w)  # [1, h], [1, w]
            else:
                power = level_stride(canvas[0], h)
                stride = extents // ((extents + power - 1) // power)  # [B, 2]
                ys, xs = ys * stride[:, :1], xs * stride[:, 1:]  # [B, h], [B, w]
            b = ys.shape[0]
            shift_y = ys[:, :, None].expand(-1, h, w).reshape(b, -1)
            shift_x = xs[:, None, :].expand(-1, h, w).reshape(b, -1)
            shifts = torch.stack((shift_x, shift_y, shift_x, shift_y), dim=2)  # [B, h*w, 4]
            out.append((shifts[:, :, None] + cell[None, None]).reshape(b, -1, 4))
        anchors = torch.cat(out, 1)
        return anchors[0] if extents is None else anchors

    def inside(self, canvas: tuple[int, int], feature_sizes: list[tuple[int, int]], extents: Tensor) -> Tensor:
        """[B, sum_l H_l * W_l * A] bool: the anchor lies on torchvision's feature map for the extent."""
        out = []
        a = self.cell_0.shape[0]
        for h, w in feature_sizes:
            power = level_stride(canvas[0], h)
            limit = (extents + power - 1) // power  # [B, 2]
            rows = torch.arange(h, device=extents.device)[None, :] < limit[:, :1]
            cols = torch.arange(w, device=extents.device)[None, :] < limit[:, 1:]
            cells = rows[:, :, None] & cols[:, None, :]  # [B, h, w]
            out.append(cells[..., None].expand(-1, h, w, a).reshape(len(extents), -1))
        return torch.cat(out, 1)
