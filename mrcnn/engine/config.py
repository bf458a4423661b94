"""Every setting of a training run, as one frozen value (:class:`TrainConfig`).

The model's own sizes live in :class:`mrcnn.config.Config`; this is everything else a run
depends on: its length, the optimiser and schedule, precision, device, seeds, data splits and the
checkpoint and evaluation cadence. The command line's flag defaults are this class's field
defaults, and a recipe (:mod:`mrcnn.recipes`) is one value of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mrcnn.exits import UsageError

IMPLS: tuple[str, ...] = ("static", "torchvision")
AMP_MODES: tuple[str, ...] = ("none", "bf16", "fp16")
OPTIMIZERS: tuple[str, ...] = ("sgd", "adamw")
INITS: tuple[str, ...] = ("default", "zero_residual")


class TrainSetupError(UsageError):
    """Options or inputs a run cannot start with; the message names the option and the problem."""


@dataclass(frozen=True)
class TrainConfig:
    """Training settings (the schedule is torchvision's detection reference; :mod:`mrcnn.engine.schedule`).

    Attributes:
        steps / epochs: run length, exactly one of them; epochs become steps (batches per epoch and rank).
        batch_size: images per rank and step.
        lr, momentum, weight_decay: the optimiser's; ``lr`` is for the whole batch (all ranks), not scaled.
        optimizer: "sgd" (torchvision's reference) or "adamw" (:func:`mrcnn.engine.schedule.build_optimizer`).
        clip_grad_norm: if > 0, clip the gradients' global L2 norm to this before each step.
        init: "default" (torchvision's) or "zero_residual" (:func:`mrcnn.engine.build.zero_residual_init`),
            random init only.
        warmup_iters, warmup_factor, lr_steps, gamma: linear warm-up, then decay by ``gamma`` at each
            milestone of ``lr_steps`` (counted in optimiser steps).
        amp: "none" (fp32), "bf16" (autocast, CPU or CUDA) or "fp16" (autocast + GradScaler, CUDA only).
        device: "cpu", "cuda" (each rank takes cuda:LOCAL_RANK); None: CUDA when present.
        seed: initial weights, sampling noise and data order.
        num_workers: DataLoader workers per rank.
        checkpoint_every: write a checkpoint every this many steps (0: only at the end).
        eval_every: evaluate the val split every this many steps (0: never during training);
            ``eval_at_end`` adds one after the last step. Skipped when the split does not exist.
        train_split, val_split: COCO split names under the data root; ``val_split`` None: no evaluation.
        impl: "static" (this package's model) or "torchvision" (torchvision's ``MaskRCNN``, same
            initial weights, same batches; :mod:`mrcnn.engine.adapters`).
    """

    steps: int | None = None
    epochs: int | None = None
    batch_size: int = 2
    lr: float = 0.02
    momentum: float = 0.9
    weight_decay: float = 1e-4
    optimizer: str = "sgd"
    clip_grad_norm: float = 0.0
    init: str = "default"
    warmup_iters: int = 1000
    warmup_factor: float = 0.001
    lr_steps: tuple[int, ...] = ()
    gamma: float = 0.1
    amp: str = "none"
    device: str | None = None
    seed: int = 0
    num_workers: int = 0
    checkpoint_every: int = 0
    eval_every: int = 0
    eval_at_end: bool = True
    train_split: str = "train"
    val_split: str | None = "val"
    impl: str = "static"

    def __post_init__(self) -> None:
        # A list from the command line or JSON becomes a tuple, so the value stays hashable.
        object.__setattr__(self, "lr_steps", tuple(int(m) for m in self.lr_steps))
        if (self.steps is None) == (self.epochs is None):
            raise TrainSetupError("give exactly one of steps and epochs")
        for name, allowed in (("amp", AMP_MODES), ("impl", IMPLS), ("optimizer", OPTIMIZERS), ("init", INITS)):
            value = getattr(self, name)
            if value not in allowed:
                raise TrainSetupError(f"{name} must be one of {allowed}, got {value!r}")
        if self.batch_size < 1:
            raise TrainSetupError(f"batch_size must be >= 1, got {self.batch_size}")

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)


def field_default(name: str) -> Any:
    """The default of :class:`TrainConfig` field ``name`` (flag defaults and help texts read it)."""
    for f in dataclasses.fields(TrainConfig):
        if f.name == name:
            return f.default
    raise KeyError(name)
