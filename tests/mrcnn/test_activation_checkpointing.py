"""The memory lever (``Config.activation_checkpointing``): the backward pass recomputes the trainable
backbone blocks' and the FPN's activations instead of keeping them.

It must change no loss and no gradient, keep fewer bytes for the backward pass (counted exactly, as
the tensors autograd saves), compile whole, and leave inference alone. Its peak memory and step
time are measured in results/levers/activation_checkpointing.
"""

from __future__ import annotations

import pytest
import torch

from mrcnn import backbone as backbone_module
from mrcnn.model import MaskRCNN
from mrcnn.transform import to_image_batch
from mrcnn.weights import textured_images
from tests.helpers.training import SMALL_SIZES, random_targets, small_cfg

COUNTS = [3, 1]  # ground-truth objects per image


def _step(cfg, weights):
    """One training forward and backward -> (losses, gradients, bytes autograd saved for the backward)."""
    model = MaskRCNN(cfg).train()
    model.load_state_dict(weights)
    batch = to_image_batch(textured_images(SMALL_SIZES, seed=2), cfg)
    saved = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    torch.manual_seed(0)  # the same sampling keys in both runs
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        losses = model(batch, random_targets(cfg, batch, COUNTS, seed=0))
    sum(losses.values()).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in losses.items()}, grads, sum(saved)


def test_recomputing_changes_no_loss_or_gradient_and_keeps_fewer_bytes(tiny_cfg, tiny_weights):
    cfg = small_cfg(tiny_cfg)
    losses, grads, kept = _step(cfg, tiny_weights)
    losses_r, grads_r, kept_r = _step(cfg.replace(activation_checkpointing=True), tiny_weights)
    assert losses.keys() == losses_r.keys() and grads.keys() == grads_r.keys()
    for name in losses:
        torch.testing.assert_close(losses_r[name], losses[name], rtol=1e-5, atol=1e-6)
    assert any(n.startswith("backbone.body.layer4") for n in grads)  # the recomputed blocks do train
    for name in grads:
        torch.testing.assert_close(grads_r[name], grads[name], rtol=1e-4, atol=1e-5, msg=name)
    # Inside a recomputed region only its inputs are kept; the rest is the heads' and the losses'.
    assert kept_r < 0.5 * kept, (kept_r, kept)


def test_recomputing_compiles_whole_and_leaves_inference_alone(tiny_cfg, tiny_weights, monkeypatch):
    cfg = small_cfg(tiny_cfg, activation_checkpointing=True, fold_batch_norm=False)
    model = MaskRCNN(cfg).train()
    model.load_state_dict(tiny_weights)
    batch = to_image_batch(textured_images(SMALL_SIZES, seed=2), cfg)
    images, extents = batch.tensors, backbone_module.padded_extents(batch.image_sizes, cfg.size_divisible)
    eager = model.backbone(images, extents)
    torch._dynamo.reset()
    compiled = torch.compile(model.backbone, fullgraph=True, backend="aot_eager")(images, extents)
    for key in eager:
        torch.testing.assert_close(compiled[key], eager[key])
    sum(v.sum() for v in compiled.values()).backward()
    assert model.backbone.body.layer4[0].conv1.weight.grad is not None

    def refuse(*args, **kwargs):
        raise AssertionError("inference recomputed nothing")

    monkeypatch.setattr(backbone_module, "checkpoint", refuse)
    with torch.no_grad():
        model.backbone(images, extents)
    model.eval()
    model.backbone(images, extents)
    with pytest.raises(AssertionError, match="recomputed nothing"):  # and the check itself can fail
        model.train().backbone(images, extents)
