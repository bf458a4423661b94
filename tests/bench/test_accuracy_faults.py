"""The accuracy gate's recipes and injected faults (mrcnn.recipes, mrcnn_bench.gates.faults): each fault
changes exactly what it claims and is undone on exit.

The teeth study that trains under them is results/accuracy/teeth.md; no training here.
"""

from __future__ import annotations

import pytest
import torch

import mrcnn.box_ops as box_ops
import mrcnn.roi_heads as roi_heads
from mrcnn.config import get_config
from mrcnn.model import MaskRCNN
from mrcnn.recipes import RECIPES, get_recipe
from mrcnn.structures import Proposals, Targets
from mrcnn_bench.gates.faults import FAULTS, MASK_SHIFT_PIXELS, inject_fault


def test_recipes_build_their_configs():
    for name, recipe in RECIPES.items():
        cfg = recipe.config()
        assert cfg.name == recipe.preset and get_recipe(name) is recipe
        options = recipe.train_config()
        assert options.steps == recipe.train.steps and options.batch_size == recipe.train.batch_size
        assert all(step < recipe.train.steps for step in recipe.train.lr_steps)
    assert RECIPES["tiny"].train_config(world_size=2).batch_size == RECIPES["tiny"].train.batch_size // 2
    with pytest.raises(ValueError, match="does not split"):
        RECIPES["tiny"].train_config(world_size=3)


def test_box_coder_fault_changes_the_box_regression_targets():
    gt = torch.tensor([[[10.0, 12.0, 50.0, 40.0]]])
    roi = torch.tensor([[[8.0, 15.0, 47.0, 44.0]]])
    weights = (10.0, 10.0, 5.0, 5.0)
    right = roi_heads.encode_boxes(gt, roi, weights)
    with inject_fault("box_coder"):
        wrong = roi_heads.encode_boxes(gt, roi, weights)
    assert torch.allclose(wrong * torch.tensor(weights), right)  # encoded with (1, 1, 1, 1)
    assert not torch.allclose(wrong, right)
    assert torch.equal(roi_heads.encode_boxes(gt, roi, weights), right), "the patch must be undone on exit"


def test_faults_equal_their_definitions():
    """box_coder: box_ops's encoding under (1, 1, 1, 1); mask_shift: 3 px right and down, zero fill; undone after."""
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(2, 5, 2, generator=g) * 50
    gt = torch.cat([xy, xy + 10 + torch.rand(2, 5, 2, generator=g) * 40], -1)
    roi = gt + torch.randn(2, 5, 4, generator=g) * 3
    original_encode, original_targets = roi_heads.encode_boxes, roi_heads.mask_targets
    with inject_fault("box_coder"):
        faulted = roi_heads.encode_boxes(gt, roi, (10.0, 10.0, 5.0, 5.0))
    assert torch.equal(faulted, box_ops.encode_boxes(gt, roi, (1.0, 1.0, 1.0, 1.0)))
    assert roi_heads.encode_boxes is original_encode

    masks = (torch.rand(2, 3, 16, 16, generator=g) > 0.5).to(torch.uint8)
    boxes = torch.tensor([[0.0, 0.0, 32.0, 32.0], [4.0, 2.0, 30.0, 28.0], [8.0, 8.0, 24.0, 20.0]]).expand(2, 3, 4)
    index = torch.tensor([[0, 1, 2, 1], [2, 2, 0, 1]])
    rois = boxes[:, [0, 1, 2, 0]] + 1.0
    args = (masks, boxes, index, rois, 28, True)
    clean = roi_heads.mask_targets(*args)
    with inject_fault("mask_shift"):
        shifted = roi_heads.mask_targets(*args)
    expected = torch.zeros_like(clean)
    expected[..., 3:, 3:] = clean[..., :-3, :-3]
    assert MASK_SHIFT_PIXELS == 3 and torch.equal(shifted, expected) and not torch.equal(shifted, clean)
    assert roi_heads.mask_targets is original_targets and torch.equal(roi_heads.mask_targets(*args), clean)


def test_mask_shift_fault_shifts_the_mask_targets():
    masks = torch.zeros(1, 1, 16, 16, dtype=torch.uint8)
    masks[0, 0, 4:12, 4:12] = 1
    boxes = torch.tensor([[[0.0, 0.0, 32.0, 32.0]]])
    args = (masks, boxes, torch.zeros(1, 1, dtype=torch.int64), boxes.clone(), 28, True)
    right = roi_heads.mask_targets(*args)
    with inject_fault("mask_shift"):
        shifted = roi_heads.mask_targets(*args)
    s = MASK_SHIFT_PIXELS
    assert not torch.equal(shifted, right)
    assert torch.equal(shifted[..., s:, s:], right[..., :-s, :-s])
    assert shifted[..., :s, :].abs().sum() == 0 and shifted[..., :, :s].abs().sum() == 0
    assert torch.equal(roi_heads.mask_targets(*args), right)


def test_faults_change_the_training_losses_of_the_box_head():
    """Through RoIHeads.loss: box_coder changes loss_box_reg only, mask_shift loss_mask only."""
    torch.manual_seed(0)
    cfg = get_config("tiny", min_size=128, max_size=128, canvases=((128, 128),), gt_mask_size=16)
    model = MaskRCNN(cfg).train()
    g = cfg.max_gt_instances
    boxes = torch.zeros(1, g, 4)
    boxes[0, 0] = torch.tensor([20.0, 30.0, 90.0, 100.0])
    boxes[0, 1] = torch.tensor([60.0, 10.0, 120.0, 60.0])
    labels = torch.zeros(1, g, dtype=torch.int64)
    labels[0, :2] = torch.tensor([1, 3])
    masks = torch.zeros(1, g, 16, 16, dtype=torch.uint8)
    masks[0, :2, 3:13, 2:14] = 1
    valid = torch.zeros(1, g, dtype=torch.bool)
    valid[0, :2] = True
    targets = Targets(boxes, labels, masks, valid)
    # Proposals near the ground truth (IoU > 0.5 but not 1), so the regression targets are not zero.
    near = torch.cat([boxes[0, :2] + torch.tensor([3.0, -2.0, 4.0, 1.0]), boxes[0, :2] - 2.0])[None]
    proposals = Proposals(near, torch.ones(1, 4), torch.ones(1, 4, dtype=torch.bool))
    features = list(model.backbone(torch.randn(1, 3, 128, 128)).values())[:4]

    def losses(fault):
        torch.manual_seed(1)  # the same samples every call
        with torch.no_grad(), inject_fault(fault):
            return {k: float(v) for k, v in model.roi_heads.loss(features, proposals, targets, (128, 128)).items()}

    clean, box, mask = losses(None), losses("box_coder"), losses("mask_shift")
    assert box["loss_box_reg"] != pytest.approx(clean["loss_box_reg"])
    assert mask["loss_mask"] != pytest.approx(clean["loss_mask"])
    assert box["loss_mask"] == pytest.approx(clean["loss_mask"])
    assert mask["loss_box_reg"] == pytest.approx(clean["loss_box_reg"])
    assert losses(None) == clean


def test_unknown_fault_is_rejected():
    with pytest.raises(ValueError, match="unknown fault"), inject_fault("typo"):
        pass
    assert set(FAULTS) == {"box_coder", "mask_shift"}
