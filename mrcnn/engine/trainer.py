"""The training loop: one short step function, with checkpoints, evaluation and logging as hooks.

Each step: prepare the batch (:class:`mrcnn.engine.adapters.Adapter`), forward to the five losses
under autocast, average them over ranks, stop on a non-finite one, backward (scaled under fp16,
clipped if asked), optimiser step, scheduler step. Then every hook's ``after_step`` sees the step's
record in order (:mod:`mrcnn.engine.hooks`: progress bar, checkpoint, evaluation, metrics file).

A non-finite loss (averaged over ranks, so every rank sees it) stops the run before the backward
with :class:`NonFiniteLossError` naming the step; no checkpoint is written for that step, so the
last good one stays as it was.

Exact resume: :meth:`Trainer.state_dict` holds everything the next step depends on (weights,
optimiser, scheduler, scaler, step, loader position, every rank's RNG), and each epoch's loader is
rebuilt from the epoch and the batches already consumed (:func:`mrcnn.engine.data.epoch_loader`),
so N steps straight and k steps + resume + N - k steps give the same losses and parameters (fp32,
``num_workers=0``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from mrcnn.config import Config
from mrcnn.engine.adapters import Adapter
from mrcnn.engine.checkpoint import load_checkpoint, resolve_checkpoint, set_rng_state
from mrcnn.engine.config import TrainConfig
from mrcnn.engine.data import epoch_loader
from mrcnn.engine.distributed import DistInfo, mean_over_ranks, per_rank_counts
from mrcnn.engine.precision import autocast
from mrcnn.exits import UsageError

LOSS_NAMES: tuple[str, ...] = ("loss_objectness", "loss_rpn_box_reg", "loss_classifier", "loss_box_reg", "loss_mask")


class NonFiniteLossError(FloatingPointError):
    """A loss became NaN or infinite; the message names the step and the last good checkpoint."""


@dataclass
class TrainState:
    """Where the run is: the loop's counters and what it last measured."""

    step: int = 0  # optimiser steps done
    epoch: int = 0
    offset: int = 0  # batches of ``epoch`` consumed (this rank)
    last_checkpoint: Path | None = None
    losses: dict[str, float] = field(default_factory=dict)  # last step, rank-averaged
    metrics: dict[str, float] = field(default_factory=dict)  # last evaluation (rank 0), or {}


@dataclass(frozen=True)
class StepResult:
    """One step's rank-averaged losses (in :data:`LOSS_NAMES` order), GT instances per rank, and its lr."""

    losses: list[float]
    gt_instances: list[int]
    lr: float


