"""A known slowdown, added from outside the model: what the latency gate's error rates are measured with.

:func:`inject_slowdown` hooks ``model.backbone`` so that each inference forward also runs the FPN's
P3 output convolution (``model.backbone.fpn``'s layer block 1, a 3x3 convolution of the FPN's width)
again over P3, as many times and rows as the fraction asks, then adds the result, reduced to an
exact zero, to the first FPN level. It is real compute in one stage, as the steps range's backbone
commit is (the same convolution, there three whole passes), and it costs little beyond its rows:
one convolution, a sum and an add a pass, so a 2% slowdown can be asked for as well as a 10% one.
It needs nothing but ``model.backbone.fpn`` (torchvision's ``FeaturePyramidNetwork`` API), so it
applies alike to this repository's model at any commit (``compare`` across checkouts) and to
torchvision's.

``mrcnn-bench compare --inject-slowdown 0.1`` applies it to B (:attr:`mrcnn_bench.running.cases.Variant.slowdown`);
the teeth studies calibrate the fraction against the slowdown they measure
(``bench/studies/slowdown_calibration.py``), since the convolution's share of the call differs by
host kind and case.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

# Names the extra work, so that a calibration made with another (the ResNet body over a strip of
# the image before this one, whose fixed cost was several percent of a call) is not reused.
INJECTION = "fpn-p3-conv"
# Assumed share of an inference taken by one pass of the P3 convolution over P3: its FLOPs are
# about 1% of a static inference's on the tiny preset. It only sizes the extra work; the teeth
# studies measure the slowdown it actually gives.
PASS_SHARE = 0.01
LEVEL = 1  # P3: the FPN's outputs are P2..P5 then "pool"


def slowdown_rows(height: int, fraction: float) -> list[int]:
    """Rows of P3 (``height`` rows high) that each extra pass convolves.

    A 3x3 convolution's cost is proportional to the rows it writes, so ``fraction / PASS_SHARE``
    levels' worth of rows costs about ``fraction`` of the call: that many whole passes, then a strip.
    The rows come from the level only, so shapes stay static.
    """
    rows = round(fraction / PASS_SHARE * height)
    return [height] * (rows // height) + ([rows % height] if rows % height else [])


def extra_work(fpn: nn.Module, level: Tensor, fraction: float) -> Tensor:
    """The P3 convolution of ``fpn`` over :func:`slowdown_rows` of ``level`` [B, C, H, W], reduced to an
    exact 0 (0-dim).

    ``nan_to_num(...) * 0`` is 0 whatever the values, yet depends on them, so no compiler drops
    the work, and whatever it is added to stays bit for bit the same.
    """
    total = level.new_zeros(())
    for rows in slowdown_rows(level.shape[-2], fraction):
        total = total + fpn.get_result_from_layer_blocks(level[..., :rows, :], LEVEL).sum()
    return torch.nan_to_num(total, nan=0.0, posinf=0.0, neginf=0.0) * 0.0


def inject_slowdown(model: nn.Module, fraction: float) -> RemovableHandle:
    """Make ``model``'s inference about ``fraction`` slower, outputs unchanged; returns the hook's handle.

    A forward hook on ``model.backbone`` (images [B, 3, H, W] -> OrderedDict of FPN levels): in
    eval mode it adds :func:`extra_work` over P3 to the first level (P2). Training forwards are
    untouched. Attach it before ``torch.compile`` or export, so the extra work is compiled with the
    model.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"slowdown must be in [0, 1), got {fraction}")
    backbone = model.backbone
    fpn = backbone.fpn

    def hook(module: nn.Module, args: tuple[Any, ...], output: OrderedDict[str, Tensor]) -> OrderedDict[str, Tensor]:
        if module.training or fraction == 0.0:
            return output
        levels = OrderedDict(output)
        keys = list(levels)
        zero = extra_work(fpn, levels[keys[LEVEL]], fraction)
        levels[keys[0]] = levels[keys[0]] + zero
        return levels

    return backbone.register_forward_hook(hook)
