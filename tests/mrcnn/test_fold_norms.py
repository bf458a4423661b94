"""``Config.fold_batch_norm``: the ResNet's frozen norms folded into its convolutions.

A folded norm is the same function up to float rounding, so outputs are compared with
``fold_batch_norm=False``'s (same weights, same input): valid and labels exactly, boxes, scores,
masks, losses and gradients to rounding. The fold is made at every call, so new weights count.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn

from mrcnn.backbone import conv_norm, fold_norms_on
from mrcnn.config import get_config
from mrcnn.model import MaskRCNN
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, synthetic_weights, textured_images
from tests.helpers.detections import assert_same_detections
from tests.helpers.training import random_targets, small_cfg

SIZES = ((240, 320), (230, 300))  # one fills the tiny canvas's extent, one is masked


def _static(cfg, weights, **overrides):
    return load_torchvision_weights(MaskRCNN(cfg.replace(**overrides)).eval(), weights)


def _norm_calls(model: nn.Module) -> list[str]:
    calls: list[str] = []
    for name, module in model.backbone.body.named_modules():
        if type(module).__name__ == "FrozenBatchNorm2d":
            module.register_forward_hook(lambda *_args, name=name: calls.append(name))
    return calls


@pytest.mark.parametrize("layout", [False, "auto"])
def test_folded_detections_equal_unfolded(tiny_cfg, tiny_weights, layout):
    """One image filling its extent and a batch of two extents (masked): the same detections."""
    for images in (textured_images(SIZES[:1], seed=2), textured_images(SIZES, seed=2)):
        batch = to_image_batch(images, tiny_cfg)
        plain = _static(tiny_cfg, tiny_weights, fold_batch_norm=False, channels_last=layout)
        folded = _static(tiny_cfg, tiny_weights, fold_batch_norm=True, channels_last=layout)
        plain_norms, folded_norms = _norm_calls(plain), _norm_calls(folded)
        with torch.no_grad():
            expected, got = plain(batch), folded(batch)
        assert int(expected.valid.sum()) > 50  # the weights detect things: the comparison is not vacuous
        assert_same_detections(got, expected)
        norms = sum(type(m).__name__ == "FrozenBatchNorm2d" for m in plain.backbone.body.modules())
        assert len(plain_norms) == norms > 0 and folded_norms == []  # every norm runs, or none


def test_conv_norm_folds_a_conv_with_bias_and_passes_gradients():
    """conv_norm(fold=True) equals norm(conv(x)) for a conv with a bias too, and the weight's and
    input's gradients equal the unfolded ones (the fold is made in the graph of each call)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 16, 3, padding=1, stride=2)
    norm = torchvision_norm(16)
    x = torch.randn(2, 8, 11, 9, requires_grad=True)
    grads = []
    for fold in (False, True):
        conv.zero_grad()
        x.grad = None
        out = conv_norm(conv, norm, x, fold)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads.append((out.detach(), conv.weight.grad.clone(), conv.bias.grad.clone(), x.grad.clone()))
    for name, a, b in zip(("output", "weight grad", "bias grad", "input grad"), *grads):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=name)


def torchvision_norm(channels: int) -> nn.Module:
    """A FrozenBatchNorm2d with non-trivial statistics."""
    from torchvision.ops import FrozenBatchNorm2d

    norm = FrozenBatchNorm2d(channels)
    g = torch.Generator().manual_seed(1)
    for buffer, low, high in (("weight", 0.5, 2), ("bias", -1, 1), ("running_mean", -1, 1), ("running_var", 0.2, 3)):
        getattr(norm, buffer).copy_(torch.empty(channels).uniform_(low, high, generator=g))
    return norm