class Hook:
    """Called around the loop; the trainer runs its hooks in list order. Subclasses: :mod:`mrcnn.engine.hooks`."""

    def before_train(self, trainer: Trainer) -> None:
        """After resume, before the first step."""

    def after_step(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """After each step; ``record`` is the step's metrics.jsonl row, which hooks may add to."""

    def after_train(self, trainer: Trainer) -> None:
        """After the last step, or on the way out of an exception."""


@dataclass(eq=False)
class Trainer:
    """The loop over ``total`` steps of ``model`` on one epoch's batches of ``loader`` at a time."""

    cfg: Config
    options: TrainConfig
    info: DistInfo
    device: torch.device
    adapter: Adapter
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler | None
    loader: DataLoader  # this rank's batches (a make_loader loader); each epoch's loader is built from it
    total: int
    hooks: list[Hook] = field(default_factory=list)
    state: TrainState = field(default_factory=TrainState)

    def __post_init__(self) -> None:
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.per_epoch = len(self.loader.batch_sampler)
        self.ddp_model: nn.Module = self.model
        self._start_time = self._start_cpu = 0.0

    # -- state ------------------------------------------------------------------------------------

    def state_dict(self, rng_states: list[dict[str, Any]]) -> dict[str, Any]:
        """The checkpoint's contents; ``rng_states``: every rank's :func:`mrcnn.engine.checkpoint.rng_state`."""
        s = self.state
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "step": s.step,
            "epoch": s.epoch,
            "offset": s.offset,
            "rng": rng_states,
            "world_size": self.info.world_size,
            "config": dataclasses.asdict(self.cfg),
            "impl": self.options.impl,
        }

    def load_state_dict(self, ckpt: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; this rank's RNG too when the checkpoint has as many ranks."""
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        if self.scaler is not None and ckpt.get("scaler") is not None:
            self.scaler.load_state_dict(ckpt["scaler"])
        s = self.state
        s.step, s.epoch, s.offset = int(ckpt["step"]), int(ckpt["epoch"]), int(ckpt["offset"])
        states = ckpt["rng"]
        if len(states) == self.info.world_size:
            set_rng_state(states[self.info.rank])
        elif self.info.main:
            print(
                f"resume: checkpoint has RNG states of {len(states)} ranks, this run has {self.info.world_size}; "
                "sampling noise will differ from an uninterrupted run",
                file=sys.stderr,
            )

    def resume(self, path: str | Path) -> None:
        """Continue from a checkpoint file, or a folder's latest checkpoint; ValueError (before anything
        is loaded) for a file that is not a checkpoint of this run's model, config and implementation."""
        found = resolve_checkpoint(path)
        ckpt = load_checkpoint(found)
        self.check_resumable(ckpt, found)
        self.load_state_dict(ckpt)
        self.state.last_checkpoint = found

    def check_resumable(self, ckpt: dict[str, Any], path: Path) -> None:
        """ValueError unless ``ckpt`` is a checkpoint of :meth:`state_dict` with this config and impl: a
        different --set or --impl would otherwise continue as if it were the same run."""
        absent = [k for k in ("model", "optimizer", "scheduler", "step", "epoch", "offset", "rng") if k not in ckpt]
        if absent:
            raise UsageError(f"--resume: {path} is not a checkpoint of mrcnn train (no {', '.join(absent)}); "
                             "to start from its weights, use --weights")
        theirs, ours = ckpt.get("config"), json.loads(json.dumps(dataclasses.asdict(self.cfg)))
        if isinstance(theirs, dict):
            theirs = json.loads(json.dumps(theirs))  # tuples as lists, as in ours
            differ = [f"{k} {theirs.get(k)!r} there, {ours.get(k)!r} here" for k in sorted({*theirs, *ours})
                      if theirs.get(k) != ours.get(k)]
            if differ:
                raise UsageError(f"--resume: {path} was trained with another config ({'; '.join(differ[:4])}): "
                                 "give its --preset and --set, or start a new run in another --out")
        if ckpt.get("impl", self.options.impl) != self.options.impl:
            raise UsageError(f"--resume: {path} was trained with --impl {ckpt['impl']}, not {self.options.impl}")

    # -- the loop ---------------------------------------------------------------------------------

    def train(self) -> TrainState:
        """Run the remaining steps (after :meth:`resume`, those after the checkpoint)."""
        if self.info.distributed:
            # Every loss is computed over fixed-size, masked tensors, so every trainable parameter
            # gets a gradient even for a batch without ground truth: no find_unused_parameters.
            dev = self.device
            self.ddp_model = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[dev.index] if dev.type == "cuda" else None, find_unused_parameters=False
            )
        for hook in self.hooks:
            hook.before_train(self)
        self._start_time = time.perf_counter()
        self._start_cpu = time.process_time()  # CPU seconds, all threads: wall time on a loaded machine misleads
        try:
            self._loop()
        finally:
            for hook in self.hooks:
                hook.after_train(self)
        return self.state

    def _loop(self) -> None:
        s, opts = self.state, self.options
        while s.step < self.total:
            if s.offset >= self.per_epoch:
                s.epoch, s.offset = s.epoch + 1, 0
            loader = epoch_loader(self.loader, s.epoch, s.offset, opts.seed, opts.num_workers, self.adapter.collate_fn)
            t_data = time.perf_counter()
            for item in loader:
                t0 = time.perf_counter()
                record = self._record(self.run_step(item), t0, t_data)
                for hook in self.hooks:
                    hook.after_step(self, record)
                if s.step >= self.total:
                    break
                t_data = time.perf_counter()

    def run_step(self, item: Any) -> StepResult:
        """One optimiser step on a loader item; raises :class:`NonFiniteLossError` before the backward."""
        batch = self.adapter.prepare(item, self.device)
        with autocast(self.options.amp, self.device):
            losses = self.ddp_model(*batch.inputs)
        stacked = mean_over_ranks(torch.stack([losses[name].float() for name in LOSS_NAMES]).detach(), self.info)
        gt_instances = per_rank_counts(batch.gt_count, self.info, self.device)
        values = stacked.cpu().tolist()
        self._check_finite(values)
        self._apply_gradients(sum(losses[name] for name in LOSS_NAMES))
        lr = self.optimizer.param_groups[0]["lr"]
        self.scheduler.step()
        self.state.step, self.state.offset = self.state.step + 1, self.state.offset + 1
        self.state.losses = dict(zip(LOSS_NAMES, values))
        return StepResult(values, gt_instances, lr)

    def _check_finite(self, values: list[float]) -> None:
        if all(math.isfinite(v) for v in values):
            return
        shown = ", ".join(f"{n}={v:.4g}" for n, v in zip(LOSS_NAMES, values))
        last = self.state.last_checkpoint
        kept = f"last good checkpoint {last} kept" if last else "no checkpoint yet"
        raise NonFiniteLossError(f"non-finite loss at step {self.state.step + 1} ({shown}); stopping; {kept}")

    def _apply_gradients(self, total_loss: torch.Tensor) -> None:
        """Backward and optimiser step: loss-scaled under fp16, gradient norm clipped if asked."""
        clip = self.options.clip_grad_norm
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(total_loss).backward()
            if clip:
                self.scaler.unscale_(self.optimizer)
                nn.utils.clip_grad_norm_(self.params, clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            total_loss.backward()
            if clip:
                nn.utils.clip_grad_norm_(self.params, clip)
            self.optimizer.step()

    def _record(self, result: StepResult, t0: float, t_data: float) -> dict[str, Any]:
        """The step's metrics.jsonl row (hooks add the evaluation's metrics on evaluated steps)."""
        s = self.state
        return {
            "step": s.step,
            "epoch": s.epoch,
            "loss": sum(result.losses),
            **dict(zip(LOSS_NAMES, result.losses)),
            "lr": result.lr,
            "step_time": time.perf_counter() - t0,  # host checks, copy, forward, backward, optimiser
            "data_time": t0 - t_data,  # waiting for the batch
            "time": time.perf_counter() - self._start_time,
            "cpu_time": time.process_time() - self._start_cpu,  # rank 0's process, all threads, since the start
            "gt_instances": result.gt_instances,
        }
