"""Host transform: torchvision's resize to the pixel, canvas buckets, and clear errors on bad input."""

from __future__ import annotations

import pytest
import torch
from torchvision.models.detection.transform import GeneralizedRCNNTransform

from mrcnn.config import get_config
from mrcnn.exits import UsageError
from mrcnn.model import MaskRCNN
from mrcnn.transform import group_by_canvas, resized_size, to_image_batch


@pytest.mark.parametrize("size", [(240, 320), (400, 300), (200, 500), (333, 333), (641, 201)])
def test_resize_matches_torchvision(tiny_cfg, size):
    cfg = tiny_cfg
    image = torch.rand(3, *size, generator=torch.Generator().manual_seed(0))
    tv = GeneralizedRCNNTransform(cfg.min_size, cfg.max_size, list(cfg.image_mean), list(cfg.image_std)).eval()
    tv_batch, _ = tv([image])
    batch = to_image_batch([image], cfg)
    h, w = tv_batch.image_sizes[0]
    assert tuple(batch.image_sizes[0].tolist()) == (h, w) == resized_size(*size, cfg)
    assert torch.equal(batch.tensors[0, :, :h, :w], tv_batch.tensors[0, :, :h, :w])
    assert batch.tensors[0, :, h:].abs().sum() == 0 and batch.tensors[0, :, :, w:].abs().sum() == 0
    assert tuple(batch.tensors.shape[-2:]) in cfg.canvases
    assert tuple(batch.original_sizes[0].tolist()) == size


def test_uint8_equals_float(tiny_cfg):
    image = torch.randint(0, 256, (3, 200, 300), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    a = to_image_batch([image], tiny_cfg).tensors
    b = to_image_batch([image.float() / 255], tiny_cfg).tensors
    assert torch.allclose(a, b)


def test_buckets_and_padding_slots(tiny_cfg):
    images = [torch.rand(3, 240, 320), torch.rand(3, 400, 300), torch.rand(3, 250, 250)]
    groups = group_by_canvas(images, tiny_cfg)
    assert groups == {(320, 448): [0], (448, 320): [1], (320, 320): [2]}
    batch = to_image_batch(images[:1], tiny_cfg, batch_size=4)
    assert batch.tensors.shape[0] == 4 and batch.valid.tolist() == [True, False, False, False]


@pytest.mark.parametrize(
    ("images", "message"),
    [
        ([], "empty list"),
        ([torch.rand(1, 50, 50)], "3 channels"),
        ([torch.rand(4, 50, 50)], "3 channels"),
        ([torch.rand(50, 50)], r"shape \[3, H, W\]"),
        ([torch.zeros(3, 50, 50, dtype=torch.int32)], "unsupported dtype"),
        ([torch.zeros(3, 50, 50, dtype=torch.bool)], "unsupported dtype"),
        ([torch.full((3, 50, 50), float("nan"))], "NaN or inf"),
        ([torch.rand(3, 50, 50), torch.full((3, 40, 40), float("inf"))], "image 1: contains NaN or inf"),
        ([torch.zeros(3, 0, 50)], "zero-size"),
        (["not an image"], "torch.Tensor"),
        (torch.rand(1, 3, 50, 50), "list"),
    ],
)
def test_bad_input_raises_clear_value_error(tiny_cfg, images, message):
    model = MaskRCNN(tiny_cfg).eval()
    with pytest.raises(ValueError, match=message):
        model.predict(images)


def test_canvas_too_small_for_config():
    cfg = get_config("tiny", canvases=((256, 256),))
    with pytest.raises(ValueError, match="no canvas of config 'tiny' holds"):
        to_image_batch([torch.rand(3, 240, 320)], cfg)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"canvases": ((320, 330),)}, "divisible by 32"),
        ({"canvases": ()}, "at least one"),
        ({"backbone_depth": 42}, "backbone_depth"),
        ({"ops_impl": "cuda"}, "ops_impl"),
        ({"box_pre_nms_top_n": 10}, "box_pre_nms_top_n"),
        ({"no_such_field": 1}, "unknown config field"),
        # Values of the wrong kind or range name their field, never fail further in (a modulo by
        # zero, a str compared with an int, a canvas no allocation can hold).
        ({"size_divisible": 0}, "size_divisible must be a positive integer"),
        ({"num_classes": "abc"}, "num_classes must be an integer, got 'abc'"),
        ({"num_classes": True}, "num_classes must be an integer"),
        ({"min_size": 2.5}, "min_size must be an integer"),
        ({"canvases": ((100000, 100000),)}, "side above 16384"),
        ({"canvases": ((320.5, 320),)}, "canvases must be"),
        ({"image_mean": ("a", 0.5, 0.5)}, "image_mean must be a tuple of numbers"),
        ({"rpn_nms_thresh": 1.5}, r"rpn_nms_thresh must be in \[0, 1\]"),
        ({"box_score_thresh": float("nan")}, "box_score_thresh must be a finite number"),
        ({"mask_padding": "yes"}, "mask_padding must be True or False"),
    ],
)
def test_bad_config_raises(overrides, message):
    with pytest.raises(UsageError, match=message):
        get_config("tiny", **overrides)


def test_lists_from_the_command_line_are_taken_as_tuples():
    cfg = get_config("tiny", canvases=[[320, 320], [320, 416]], anchor_sizes=[16, 32, 64, 128, 256])
    assert cfg.canvases == ((320, 320), (320, 416)) and cfg.anchor_sizes == (16, 32, 64, 128, 256)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset"):
        get_config("resnet9000")
