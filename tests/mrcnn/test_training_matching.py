"""The static matcher, the balanced sampler and mask targets against torchvision's.

The matcher equals torchvision's Matcher (ties and padding slots included), the sampler gives its
per-image counts with positives first, and mask targets equal torchvision's RoIAlign of full masks
(and come close from the cropped S x S masks the data pipeline stores).
"""

from __future__ import annotations

import pytest
import torch
from torchvision.models.detection._utils import Matcher
from torchvision.ops import box_iou as tv_box_iou
from torchvision.ops import roi_align

from mrcnn.box_ops import box_iou
from mrcnn.losses import mask_targets
from mrcnn.matching import match, sample_balanced
from tests.helpers.training import crop_masks, shape_objects


@pytest.mark.parametrize(("high", "low", "allow_low"), [(0.7, 0.3, True), (0.5, 0.5, False), (0.4, 0.1, True)])
def test_matcher_equals_torchvision(high, low, allow_low):
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(300, 2, generator=g) * 200
    candidates = torch.cat([xy, xy + 5 + torch.rand(300, 2, generator=g) * 60], 1)
    candidates = torch.cat([candidates, candidates[:20]])  # exact ties between candidates
    gt = torch.cat([xy[:6] + 3, xy[:6] + 40], 1)
    expected = Matcher(high, low, allow_low)(tv_box_iou(gt, candidates))
    padded = torch.cat([gt, torch.zeros(3, 4)])[None]  # 3 padding slots (zero boxes)
    valid = torch.tensor([[True] * 6 + [False] * 3])
    assert torch.equal(box_iou(gt[None], candidates[None])[0], tv_box_iou(gt, candidates))
    assert torch.equal(match(box_iou(padded, candidates[None]), valid, high, low, allow_low)[0], expected)
    # No valid ground truth: every candidate is background (torchvision's empty-image case).
    none = match(box_iou(padded, candidates[None]), torch.zeros_like(valid), high, low, allow_low)
    assert (none == -1).all()


def test_sampler_gives_torchvision_counts():
    labels = torch.stack(
        [
            torch.tensor([1] * 10 + [0] * 30 + [-1] * 60),  # few positives
            torch.tensor([2] * 80 + [0] * 5 + [-1] * 15),  # positives over quota, few negatives
            torch.tensor([0] * 100),  # background only
            torch.tensor([-1] * 100),  # nothing to sample (padding image)
        ]
    )
    batch_size, fraction = 64, 0.25
    first = None
    for _ in range(3):
        s = sample_balanced(labels, batch_size, fraction)
        assert s.index.shape == (4, 64)
        for i, row in enumerate(labels):
            num_pos = min(int((row > 0).sum()), int(batch_size * fraction))
            num_neg = min(int((row == 0).sum()), batch_size - num_pos)
            assert int(s.positive[i].sum()) == num_pos and int(s.valid[i].sum()) == num_pos + num_neg
            picked = row[s.index[i]]
            assert (picked[s.positive[i]] > 0).all() and (picked[s.valid[i] & ~s.positive[i]] == 0).all()
            assert s.positive[i, :num_pos].all(), "sampled positives must come first"
            assert len(set(s.index[i][s.valid[i]].tolist())) == num_pos + num_neg
        if first is None:
            first = s.index[1, :16].sort().values
    assert not torch.equal(first, s.index[1, :16].sort().values), "positives over quota must be drawn at random"


def test_mask_targets_full_canvas_equal_torchvision_roi_align():
    masks, boxes = shape_objects(96, 128, 5, seed=0)
    g = torch.Generator().manual_seed(1)
    xy = torch.rand(60, 2, generator=g) * torch.tensor([100.0, 70.0])
    far = torch.minimum(xy + 0.5 + torch.rand(60, 2, generator=g) * 60, torch.tensor([128.0, 96.0]))
    rois = torch.cat([xy, far], 1)
    gt_index = torch.randint(0, 5, (60,), generator=g)
    ours = mask_targets(masks[None], boxes[None], gt_index[None], rois[None], 28, cropped=False)[0]
    expected = roi_align(masks[:, None].float(), torch.cat([gt_index[:, None].float(), rois], 1), (28, 28), 1.0)[:, 0]
    assert (ours - expected).abs().max() < 1e-5


def test_mask_targets_from_cropped_masks_are_close():
    """Cropped S x S masks (the static pipeline's format) against torchvision's full-mask targets."""
    masks, boxes = shape_objects(320, 448, 20, seed=2)
    g = torch.Generator().manual_seed(3)
    wh = (boxes[:, 2:] - boxes[:, :2]).repeat(1, 2)
    rois = (boxes + wh * (torch.rand(20, 4, generator=g) - 0.5) * 0.3).clamp(min=0)
    assert (box_iou(boxes[None], rois[None])[0].diagonal() >= 0.5).all()
    index = torch.arange(20)[None]
    full = mask_targets(masks[None], boxes[None], index, rois[None], 28, cropped=False)
    for size, tolerance in ((56, 0.02), (112, 0.012)):
        cropped = mask_targets(crop_masks(masks, boxes, size)[None], boxes[None], index, rois[None], 28, cropped=True)
        assert float((cropped - full).abs().mean()) < tolerance, size
