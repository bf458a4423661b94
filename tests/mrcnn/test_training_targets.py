"""What the training forward does with its targets: no ground truth, padded slots, an empty batch
slot, the mask RoIs per image, eval mode, and the errors bad targets raise.
"""

from __future__ import annotations

import pytest
import torch

from mrcnn.losses import check_targets
from mrcnn.model import MaskRCNN
from mrcnn.structures import Targets
from mrcnn.transform import to_image_batch
from mrcnn.weights import textured_images
from tests.helpers.training import LOSS_NAMES, SMALL_SIZES, random_targets, small_cfg


def test_no_ground_truth_gives_zero_box_and_mask_losses(tiny_cfg):
    cfg = small_cfg(tiny_cfg)
    model = MaskRCNN(cfg).train()
    batch = to_image_batch(textured_images(SMALL_SIZES, seed=0), cfg)
    losses = model(batch, random_targets(cfg, batch, [0, 0], seed=0))
    sum(losses.values()).backward()
    losses = {k: v.detach() for k, v in losses.items()}
    assert set(losses) == LOSS_NAMES and all(v.dim() == 0 for v in losses.values())
    assert all(torch.isfinite(v) for v in losses.values())
    assert float(losses["loss_rpn_box_reg"]) == 0 and float(losses["loss_box_reg"]) == 0
    assert float(losses["loss_mask"]) == 0
    assert float(losses["loss_objectness"]) > 0 and float(losses["loss_classifier"]) > 0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_padded_ground_truth_slots_never_reach_the_losses(tiny_cfg):
    """Whatever padded slots hold (NaN, inf, inverted boxes), losses and gradients stay finite."""
    cfg = small_cfg(tiny_cfg)
    model = MaskRCNN(cfg).train()
    batch = to_image_batch(textured_images(SMALL_SIZES, seed=0), cfg)
    targets = random_targets(cfg, batch, [2, 0], seed=0)
    boxes = targets.boxes.clone()
    boxes[0, 3] = float("nan")
    boxes[1, :2] = torch.tensor([5.0, 5.0, 1.0, float("inf")])
    losses = model(batch, targets._replace(boxes=boxes))
    sum(losses.values()).backward()
    assert all(torch.isfinite(v.detach()) for v in losses.values())
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_padding_slot_of_an_incomplete_batch_is_ignored(tiny_cfg):
    """A batch padded with an empty slot gives the losses of the real images alone."""
    cfg = small_cfg(tiny_cfg, rpn_batch_size_per_image=1 << 16, box_batch_size_per_image=1024)
    model = MaskRCNN(cfg).train()
    images = textured_images(SMALL_SIZES, seed=1)
    batch = to_image_batch(images, cfg)
    targets = random_targets(cfg, batch, [3, 2], seed=1)
    padded_batch = to_image_batch(images, cfg, batch_size=3)
    padded_targets = Targets(*(torch.cat([t, torch.zeros_like(t[:1])]) for t in targets))
    with torch.no_grad():
        alone, padded = model(batch, targets), model(padded_batch, padded_targets)
    for name in LOSS_NAMES:
        assert torch.allclose(alone[name], padded[name], rtol=1e-5, atol=1e-7), name


def test_mask_rois_per_image_trains_the_mask_head_on_a_prefix_of_the_positives(tiny_cfg):
    """The knob shortens the mask branch to the first k of the same (randomly ordered) positive slots."""
    images = textured_images(SMALL_SIZES, seed=2)
    torch.manual_seed(0)
    weights = MaskRCNN(small_cfg(tiny_cfg)).state_dict()

    def mask_head_input(**overrides) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = small_cfg(tiny_cfg, **overrides)
        model = MaskRCNN(cfg).train()
        model.load_state_dict(weights)
        batch = to_image_batch(images, cfg)
        seen = []
        model.roi_heads.mask_head.register_forward_hook(lambda _m, args, _out: seen.append(args[0]))
        torch.manual_seed(0)  # the same sampling keys in every run
        with torch.no_grad():
            losses = model(batch, random_targets(cfg, batch, [4, 3], seed=2))
        return seen[0].reshape(2, -1, *seen[0].shape[1:]), losses["loss_mask"]

    full, full_loss = mask_head_input(mask_train_buckets=())  # every image's Q slots, not packed
    quota = small_cfg(tiny_cfg).box_batch_size_per_image // 4  # box_positive_fraction 0.25
    assert full.shape[1] == quota
    same, same_loss = mask_head_input(mask_rois_per_image=quota)
    assert torch.equal(same, full) and torch.equal(same_loss, full_loss)
    short, short_loss = mask_head_input(mask_rois_per_image=2)
    assert short.shape[1] == 2 and torch.equal(short, full[:, :2])
    assert torch.isfinite(short_loss) and float(short_loss) > 0
    with pytest.raises(ValueError, match="mask_rois_per_image"):
        small_cfg(tiny_cfg, mask_rois_per_image=-1)


def test_eval_mode_ignores_targets_and_training_needs_them(tiny_cfg):
    cfg = small_cfg(tiny_cfg)
    model = MaskRCNN(cfg)
    batch = to_image_batch(textured_images(SMALL_SIZES, seed=0), cfg)
    with pytest.raises(ValueError, match="targets are required"):
        model.train()(batch)
    with torch.no_grad():
        det = model.eval()(batch, random_targets(cfg, batch, [1, 1], seed=0))
    assert det.boxes.shape == (2, cfg.box_detections_per_img, 4)


def test_bad_targets_raise_clear_errors(tiny_cfg):
    cfg = small_cfg(tiny_cfg)
    model = MaskRCNN(cfg).train()
    batch = to_image_batch(textured_images(SMALL_SIZES, seed=0), cfg)
    good = random_targets(cfg, batch, [2, 1], seed=0)
    check_targets(good, cfg, batch)

    flipped = good.boxes.clone()
    flipped[0, 1] = torch.tensor([50.0, 10.0, 20.0, 40.0])
    label_zero, label_high = good.labels.clone(), good.labels.clone()
    label_zero[1, 0], label_high[0, 0] = 0, cfg.num_classes
    cases = [
        (good._replace(boxes=flipped), r"image 0, instance 1: box \[50.0, 10.0, 20.0, 40.0\].*x2 > x1"),
        (good._replace(labels=label_zero), r"image 1, instance 0: label 0 is out of range \[1, 7\)"),
        (good._replace(labels=label_high), r"image 0, instance 0: label 7 is out of range"),
        (good._replace(masks=good.masks[..., :8, :8]), r"targets.masks must be \[B, G, S, S\]"),
        (Targets(*(t[:1] for t in good)), "targets are for 1 images but the image batch holds 2"),
        (good._replace(labels=good.labels.float()), "targets.labels must be int64"),
        (good._replace(valid=good.valid[:, :2]), r"targets.labels and targets.valid must be \[B, G\]"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            check_targets(bad, cfg, batch)
        with pytest.raises(ValueError, match=message):
            model(batch, bad)
    # Padded slots may hold anything: only valid instances are checked.
    padding = good.boxes.clone()
    padding[1, 3] = torch.tensor([5.0, 5.0, 1.0, float("nan")])
    check_targets(good._replace(boxes=padding), cfg, batch)
