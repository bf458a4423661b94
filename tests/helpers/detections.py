"""Comparing two runs' fixed-shape Detections that differ only in float rounding."""

from __future__ import annotations

import torch

from mrcnn.structures import Detections

# Box corners are pixel coordinates, the sum of a chain of float32 ops from the backbone on: a
# different op order (inductor's fused kernels, another CPU's convolution algorithm) moves a
# corner by a few ten-thousandths of a pixel. A thousandth of a pixel is far below anything
# that changes an IoU, and far above rounding.
BOX_ATOL_PX = 1e-3
# Scores and mask probabilities, in [0, 1]: the same op-order rounding moves them by about 1e-5.
PROB_ATOL = 1e-4


def assert_same_detections(a: Detections, b: Detections) -> None:
    """valid and labels equal; boxes to a thousandth of a pixel, scores and masks to 1e-4."""
    assert torch.equal(a.valid, b.valid) and torch.equal(a.labels, b.labels)
    torch.testing.assert_close(a.boxes, b.boxes, rtol=1e-5, atol=BOX_ATOL_PX)
    torch.testing.assert_close(a.scores, b.scores, rtol=0, atol=PROB_ATOL)
    torch.testing.assert_close(a.masks, b.masks, rtol=0, atol=PROB_ATOL)
