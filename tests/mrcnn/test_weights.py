"""torchvision checkpoints load strictly; mismatches give a clear error; the calibration shortcut is exact."""

from __future__ import annotations

import pytest
import torch
from torchvision.models.detection import maskrcnn_resnet50_fpn

from mrcnn.config import get_config
from mrcnn.model import MaskRCNN
from mrcnn.reference import torchvision_model
from mrcnn.weights import calibrate, load_torchvision_weights, textured_images


def test_torchvision_maskrcnn_resnet50_fpn_loads_strictly(tmp_path):
    tv = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None)
    model = MaskRCNN("coco_r50_fpn")
    # Untrained torchvision models use BatchNorm2d, whose step counters FrozenBatchNorm2d drops.
    tv_keys = {k for k in tv.state_dict() if not k.endswith("num_batches_tracked")}
    assert set(model.state_dict()) == tv_keys
    load_torchvision_weights(model, tv.state_dict())
    for key in tv_keys:
        assert torch.equal(model.state_dict()[key], tv.state_dict()[key]), key
    # From a file, and from a reference-script checkpoint that nests the weights under "model".
    torch.save({"model": tv.state_dict(), "epoch": 25}, tmp_path / "ckpt.pth")
    fresh = MaskRCNN("coco_r50_fpn")
    want, before = tv.state_dict(), fresh.state_dict()
    # Both models are randomly initialised, so the weights differ before the load: equality after
    # it shows the file's values arrived, not two equal initialisations.
    differed = [k for k in tv_keys if not torch.equal(before[k], want[k])]
    assert any(k.endswith(".weight") for k in differed), "the fresh model already holds the checkpoint's weights"
    loaded = load_torchvision_weights(fresh, tmp_path / "ckpt.pth")
    assert loaded is fresh
    got = loaded.state_dict()
    assert set(got) == tv_keys
    for key in tv_keys:
        assert got[key].shape == want[key].shape and torch.equal(got[key], want[key]), key


def test_reference_builder_matches_coco_preset():
    ours = {k: v.shape for k, v in torchvision_model("coco_r50_fpn").state_dict().items()}
    tv = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None).state_dict()
    tv = {k: v.shape for k, v in tv.items() if not k.endswith("num_batches_tracked")}
    assert ours == tv


def test_mismatched_checkpoint_names_the_keys(tmp_path):
    tiny = MaskRCNN(get_config("tiny"))
    with pytest.raises(ValueError, match=r"missing .*unexpected|other shapes"):
        load_torchvision_weights(tiny, maskrcnn_resnet50_fpn(weights=None, weights_backbone=None).state_dict())
    with pytest.raises(ValueError, match="weights file not found"):
        load_torchvision_weights(tiny, tmp_path / "nope.pth")


def test_calibration_shortcut_gives_the_weights_of_whole_passes(tiny_cfg):
    """Replaying the backbone and ending each pass at its layer's module changes no weight, bit for bit."""
    images = textured_images(((240, 320), (300, 250)), seed=4)
    states = []
    for shortcut in (True, False):
        torch.manual_seed(1)
        model = torchvision_model(tiny_cfg).eval()
        calibrate(model, images, shortcut=shortcut)
        states.append(model.state_dict())
    fast, whole = states
    assert fast.keys() == whole.keys()
    assert [k for k in fast if not torch.equal(fast[k], whole[k])] == []
    # and the calibration did something: the heads' last layers differ from a fresh model's
    torch.manual_seed(1)
    fresh = torchvision_model(tiny_cfg).state_dict()
    assert not torch.equal(fresh["rpn.head.cls_logits.weight"], fast["rpn.head.cls_logits.weight"])
    assert not torch.equal(fresh["roi_heads.mask_predictor.mask_fcn_logits.weight"],
                           fast["roi_heads.mask_predictor.mask_fcn_logits.weight"])
