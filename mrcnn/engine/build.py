"""The model a run starts from: random init (seeded), zero-residual init, or torchvision-format weights."""

from __future__ import annotations

import os

from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck

from mrcnn.config import Config
from mrcnn.engine.config import IMPLS, INITS
from mrcnn.model import MaskRCNN
from mrcnn.reference import torchvision_model
from mrcnn.weights import load_torchvision_weights


def zero_residual_init(model: nn.Module) -> int:
    """Zero the last convolution of every trainable residual block of the ResNet body; returns how many.

    From random init the frozen batch norms are identities, so nothing normalises the residual
    branches and activations grow block after block. A zero last convolution makes every block
    the identity at the start (the idea of zero-init residuals and Fixup); it still learns, since
    its input is not zero. Blocks whose weights are frozen are left alone (zero would stay zero).
    """
    count = 0
    for module in model.modules():
        last = None
        if isinstance(module, BasicBlock):
            last = module.conv2
        elif isinstance(module, Bottleneck):
            last = module.conv3
        if last is not None and last.weight.requires_grad:
            nn.init.zeros_(last.weight)
            count += 1
    return count


def build_model(
    cfg: Config, weights: str | os.PathLike | None = None, impl: str = "static", init: str = "default"
) -> nn.Module:
    """Random init (the global seed decides it), or a torchvision-format state_dict from ``weights``.

    ``init="zero_residual"`` applies :func:`zero_residual_init` to a randomly initialised model.

    ``impl="torchvision"`` returns torchvision's ``MaskRCNN`` holding the very weights the static
    model gets (built first, from the same RNG state, then copied over by name).
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    model = MaskRCNN(cfg)
    if weights is not None:
        load_torchvision_weights(model, weights)
    elif init == "zero_residual":
        zero_residual_init(model)
    if impl == "torchvision":
        reference = torchvision_model(cfg)
        reference.load_state_dict(model.state_dict(), strict=True)
        return reference
    return model
