"""Training forward against torchvision's: losses and head gradients from padded targets.

Two images of different sizes under a config whose samplers take every candidate (the
``parity_setup`` fixture), so both models train on the same anchors and RoIs: every loss within
1e-4 of torchvision's and every head gradient within 1e-4 of its largest entry, with either op
path, with mask-RoI buckets, and with an image that holds no ground truth.
"""

from __future__ import annotations

import pytest
import torch

from mrcnn.model import MaskRCNN
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights
from tests.helpers.training import (
    LOSS_NAMES,
    assert_parity,
    crop_masks,
    pad_targets,
    static_losses,
    torchvision_losses,
)


@pytest.fixture(scope="module")
def parity_reference(parity_setup, tiny_weights):
    cfg, images, per_image = parity_setup
    return torchvision_losses(cfg, tiny_weights, images, per_image)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["torchvision", "tensor"])
def test_loss_parity_with_torchvision(parity_setup, parity_reference, tiny_weights, impl):
    """Two images of different sizes, full-canvas masks: every loss and head gradient within 1e-4."""
    cfg, images, per_image = parity_setup
    ref_losses, ref_grads = parity_reference
    assert all(float(v) > 0 for v in ref_losses.values())
    canvas = to_image_batch(images, cfg).tensors.shape[-2:]
    targets = pad_targets(per_image, 8, tuple(canvas))
    losses, grads = static_losses(cfg.replace(ops_impl=impl), tiny_weights, images, targets)
    assert_parity(losses, grads, ref_losses, ref_grads, exact_kernels=impl == "torchvision")

    # The cropped masks the data pipeline produces change only the mask loss, and only a little.
    cropped = targets._replace(
        masks=pad_targets(
            [{**t, "masks": crop_masks(t["masks"], t["boxes"], cfg.gt_mask_size)} for t in per_image],
            8,
            cfg.gt_mask_size,
        ).masks
    )
    with torch.no_grad():
        model = load_torchvision_weights(MaskRCNN(cfg.replace(ops_impl=impl)), tiny_weights).train()
        approx = model(to_image_batch(images, cfg), cropped)
    for name in LOSS_NAMES - {"loss_mask"}:
        assert torch.allclose(approx[name], ref_losses[name], rtol=1e-4), name
    assert abs(float(approx["loss_mask"] / ref_losses["loss_mask"]) - 1) < 0.02


@pytest.mark.slow
def test_loss_parity_with_mask_train_buckets(parity_setup, parity_reference, tiny_weights):
    """Buckets on (``mask_train_buckets``): the mask head trains on fewer slots than the positive
    quota and every loss and head gradient is still torchvision's within 1e-4. Both samplers take
    every candidate here, so both models train on the same RoIs."""
    cfg, images, per_image = parity_setup
    cfg = cfg.replace(mask_train_buckets=(8, 16, 32, 64))
    canvas = to_image_batch(images, cfg).tensors.shape[-2:]
    model = load_torchvision_weights(MaskRCNN(cfg), tiny_weights).train()
    seen = []
    model.roi_heads.mask_head.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[0]))
    losses = model(to_image_batch(images, cfg), pad_targets(per_image, 8, tuple(canvas)))
    sum(losses.values()).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert seen and seen[0] // len(images) < cfg.mask_positive_quota, (seen, cfg.mask_positive_quota)
    assert_parity({k: v.detach() for k, v in losses.items()}, grads, *parity_reference)


@pytest.mark.slow
def test_loss_parity_with_an_empty_image(parity_setup, tiny_weights):
    """An image without ground truth is ordinary input: all background, as in torchvision."""
    cfg, images, per_image = parity_setup
    per_image = [per_image[0], {k: v[:0] for k, v in per_image[1].items()}]
    ref_losses, ref_grads = torchvision_losses(cfg, tiny_weights, images, per_image)
    canvas = to_image_batch(images, cfg).tensors.shape[-2:]
    losses, grads = static_losses(cfg, tiny_weights, images, pad_targets(per_image, 8, tuple(canvas)))
    assert_parity(losses, grads, ref_losses, ref_grads)
