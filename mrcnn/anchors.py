"""Anchors for a canvas: the same boxes torchvision's AnchorGenerator makes, as one tensor.

Anchors depend only on the canvas and the feature-map sizes, both fixed per bucket, so under
torch.compile and XLA they fold into constants of the graph.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.models.detection.anchor_utils import AnchorGenerator

from mrcnn.config import Config


class Anchors(torch.nn.Module):
    """Per-level cell anchors held as non-persistent buffers, so the state_dict is unchanged."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        generator = AnchorGenerator()  # only for its generate_anchors(): torchvision's rounding
        for level, size in enumerate(cfg.anchor_sizes):
            cell = generator.generate_anchors((size,), tuple(cfg.aspect_ratios))  # [A, 4]
            self.register_buffer(f"cell_{level}", cell, persistent=False)
        self.num_levels = len(cfg.anchor_sizes)

    def forward(self, canvas: tuple[int, int], feature_sizes: list[tuple[int, int]]) -> Tensor:
        """Anchors [sum_l H_l * W_l * A, 4], ordered (level, y, x, anchor) like the RPN head's outputs."""
        out = []
        for level, (h, w) in enumerate(feature_sizes):
            cell: Tensor = getattr(self, f"cell_{level}")
            stride_y, stride_x = canvas[0] // h, canvas[1] // w
            ys = torch.arange(h, dtype=torch.int32, device=cell.device) * stride_y
            xs = torch.arange(w, dtype=torch.int32, device=cell.device) * stride_x
            shift_y, shift_x = torch.meshgrid(ys, xs, indexing="ij")
            shift_x, shift_y = shift_x.reshape(-1), shift_y.reshape(-1)
            shifts = torch.stack((shift_x, shift_y, shift_x, shift_y), dim=1)
            out.append((shifts.view(-1, 1, 4) + cell.view(1, -1, 4)).reshape(-1, 4))
        return torch.cat(out, 0)
