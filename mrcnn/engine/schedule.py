"""Optimiser and learning-rate schedule of torchvision's detection reference (``references/detection``).

SGD with momentum and weight decay on the trainable parameters, a linear warm-up of the learning
rate from ``warmup_factor * lr`` to ``lr`` over ``warmup_iters`` iterations, then a multi-step
decay by ``gamma`` at each milestone of ``lr_steps``. Both are one :class:`WarmupMultiStep` factor
inside a ``LambdaLR`` stepped once per iteration, so the milestones count optimiser steps (not
epochs, as the reference's ``MultiStepLR`` does) and the schedule does not depend on where a run
stopped:

    factor(it) = warmup(it) * gamma ** (number of milestones <= it)
    warmup(it) = warmup_factor + (1 - warmup_factor) * it / warmup_iters   for it < warmup_iters, else 1

``kind="adamw"`` swaps SGD for AdamW under the same schedule.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch
from torch import nn

from mrcnn.engine.config import OPTIMIZERS
from mrcnn.exits import UsageError


class WarmupMultiStep:
    """LR factor of iteration ``it``: linear warm-up from ``warmup_factor``, then ``gamma`` at each milestone.

    A class rather than a closure so ``LambdaLR.state_dict`` stores (and restores) its fields.
    """

    def __init__(
        self, warmup_iters: int, warmup_factor: float, milestones: Sequence[int] = (), gamma: float = 0.1
    ) -> None:
        if list(milestones) != sorted(milestones):
            raise UsageError(f"lr milestones must be increasing, got {list(milestones)}")
        self.warmup_iters, self.warmup_factor = int(warmup_iters), float(warmup_factor)
        self.milestones, self.gamma = [int(m) for m in milestones], float(gamma)

    def __call__(self, it: int) -> float:
        warmup = 1.0
        if it < self.warmup_iters:
            alpha = it / self.warmup_iters
            warmup = self.warmup_factor * (1 - alpha) + alpha
        return warmup * self.gamma ** bisect.bisect_right(self.milestones, it)


def build_optimizer(
    model: nn.Module, lr: float, momentum: float, weight_decay: float, kind: str = "sgd"
) -> torch.optim.Optimizer:
    """SGD over the trainable parameters, as torchvision's reference (one group, decay on all).

    ``kind="adamw"``: AdamW (betas (0.9, 0.999); ``momentum`` unused) with the same single group,
    for from-scratch recipes: the backbone's frozen batch norms are identities at random init, so
    nothing normalises its activations and SGD learns slowly there.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if kind != "sgd":
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {kind!r}")
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    warmup_iters: int,
    warmup_factor: float,
    lr_steps: Sequence[int],
    gamma: float,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` of :class:`WarmupMultiStep`, to be stepped once per optimiser step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupMultiStep(warmup_iters, warmup_factor, lr_steps, gamma))
