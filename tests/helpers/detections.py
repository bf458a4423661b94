"""Comparing two runs' fixed-shape Detections that differ only in float rounding."""

from __future__ import annotations

import torch

from mrcnn.structures import Detections


def assert_same_detections(a: Detections, b: Detections) -> None:
    """valid and labels equal; boxes to 1e-5 of their value (pixels), scores and masks to 1e-4."""
    assert torch.equal(a.valid, b.valid) and torch.equal(a.labels, b.labels)
    torch.testing.assert_close(a.boxes, b.boxes, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(a.scores, b.scores, rtol=0, atol=1e-4)
    torch.testing.assert_close(a.masks, b.masks, rtol=0, atol=1e-4)
