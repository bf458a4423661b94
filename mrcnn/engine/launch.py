""":func:`train`: a whole run from a config, a data root and :class:`TrainConfig` (single process or torchrun).

Set-up order matters for reproducibility and is fixed here: data (rank 0 generates the synthetic
set if asked, the others wait), the loader, the seed for the initial weights (the same on every
rank; DDP also broadcasts rank 0's), the model, optimiser and scheduler, then a per-rank seed for
the sampling noise, then the resumed state if any.

Distributed: the loader gives rank r every world_size-th batch, all ranks the same number of
batches; ``batch_size`` is per rank.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from mrcnn.config import Config
from mrcnn.data.coco import CocoDataset, CocoFormatError
from mrcnn.data.collate import make_loader
from mrcnn.engine.adapters import make_adapter
from mrcnn.engine.build import build_model
from mrcnn.engine.checkpoint import seed_everything
from mrcnn.engine.config import TrainConfig, TrainSetupError
from mrcnn.engine.data import annotation_file, ensure_synthetic
from mrcnn.engine.distributed import DistInfo, barrier, init_distributed, shutdown
from mrcnn.engine.hooks import MetricsWriter, PeriodicCheckpointer, PeriodicEvaluator, ProgressBar
from mrcnn.engine.precision import grad_scaler
from mrcnn.engine.schedule import build_optimizer, build_scheduler
from mrcnn.engine.trainer import Hook, Trainer
from mrcnn.exits import UsageError


@dataclass(frozen=True)
class TrainResult:
    """What a run ended with (rank 0's view for ``metrics`` and ``checkpoint``)."""

    step: int
    losses: dict[str, float]  # last step, rank-averaged
    metrics: dict[str, float]  # last evaluation, or {}
    checkpoint: Path | None  # last checkpoint written (or resumed from)


def train(
    cfg: Config,
    data_root: str | Path,
    out_dir: str | Path,
    options: TrainConfig,
    *,
    resume: str | Path | None = None,
    weights: str | os.PathLike | None = None,
    synth_count: int | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train ``cfg``'s model on ``data_root/<train_split>``; checkpoints and metrics.jsonl go to ``out_dir``.

    Args:
        resume: a checkpoint file, or a folder (its latest checkpoint), to continue from.
        weights: torchvision-format state_dict to start from (default: random init from the seed).
        synth_count: if set and a split is missing, generate the synthetic data set there
            (``synth_count`` train images, a quarter as many val images).
        progress: a progress bar on rank 0.
    Raises:
        TrainSetupError: the options cannot run here (fp16 without CUDA, a split without batches).
        NonFiniteLossError: a loss was NaN/inf; the message names the step and the last checkpoint.
    """
    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if options.amp == "fp16" and not device.startswith("cuda"):
        raise TrainSetupError(
            "amp='fp16' needs a CUDA device (it uses torch.amp.GradScaler); use amp='bf16' on the CPU"
        )
    info = init_distributed(device)
    try:
        dev = torch.device(f"cuda:{info.local_rank}" if device == "cuda" else device)
        out = Path(out_dir)
        _prepare_data(Path(data_root), out, options, info, synth_count)
        dataset = load_split(Path(data_root), options.train_split, cfg)
        val_dataset = _val_dataset(cfg, Path(data_root), options, info)
        trainer = build_trainer(cfg, dataset, options, info, dev, weights)
        if resume is not None:
            trainer.resume(resume)
        trainer.hooks = default_hooks(out, options, val_dataset, progress)
        state = trainer.train()
        return TrainResult(state.step, state.losses, state.metrics, state.last_checkpoint)
    finally:
        shutdown(info)


def _prepare_data(root: Path, out: Path, options: TrainConfig, info: DistInfo, synth_count: int | None) -> None:
    """Rank 0 makes the output folder and any missing synthetic split; every rank waits for it."""
    if info.main:
        out.mkdir(parents=True, exist_ok=True)
        if synth_count is not None:
            ensure_synthetic(root, options.train_split, synth_count, options.seed)
            if options.val_split:
                ensure_synthetic(root, options.val_split, max(1, synth_count // 4), options.seed + 1)
    barrier(info)


def _val_dataset(cfg: Config, root: Path, options: TrainConfig, info: DistInfo) -> CocoDataset | None:
    """The evaluation split on rank 0, if it exists; None elsewhere."""
    split = options.val_split
    if info.main and split and annotation_file(root, split).is_file():
        return load_split(root, split, cfg)
    return None


def load_split(root: Path, split: str, cfg: Config) -> CocoDataset:
    """``root``'s ``split`` for ``cfg``; a set that does not fit the config is a :class:`TrainSetupError`.

    A missing file stays FileNotFoundError and a malformed one CocoFormatError (both name the file).
    """
    try:
        return CocoDataset.from_config(root, split, cfg)
    except CocoFormatError:
        raise
    except UsageError as e:  # e.g. more categories than cfg.num_classes
        raise TrainSetupError(str(e)) from e


def build_trainer(
    cfg: Config,
    dataset: CocoDataset,
    options: TrainConfig,
    info: DistInfo,
    device: torch.device,
    weights: str | os.PathLike | None = None,
) -> Trainer:
    """The loader of this rank, the seeded model, optimiser, scheduler and scaler; no hooks yet."""
    loader = make_loader(
        dataset, cfg, options.batch_size, shuffle=True, seed=options.seed, num_replicas=info.world_size, rank=info.rank
    )
    per_epoch = len(loader.batch_sampler)
    if per_epoch == 0:
        raise TrainSetupError(f"{dataset.root}/{dataset.split} gives no batches")
    total = options.steps if options.steps is not None else options.epochs * per_epoch

    seed_everything(options.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = build_model(cfg, weights, options.impl, options.init).to(device).train()
    adapter = make_adapter(options.impl, cfg)
    optimizer = build_optimizer(model, options.lr, options.momentum, options.weight_decay, options.optimizer)
    scheduler = build_scheduler(optimizer, options.warmup_iters, options.warmup_factor, options.lr_steps, options.gamma)
    scaler = grad_scaler(options.amp)
    seed_everything(options.seed + 7919 * info.rank)  # per-rank sampling noise
    return Trainer(cfg, options, info, device, adapter, model, optimizer, scheduler, scaler, loader, total)


def default_hooks(out: Path, options: TrainConfig, val_dataset: CocoDataset | None, progress: bool) -> list[Hook]:
    """Progress bar, checkpoints, evaluation, metrics file: in this order after every step."""
    return [
        ProgressBar(progress),
        PeriodicCheckpointer(out, options.checkpoint_every),
        PeriodicEvaluator(val_dataset, options.batch_size, options.eval_every, options.eval_at_end),
        MetricsWriter(out),
    ]