def test_new_weights_count_after_a_folded_call(tiny_cfg, tiny_weights):
    """Nothing is baked in: loading other weights after a call gives those weights' detections."""
    batch = to_image_batch(textured_images(SIZES[:1], seed=2), tiny_cfg)
    other = synthetic_weights(tiny_cfg, seed=1)
    model = _static(tiny_cfg, tiny_weights, fold_batch_norm=True)
    with torch.no_grad():
        first = model(batch)
        load_torchvision_weights(model, other)
        got = model(batch)
        expected = _static(tiny_cfg, other, fold_batch_norm=False)(batch)
    assert not torch.equal(first.scores, got.scores)
    assert_same_detections(got, expected)


def test_training_losses_equal_unfolded(tiny_cfg, tiny_weights):
    cfg = small_cfg(tiny_cfg)
    batch = to_image_batch(textured_images(((128, 112), (100, 128)), seed=4), cfg)
    targets = random_targets(cfg, batch, [3, 2], seed=5)
    losses = {}
    for fold in (False, True):
        model = load_torchvision_weights(MaskRCNN(cfg.replace(fold_batch_norm=fold)), tiny_weights).train()
        torch.manual_seed(0)  # the samplers' random keys
        losses[fold] = model(batch, targets)
    for name, value in losses[False].items():
        torch.testing.assert_close(losses[True][name], value, rtol=1e-5, atol=0, msg=name)


def test_backbone_gradients_equal_unfolded_in_float64(tiny_cfg, tiny_weights):
    """Every trainable conv weight's gradient through the folded backbone equals the unfolded one.
    In float64: in fp32 the backbone's own gradients below its last stage differ from float64's by
    up to a few percent of their largest element, folded or not, which would hide a wrong fold."""
    images = to_image_batch(textured_images(((128, 112),), seed=4), small_cfg(tiny_cfg)).tensors.double()
    grads = {}
    for fold in (False, True):
        model = load_torchvision_weights(MaskRCNN(small_cfg(tiny_cfg, fold_batch_norm=fold)), tiny_weights)
        levels = model.double().train().backbone(images, None, fold).values()
        sum((f * torch.linspace(-1, 1, f.numel(), dtype=f.dtype).view_as(f)).sum() for f in levels).backward()
        grads[fold] = {n: p.grad for n, p in model.backbone.body.named_parameters() if p.grad is not None}
    assert len(grads[False]) > 0 and grads[True].keys() == grads[False].keys()
    for name, value in grads[False].items():
        torch.testing.assert_close(grads[True][name], value, rtol=0, atol=1e-10 * float(value.abs().max()), msg=name)


@pytest.mark.parametrize(
    ("fold", "device", "expected"),
    [
        ("auto", "cpu", True),
        ("auto", "cuda", False),  # not measured there yet
        ("auto", "xla", False),  # XLA fuses the norm itself
        (True, "cuda", True),
        (True, "xla", True),
        (False, "cpu", False),
    ],
)
def test_fold_resolves_by_device(tiny_cfg, fold, device, expected):
    assert fold_norms_on(tiny_cfg.replace(fold_batch_norm=fold), torch.device(device)) is expected


def test_auto_leaves_the_norms_to_the_compiler_and_true_compiles_whole(tiny_cfg):
    """Under torch.compile "auto" does not fold (what a compiled model traces); True folds in one
    graph, without a break."""
    assert get_config("tiny").fold_batch_norm == "auto"
    cfg = tiny_cfg.replace(fold_batch_norm="auto")
    torch._dynamo.reset()
    traced = torch.compile(lambda x: torch.tensor(fold_norms_on(cfg, x.device)), backend="eager", fullgraph=True)
    assert fold_norms_on(cfg, torch.device("cpu")) and not bool(traced(torch.zeros(1)))
    model = MaskRCNN(tiny_cfg.replace(fold_batch_norm=True)).eval()
    images = torch.randn(1, 3, 64, 96)
    backbone = torch.compile(lambda x: model.backbone(x, None, True), backend="eager", fullgraph=True)
    with torch.no_grad():
        for got, expected in zip(backbone(images).values(), model.backbone(images).values(), strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_bad_fold_is_refused(value):
    with pytest.raises(ValueError, match="fold_batch_norm must be True, False or 'auto'"):
        get_config("tiny", fold_batch_norm=value)
