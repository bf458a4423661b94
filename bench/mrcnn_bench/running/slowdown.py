"""A known slowdown, added from outside the model: what the latency gate's error rates are measured with.

:func:`inject_slowdown` hooks ``model.backbone`` so that each inference forward also runs the
ResNet body (``model.backbone.body``) again over the top rows of the batch, then adds the result,
reduced to an exact zero, to the first FPN level. It needs nothing but ``model.backbone`` and
``model.backbone.body``, so it applies alike to this repository's model at any commit (``compare``
across checkouts) and to torchvision's.

``mrcnn-bench compare --inject-slowdown 0.1`` applies it to B (:attr:`mrcnn_bench.running.cases.Variant.slowdown`);
``bench/studies/gate_error_rates/error_rates.py`` measures the slowdown it gives and the gate's detection
rate against it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

# Share of the inference forward spent in the ResNet body (conv1..layer4), measured on the tiny
# preset, CPU eager, one thread, one 320x448 image: 0.4 to 0.5 of the call. It only sizes the
# extra work; bench/studies/gate_error_rates/error_rates.py reports the slowdown actually measured.
BODY_SHARE = 0.5


def slowdown_strips(height: int, fraction: float) -> list[int]:
    """Heights of the extra body passes over a canvas ``height`` rows high.

    The body's cost is proportional to the rows it sees, so ``fraction / BODY_SHARE`` canvases'
    worth of rows costs about ``fraction`` of the forward: that many whole passes, then a strip.
    The rows come from the canvas only, so shapes stay static.
    """
    rows = round(fraction / BODY_SHARE * height)
    return [height] * (rows // height) + ([rows % height] if rows % height else [])


def extra_work(body: nn.Module, images: Tensor, fraction: float) -> Tensor:
    """The body over :func:`slowdown_strips` of ``images`` [B, 3, H, W], reduced to an exact 0 (0-dim).

    ``nan_to_num(...) * 0`` is 0 whatever the values, yet depends on them, so no compiler drops
    the work, and whatever it is added to stays bit for bit the same.
    """
    total = images.new_zeros(())
    for strip in slowdown_strips(images.shape[-2], fraction):
        levels = body(images[..., :strip, :])  # OrderedDict "0".."3" of ResNet stages
        total = total + list(levels.values())[-1].sum()
    return torch.nan_to_num(total, nan=0.0, posinf=0.0, neginf=0.0) * 0.0


def inject_slowdown(model: nn.Module, fraction: float) -> RemovableHandle:
    """Make ``model``'s inference about ``fraction`` slower, outputs unchanged; returns the hook's handle.

    A forward hook on ``model.backbone`` (images [B, 3, H, W] -> OrderedDict of FPN levels): in
    eval mode it adds :func:`extra_work` to the first level (P2). Training forwards are untouched.
    Attach it before ``torch.compile`` or export, so the extra work is compiled with the model.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"slowdown must be in [0, 1), got {fraction}")
    backbone = model.backbone
    body = backbone.body

    def hook(module: nn.Module, args: tuple[Any, ...], output: OrderedDict[str, Tensor]) -> OrderedDict[str, Tensor]:
        if module.training or fraction == 0.0:
            return output
        zero = extra_work(body, args[0], fraction)
        levels = OrderedDict(output)
        first = next(iter(levels))
        levels[first] = levels[first] + zero
        return levels

    return backbone.register_forward_hook(hook)
