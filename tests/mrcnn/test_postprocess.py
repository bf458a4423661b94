"""The host-side paste: torchvision's values to the bit, on every box shape the model can emit."""

from __future__ import annotations

import pytest
import torch
from torchvision.models.detection.roi_heads import paste_masks_in_image

from mrcnn.postprocess import paste_masks


def _boxes(n: int, height: int, width: int, gen: torch.Generator) -> torch.Tensor:
    """[n, 4] boxes clipped to the image, as the model's are: mostly small, some a pixel wide or
    less, some the whole image, some on its last row or column."""
    size = torch.tensor([width, height], dtype=torch.float32)
    xy = torch.rand(n, 2, generator=gen) * (size + 20) - 10
    wh = torch.rand(n, 2, generator=gen) ** 3 * size * 1.2 + 0.05
    boxes = torch.cat([xy, xy + wh], 1)
    boxes[:, 0::2] = boxes[:, 0::2].clamp(0, width)
    boxes[:, 1::2] = boxes[:, 1::2].clamp(0, height)
    boxes[0] = torch.tensor([0.0, 0.0, width, height])
    boxes[1] = torch.tensor([width - 0.4, height - 0.4, width, height])
    boxes[2] = torch.tensor([2.5, 1.5, 2.5, 1.5])  # empty: x1 == x2
    return boxes


@pytest.mark.parametrize("height,width", [(61, 83), (480, 640), (1, 1), (5, 300), (300, 5)])
def test_paste_equals_torchvision(height, width):
    gen = torch.Generator().manual_seed(height * 1000 + width)
    masks = torch.rand(60, 28, 28, generator=gen)
    boxes = _boxes(60, height, width, gen)
    expected = paste_masks_in_image(masks[:, None], boxes, (height, width))
    got = paste_masks(masks, boxes, (height, width))
    assert got.shape == expected.shape == (60, 1, height, width)
    assert got.dtype == expected.dtype
    assert torch.equal(got, expected)


def test_paste_of_no_detections():
    assert paste_masks(torch.zeros(0, 28, 28), torch.zeros(0, 4), (7, 9)).shape == (0, 1, 7, 9)
