"""Training loop for the static-shape Mask R-CNN: SGD, warm-up + step schedule, AMP, DDP, exact resume.

The optimiser and schedule are those of torchvision's detection reference (``references/detection``):
SGD with momentum and weight decay on the trainable parameters, a linear warm-up of the learning
rate from ``warmup_factor * lr`` to ``lr`` over ``warmup_iters`` iterations, then a multi-step decay
by ``gamma`` at each milestone of ``lr_steps``. Both are one :class:`WarmupMultiStep` factor inside a
``LambdaLR`` stepped once per iteration, so the milestones count optimiser steps (not epochs, as the
reference's ``MultiStepLR`` does) and the schedule does not depend on where a run stopped:

    factor(it) = warmup(it) * gamma ** (number of milestones <= it)
    warmup(it) = warmup_factor + (1 - warmup_factor) * it / warmup_iters   for it < warmup_iters, else 1

``optimizer="adamw"`` swaps SGD for AdamW under the same schedule, ``clip_grad_norm`` clips the
global gradient norm before each step, and ``init="zero_residual"`` zeroes the last convolution of
each residual block of a randomly initialised backbone; the from-scratch recipes
(:mod:`mrcnn.recipes`) use the first two.

Runs are step-counted (``steps``, or ``epochs`` turned into steps). Every ``checkpoint_every`` steps
rank 0 writes ``out_dir/checkpoint_<step>.pt`` (atomically: temporary file, then rename) with the
model, optimiser, scheduler and GradScaler states, the step, the loader position (epoch and batches
consumed in it) and every rank's RNG states (torch, CUDA, numpy, python ``random``). ``resume``
restores all of it, so N steps straight and k steps + resume + N - k steps give the same losses and
parameters (fp32, ``num_workers=0``; each epoch's DataLoader draws its worker seeds from its own
generator, so building a loader mid-epoch never disturbs the global RNG).

A non-finite loss (summed over ranks, so every rank sees it) stops the run before the backward
with :class:`NonFiniteLossError` naming the step; no checkpoint is written for that step, so the
last good one stays as it was.

Distributed: launched by ``torchrun`` (``WORLD_SIZE`` > 1), the process group is initialised from
the environment (gloo on the CPU, nccl on CUDA), the model wrapped in ``DistributedDataParallel``
without ``find_unused_parameters`` (every loss is computed over fixed-size, masked tensors, so every
trainable parameter gets a gradient even for a batch without ground truth), and the loader gives
rank r every world_size-th batch, all ranks the same number of batches.

Metrics go to ``out_dir/metrics.jsonl``, one JSON object per step (step, epoch, the five losses and
their sum averaged over ranks, lr, ``step_time`` (host checks, copy, forward, backward, optimiser),
``data_time`` (waiting for the batch), elapsed ``time``, ``cpu_time`` (CPU seconds of rank 0's
process, all threads, since the start: comparable across runs on a shared machine), GT instances per rank) with COCO
``bbox/*`` and ``segm/*`` metrics added on the steps where the val split was evaluated (rank 0,
:class:`mrcnn.evaluate.CocoEvaluator`).

torchvision path (``impl="torchvision"``, ``--impl torchvision``): the same loop trains torchvision's
own ``MaskRCNN`` (:func:`mrcnn.reference.torchvision_model`) for the comparison in
``results/training/``. It starts from the same initial weights (the static model is built from
the seed as usual and its state_dict loaded into torchvision's, names match), draws the same
batches (same sampler, same images per step), and uses the same optimiser, schedule, AMP and
evaluator. Its input is torchvision's own: each batch is the list of unpadded original images
(float in [0, 1]) and a list of target dicts (boxes in original pixels, labels, full-image masks)
with the same instances the static batch keeps (crowd annotations dropped, at most
``max_gt_instances``); torchvision's ``GeneralizedRCNNTransform`` resizes, normalises and pads
them itself. Evaluation feeds the val images the same way and scores torchvision's outputs (in
original-image coordinates) with the same :class:`mrcnn.evaluate.CocoEvaluator`.

Recipes (:mod:`mrcnn.recipes`) name a whole run: ``--recipe tiny`` sets the preset and config
overrides, the synthetic data (generated under ``--data``, default ``data/``), steps, batch size,
schedule and evaluation cadence; any flag given explicitly overrides the recipe. The recipe's
batch size is the global one: with N ranks each takes batch_size / N images.

Command line::

    python -m mrcnn.train --preset tiny --data DIR --out DIR --steps 200 [--synth-count 200] ...
    python -m mrcnn.train --recipe tiny --out out/tiny [--impl torchvision] [--seed 1]
    torchrun --nproc_per_node 2 -m mrcnn.train ...
"""

from __future__ import annotations

import argparse
import ast
import bisect
import contextlib
import dataclasses
import inspect
import json
import math
import os
import random
import re
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Sampler
from tqdm import tqdm

from mrcnn.config import Config, get_config
from mrcnn.data.coco import CocoDataset
from mrcnn.data.collate import BucketBatchSampler, make_loader
from mrcnn.losses import check_targets
from mrcnn.model import MaskRCNN
from mrcnn.structures import ImageBatch, Targets

IMPLS: tuple[str, ...] = ("static", "torchvision")
LOSS_NAMES: tuple[str, ...] = ("loss_objectness", "loss_rpn_box_reg", "loss_classifier", "loss_box_reg", "loss_mask")
AMP_MODES: tuple[str, ...] = ("none", "bf16", "fp16")
METRICS_FILE = "metrics.jsonl"
_CHECKPOINT_RE = re.compile(r"checkpoint_(\d+)\.pt$")


class NonFiniteLossError(FloatingPointError):
    """A loss became NaN or infinite; the message names the step and the last good checkpoint."""


# ------------------------------------------------------------------------------------------------
# Schedule


class WarmupMultiStep:
    """LR factor of iteration ``it``: linear warm-up from ``warmup_factor``, then ``gamma`` at each milestone.

    A class rather than a closure so ``LambdaLR.state_dict`` stores (and restores) its fields.
    """

    def __init__(
        self, warmup_iters: int, warmup_factor: float, milestones: Sequence[int] = (), gamma: float = 0.1
    ) -> None:
        if list(milestones) != sorted(milestones):
            raise ValueError(f"lr milestones must be increasing, got {list(milestones)}")
        self.warmup_iters, self.warmup_factor = int(warmup_iters), float(warmup_factor)
        self.milestones, self.gamma = [int(m) for m in milestones], float(gamma)

    def __call__(self, it: int) -> float:
        warmup = 1.0
        if it < self.warmup_iters:
            alpha = it / self.warmup_iters
            warmup = self.warmup_factor * (1 - alpha) + alpha
        return warmup * self.gamma ** bisect.bisect_right(self.milestones, it)


OPTIMIZERS: tuple[str, ...] = ("sgd", "adamw")


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
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupMultiStep(warmup_iters, warmup_factor, lr_steps, gamma))


# ------------------------------------------------------------------------------------------------
# Distributed helpers


@dataclasses.dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # this module initialised the process group (and destroys it)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str) -> DistInfo:
    """Join the process group torchrun describes (WORLD_SIZE > 1 in the environment); else single process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    owns = False
    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if device.startswith("cuda"):
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend=backend)
        owns = True
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, owns)


def _barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


# ------------------------------------------------------------------------------------------------
# RNG and data position


def rng_state() -> dict[str, Any]:
    """This process's RNG states, in types ``torch.load(weights_only=True)`` accepts."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class _EpochBatches(Sampler[list[int]]):
    """One epoch of a :class:`BucketBatchSampler`, starting after the first ``start`` batches (resume)."""

    def __init__(self, sampler: BucketBatchSampler, epoch: int, start: int = 0) -> None:
        sampler.set_epoch(epoch)
        self.batches = list(sampler)[start:]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def _epoch_loader(
    template: DataLoader, epoch: int, start: int, seed: int, num_workers: int, collate_fn: Any = None
) -> DataLoader:
    """The rest of ``epoch`` from ``template`` (a :func:`make_loader` loader), with its own seed generator."""
    return DataLoader(
        template.dataset,
        batch_sampler=_EpochBatches(template.batch_sampler, epoch, start),
        collate_fn=collate_fn or template.collate_fn,
        num_workers=num_workers,
        pin_memory=template.pin_memory,
        generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch),
    )


# ------------------------------------------------------------------------------------------------
# Checkpoints


def checkpoint_path(out_dir: str | Path, step: int) -> Path:
    return Path(out_dir) / f"checkpoint_{step:07d}.pt"


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The checkpoint with the highest step in ``out_dir``, or None."""
    found = [
        (int(m.group(1)), p) for p in Path(out_dir).glob("checkpoint_*.pt") if (m := _CHECKPOINT_RE.search(p.name))
    ]
    return max(found)[1] if found else None


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        found = latest_checkpoint(path)
        if found is None:
            raise FileNotFoundError(f"no checkpoint_*.pt in {path} to resume from")
        path = found
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return torch.load(path, map_location="cpu", weights_only=True)


# ------------------------------------------------------------------------------------------------
# Data


def ensure_synthetic(root: str | Path, split: str, count: int, seed: int) -> None:
    """Write the synthetic data set's ``split`` under ``root`` unless its annotation file exists."""
    from mrcnn.data.synthetic import generate

    if not (Path(root) / "annotations" / f"instances_{split}.json").is_file():
        generate(root, count, seed, split, progress=False)


def _to_device(batch: ImageBatch, targets: Targets, device: torch.device) -> tuple[ImageBatch, Targets]:
    if device.type == "cpu":
        return batch, targets
    return (
        ImageBatch(*(t.to(device, non_blocking=True) for t in batch)),
        Targets(*(t.to(device, non_blocking=True) for t in targets)),
    )


def _autocast(amp: str, device: torch.device) -> contextlib.AbstractContextManager:
    if amp == "none":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


@torch.no_grad()
def evaluate(
    model: MaskRCNN, dataset: CocoDataset, cfg: Config, batch_size: int, device: torch.device, amp: str = "none"
) -> dict[str, float]:
    """COCO box and mask metrics of ``model`` on ``dataset`` (one process; the model is left in eval mode)."""
    from mrcnn.evaluate import CocoEvaluator

    model.eval()
    evaluator = CocoEvaluator(dataset.coco, dataset.label_to_category_id)
    for batch, _, meta in make_loader(dataset, cfg, batch_size):
        on_device = ImageBatch(*(t.to(device) for t in batch)) if device.type != "cpu" else batch
        with _autocast(amp if amp == "bf16" else "none", device):
            det = model(on_device)
        det = type(det)(*(t.float().cpu() if t.is_floating_point() else t.cpu() for t in det))
        evaluator.update_detections(det, batch, meta.image_ids)
    return evaluator.summarize()


class TorchvisionCollate:
    """Samples -> torchvision's training input: (list of [3, h, w] float images in [0, 1], list of targets).

    The instances are those :func:`mrcnn.data.collate.collate` keeps for the static batch (crowd
    annotations dropped, the first ``max_gt_instances``), in original-image pixels with full-image
    masks; torchvision's own transform resizes them. Picklable, for DataLoader workers.
    """

    def __init__(self, max_gt_instances: int) -> None:
        self.max_gt_instances = max_gt_instances

    def __call__(self, samples: Sequence[tuple[torch.Tensor, dict[str, Any]]]) -> tuple[list, list]:
        images, targets = [], []
        for image, target in samples:
            keep = torch.ones(len(target["labels"]), dtype=torch.bool)
            if "iscrowd" in target:
                keep &= target["iscrowd"] == 0
            idx = torch.nonzero(keep).flatten()[: self.max_gt_instances]
            images.append(image.float() / 255.0)
            targets.append(
                {
                    "boxes": target["boxes"][idx].float().reshape(-1, 4),
                    "labels": target["labels"][idx],
                    "masks": target["masks"][idx],
                    "image_id": int(target["image_id"]),
                }
            )
        return images, targets


@torch.no_grad()
def evaluate_torchvision(
    model: nn.Module, dataset: CocoDataset, batch_size: int, device: torch.device, amp: str = "none"
) -> dict[str, float]:
    """:func:`evaluate` for torchvision's ``MaskRCNN``: the val images in order, its own transform."""
    from mrcnn.evaluate import CocoEvaluator

    model.eval()
    evaluator = CocoEvaluator(dataset.coco, dataset.label_to_category_id)
    for start in range(0, len(dataset), batch_size):
        samples = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        images = [(image.float() / 255.0).to(device) for image, _ in samples]
        with _autocast(amp if amp == "bf16" else "none", device):
            outputs = model(images)
        outputs = [{k: (v.float() if v.is_floating_point() else v).cpu() for k, v in o.items()} for o in outputs]
        evaluator.update(outputs, [int(t["image_id"]) for _, t in samples])
    return evaluator.summarize()


# ------------------------------------------------------------------------------------------------
# The loop


INITS: tuple[str, ...] = ("default", "zero_residual")


def zero_residual_init(model: nn.Module) -> int:
    """Zero the last convolution of every trainable residual block of the ResNet body; returns how many.

    From random init the frozen batch norms are identities, so nothing normalises the residual
    branches and activations grow block after block. A zero last convolution makes every block
    the identity at the start (the idea of zero-init residuals and Fixup); it still learns, since
    its input is not zero. Blocks whose weights are frozen are left alone (zero would stay zero).
    """
    from torchvision.models.resnet import BasicBlock, Bottleneck

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
        from mrcnn.weights import load_torchvision_weights

        load_torchvision_weights(model, weights)
    elif init == "zero_residual":
        zero_residual_init(model)
    if impl == "torchvision":
        from mrcnn.reference import torchvision_model

        reference = torchvision_model(cfg)
        reference.load_state_dict(model.state_dict(), strict=True)
        return reference
    return model


def _write_metrics(path: Path, record: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def _truncate_metrics(path: Path, step: int) -> None:
    """Keep the records up to ``step`` (a resumed run rewrites what came after its checkpoint)."""
    if not path.is_file():
        return
    kept = [line for line in path.read_text(encoding="utf-8").splitlines() if line and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


def train(
    cfg: Config,
    data_root: str | Path,
    out_dir: str | Path,
    *,
    steps: int | None = None,
    epochs: int | None = None,
    batch_size: int = 2,
    lr: float = 0.02,
    momentum: float = 0.9,
    weight_decay: float = 1e-4,
    optimizer: str = "sgd",
    clip_grad_norm: float = 0.0,
    init: str = "default",
    warmup_iters: int = 1000,
    warmup_factor: float = 0.001,
    lr_steps: Sequence[int] = (),
    gamma: float = 0.1,
    amp: str = "none",
    device: str | None = None,
    seed: int = 0,
    num_workers: int = 0,
    checkpoint_every: int = 0,
    resume: str | Path | None = None,
    eval_every: int = 0,
    eval_at_end: bool = True,
    train_split: str = "train",
    val_split: str | None = "val",
    weights: str | os.PathLike | None = None,
    synth_count: int | None = None,
    progress: bool = True,
    impl: str = "static",
) -> dict[str, Any]:
    """Train ``MaskRCNN(cfg)`` on ``data_root/<train_split>``; write checkpoints and metrics to ``out_dir``.

    Args:
        steps / epochs: run length, exactly one of them; epochs become steps (batches per epoch and rank).
        lr, momentum, weight_decay, warmup_iters, warmup_factor, lr_steps, gamma: the schedule (module
            docstring); ``lr`` is for the whole batch (all ranks), not scaled here.
        optimizer: "sgd" (torchvision's reference) or "adamw" (:func:`build_optimizer`).
        clip_grad_norm: if > 0, clip the gradients' global L2 norm to this before each step.
        init: "default" (torchvision's) or "zero_residual" (:func:`zero_residual_init`), random init only.
        amp: "none" (fp32), "bf16" (autocast, CPU or CUDA) or "fp16" (autocast + GradScaler, CUDA only).
        device: "cpu", "cuda" (each rank takes cuda:LOCAL_RANK); default CUDA when present.
        checkpoint_every: write a checkpoint every this many steps (0: only at the end).
        resume: a checkpoint file, or a folder (its latest checkpoint).
        eval_every: evaluate the val split every this many steps (0: never during training);
            ``eval_at_end`` adds one after the last step. Skipped when the split does not exist.
        weights: torchvision-format state_dict to start from (default: random init from ``seed``).
        synth_count: if set and a split is missing, generate the synthetic data set there
            (``synth_count`` train images, a quarter as many val images).
        impl: "static" (this package's model) or "torchvision" (torchvision's, same initial weights,
            same batches; module docstring).
    Returns:
        ``{"step", "losses" (last step, rank-averaged), "metrics" (last evaluation or {}), "checkpoint"}``.
    Raises:
        NonFiniteLossError: a loss was NaN/inf; the message names the step and the last checkpoint.
    """
    if (steps is None) == (epochs is None):
        raise ValueError("give exactly one of steps and epochs")
    if amp not in AMP_MODES:
        raise ValueError(f"amp must be one of {AMP_MODES}, got {amp!r}")
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if amp == "fp16" and not device.startswith("cuda"):
        raise ValueError("amp='fp16' needs a CUDA device (it uses torch.amp.GradScaler); use amp='bf16' on the CPU")
    info = init_distributed(device)
    try:
        return _train(**{k: v for k, v in locals().items() if k != "info"}, info=info)
    finally:
        if info.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def _train(
    cfg: Config,
    data_root: str | Path,
    out_dir: str | Path,
    *,
    info: DistInfo,
    steps: int | None,
    epochs: int | None,
    batch_size: int,
    lr: float,
    momentum: float,
    weight_decay: float,
    optimizer: str,
    clip_grad_norm: float,
    init: str,
    warmup_iters: int,
    warmup_factor: float,
    lr_steps: Sequence[int],
    gamma: float,
    amp: str,
    device: str,
    seed: int,
    num_workers: int,
    checkpoint_every: int,
    resume: str | Path | None,
    eval_every: int,
    eval_at_end: bool,
    train_split: str,
    val_split: str | None,
    weights: str | os.PathLike | None,
    synth_count: int | None,
    progress: bool,
    impl: str,
) -> dict[str, Any]:
    out = Path(out_dir)
    dev = torch.device(f"cuda:{info.local_rank}" if device == "cuda" else device)
    if info.main:
        out.mkdir(parents=True, exist_ok=True)
        if synth_count is not None:
            ensure_synthetic(data_root, train_split, synth_count, seed)
            if val_split:
                ensure_synthetic(data_root, val_split, max(1, synth_count // 4), seed + 1)
    _barrier(info)

    dataset = CocoDataset.from_config(data_root, train_split, cfg)
    val_dataset = None
    if val_split and (Path(data_root) / "annotations" / f"instances_{val_split}.json").is_file():
        val_dataset = CocoDataset.from_config(data_root, val_split, cfg) if info.main else None
    template = make_loader(
        dataset, cfg, batch_size, shuffle=True, seed=seed, num_replicas=info.world_size, rank=info.rank
    )
    per_epoch = len(template.batch_sampler)
    if per_epoch == 0:
        raise ValueError(f"{data_root}/{train_split} gives no batches")
    total = steps if steps is not None else epochs * per_epoch

    seed_everything(seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = build_model(cfg, weights, impl, init).to(dev).train()
    tv = impl == "torchvision"
    collate_fn = TorchvisionCollate(cfg.max_gt_instances) if tv else None
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(model, lr, momentum, weight_decay, optimizer)
    scheduler = build_scheduler(optimizer, warmup_iters, warmup_factor, lr_steps, gamma)
    scaler = torch.amp.GradScaler("cuda") if amp == "fp16" else None
    seed_everything(seed + 7919 * info.rank)  # per-rank sampling noise

    step, epoch, offset = 0, 0, 0
    metrics_path = out / METRICS_FILE
    last_checkpoint: Path | None = None
    if resume is not None:
        ckpt = load_checkpoint(resume)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        if scaler is not None and ckpt.get("scaler") is not None:
            scaler.load_state_dict(ckpt["scaler"])
        step, epoch, offset = int(ckpt["step"]), int(ckpt["epoch"]), int(ckpt["offset"])
        states = ckpt["rng"]
        if len(states) == info.world_size:
            set_rng_state(states[info.rank])
        elif info.main:
            print(
                f"resume: checkpoint has RNG states of {len(states)} ranks, this run has {info.world_size}; "
                "sampling noise will differ from an uninterrupted run",
                file=sys.stderr,
            )
        if info.main:
            _truncate_metrics(metrics_path, step)
        last_checkpoint = Path(resume) if Path(resume).is_file() else latest_checkpoint(resume)
    elif info.main:
        _truncate_metrics(metrics_path, 0)  # a fresh run into a used folder starts a fresh curve

    ddp_model: nn.Module = model
    if info.distributed:
        ddp_model = nn.parallel.DistributedDataParallel(
            model, device_ids=[dev.index] if dev.type == "cuda" else None, find_unused_parameters=False
        )

    def save(at_step: int) -> Path | None:
        states = [rng_state()]
        if info.distributed:
            states = [None] * info.world_size
            dist.all_gather_object(states, rng_state())
        path = None
        if info.main:
            path = checkpoint_path(out, at_step)
            _atomic_save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "scaler": scaler.state_dict() if scaler is not None else None,
                    "step": at_step,
                    "epoch": epoch,
                    "offset": offset,
                    "rng": states,
                    "world_size": info.world_size,
                    "config": dataclasses.asdict(cfg),
                    "impl": impl,
                },
                path,
            )
        _barrier(info)
        return path

    def run_eval() -> dict[str, float]:
        result: dict[str, float] = {}
        if info.main and val_dataset is not None:
            if tv:
                result = evaluate_torchvision(model, val_dataset, batch_size, dev, amp)
            else:
                result = evaluate(model, val_dataset, cfg, batch_size, dev, amp)
            model.train()
        _barrier(info)
        return result

    bar = tqdm(total=total, initial=step, desc="train", unit="step", disable=not (progress and info.main))
    start_time = time.perf_counter()
    start_cpu = time.process_time()  # this process's CPU seconds, all threads: wall time on a loaded machine misleads
    last_losses: dict[str, float] = {}
    metrics: dict[str, float] = {}
    try:
        while step < total:
            if offset >= per_epoch:
                epoch, offset = epoch + 1, 0
            loader = _epoch_loader(template, epoch, offset, seed, num_workers, collate_fn)
            t_data = time.perf_counter()
            for item in loader:
                t0 = time.perf_counter()
                if tv:
                    images, tv_targets = item
                    gt_count = sum(len(t["labels"]) for t in tv_targets)
                    images = [im.to(dev) for im in images]
                    tv_targets = [{k: v.to(dev) if torch.is_tensor(v) else v for k, v in t.items()} for t in tv_targets]
                    with _autocast(amp, dev):
                        losses = ddp_model(images, tv_targets)
                else:
                    batch, targets, _meta = item
                    if dev.type != "cpu":
                        check_targets(targets, cfg, batch)  # on the host, before the copy (the model checks CPU input)
                    gt_count = int(targets.valid.sum())
                    batch, targets = _to_device(batch, targets, dev)
                    with _autocast(amp, dev):
                        losses = ddp_model(batch, targets)
                stacked = torch.stack([losses[name].float() for name in LOSS_NAMES]).detach()
                gt_counts = torch.zeros(info.world_size, dtype=torch.float64, device=dev)
                gt_counts[info.rank] = gt_count
                if info.distributed:
                    stacked = stacked.clone()
                    dist.all_reduce(stacked)
                    stacked /= info.world_size
                    dist.all_reduce(gt_counts)
                values = stacked.cpu().tolist()
                if not all(math.isfinite(v) for v in values):
                    shown = ", ".join(f"{n}={v:.4g}" for n, v in zip(LOSS_NAMES, values))
                    kept = f"last good checkpoint {last_checkpoint} kept" if last_checkpoint else "no checkpoint yet"
                    raise NonFiniteLossError(f"non-finite loss at step {step + 1} ({shown}); stopping; {kept}")
                total_loss = sum(losses[name] for name in LOSS_NAMES)
                optimizer.zero_grad(set_to_none=True)
                if scaler is not None:
                    scaler.scale(total_loss).backward()
                    if clip_grad_norm:
                        scaler.unscale_(optimizer)
                        nn.utils.clip_grad_norm_(params, clip_grad_norm)
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    total_loss.backward()
                    if clip_grad_norm:
                        nn.utils.clip_grad_norm_(params, clip_grad_norm)
                    optimizer.step()
                lr_now = optimizer.param_groups[0]["lr"]
                scheduler.step()
                step, offset = step + 1, offset + 1

                last_losses = dict(zip(LOSS_NAMES, values))
                record: dict[str, Any] = {
                    "step": step,
                    "epoch": epoch,
                    "loss": sum(values),
                    **last_losses,
                    "lr": lr_now,
                    "step_time": time.perf_counter() - t0,
                    "data_time": t0 - t_data,
                    "time": time.perf_counter() - start_time,
                    "cpu_time": time.process_time() - start_cpu,
                    "gt_instances": [int(c) for c in gt_counts.tolist()],
                }
                bar.update(1)
                bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{lr_now:.3g}")

                if (checkpoint_every and step % checkpoint_every == 0) or step == total:
                    last_checkpoint = save(step) or last_checkpoint
                if (eval_every and step % eval_every == 0) or (eval_at_end and step == total):
                    metrics = run_eval()
                    record.update(metrics)
                if info.main:
                    _write_metrics(metrics_path, record)
                if step >= total:
                    break
                t_data = time.perf_counter()
    finally:
        bar.close()
    return {"step": step, "losses": last_losses, "metrics": metrics, "checkpoint": last_checkpoint}


# ------------------------------------------------------------------------------------------------
# Command line


def _parse_override(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--set expects key=value, got {text!r}")
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        parsed = value
    return key.strip(), parsed


# Flag defaults when no recipe gives a value (the recipe's values win over these, explicit flags over
# both): train()'s own keyword defaults, so the command line and the Python API cannot drift apart.
_RECIPE_FLAGS = ("batch_size", "lr", "momentum", "weight_decay", "optimizer", "clip_grad_norm", "init",
                 "warmup_iters", "warmup_factor", "lr_steps", "gamma", "eval_every")  # fmt: skip
_DEFAULTS: dict[str, Any] = {
    "preset": "tiny",
    **{name: inspect.signature(train).parameters[name].default for name in _RECIPE_FLAGS},
}


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Training options (shared with the ``mrcnn train`` subcommand)."""
    parser.add_argument(
        "--recipe",
        default=None,
        help="named recipe (mrcnn.recipes: tiny, ci): preset, overrides, data, schedule; explicit flags override it",
    )
    parser.add_argument("--impl", choices=IMPLS, default="static", help="static model or torchvision's MaskRCNN")
    parser.add_argument("--preset", default=None, help="config preset (default tiny)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        type=_parse_override,
        metavar="KEY=VALUE",
        help="config override, Python literal values, e.g. --set min_size=256 (repeatable)",
    )
    parser.add_argument(
        "--data",
        default=None,
        type=Path,
        help="COCO-layout data root (with --recipe: the folder its synthetic set is generated under, default data)",
    )
    parser.add_argument(
        "--synth-count",
        type=int,
        default=None,
        help="generate the synthetic set (this many train images, a quarter val) if a split is missing",
    )
    parser.add_argument("--train-split", default="train")
    parser.add_argument("--val-split", default=None, help="evaluated if present (default val); '' for none")
    parser.add_argument("--out", required=True, type=Path, help="checkpoints and metrics.jsonl go here")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, help="optimiser steps (required without --recipe)")
    length.add_argument("--epochs", type=int, help="epochs (turned into steps)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"images per rank and step (default {_DEFAULTS['batch_size']}; a recipe's is split over ranks)",
    )
    parser.add_argument("--lr", type=float, default=None, help=f"default {_DEFAULTS['lr']:g}")
    parser.add_argument("--momentum", type=float, default=None, help=f"default {_DEFAULTS['momentum']:g}")
    parser.add_argument("--weight-decay", type=float, default=None, help=f"default {_DEFAULTS['weight_decay']:g}")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default=None, help=f"default {_DEFAULTS['optimizer']}")
    parser.add_argument("--init", choices=INITS, default=None, help=f"init scheme (default {_DEFAULTS['init']!r})")
    clip = _DEFAULTS["clip_grad_norm"]
    parser.add_argument(
        "--clip-grad-norm", type=float, default=None, help=f"clip the gradient norm (default {clip:g}; 0 is off)"
    )
    parser.add_argument("--warmup-iters", type=int, default=None, help=f"default {_DEFAULTS['warmup_iters']:g}")
    parser.add_argument("--warmup-factor", type=float, default=None, help=f"default {_DEFAULTS['warmup_factor']:g}")
    parser.add_argument("--lr-steps", type=int, nargs="*", default=None, help="milestones, in steps")
    parser.add_argument("--gamma", type=float, default=None, help=f"default {_DEFAULTS['gamma']:g}")
    parser.add_argument("--amp", choices=AMP_MODES, default="none")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=None, help="default 0 (only at the end)")
    parser.add_argument("--no-final-eval", action="store_true")
    parser.add_argument("--resume", default=None, help="checkpoint file, or a folder (its latest checkpoint)")
    parser.add_argument("--weights", default=None, help="torchvision-format state_dict to start from")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def resolve_arguments(args: argparse.Namespace) -> tuple[Config, dict[str, Any]]:
    """The Config and :func:`train` keyword arguments of parsed flags: defaults < recipe < explicit flags."""
    settings = dict(_DEFAULTS)
    overrides: dict[str, Any] = {}
    data = args.data
    synth_count = args.synth_count
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if args.recipe:
        from mrcnn.recipes import get_recipe

        recipe = get_recipe(args.recipe)
        settings.update(recipe.train_kwargs(world_size), preset=recipe.preset)
        overrides.update(recipe.overrides)
        base = data if data is not None else Path("data")
        if int(os.environ.get("RANK", "0")) == 0:
            recipe.prepare_data(base)
        data = recipe.data_root(base)
        if args.epochs is not None:
            settings.pop("steps")
    elif args.steps is None and args.epochs is None:
        raise SystemExit("error: give --steps or --epochs (or a --recipe)")
    if data is None:
        raise SystemExit("error: --data is required without --recipe")
    for key in _DEFAULTS:  # preset and the _RECIPE_FLAGS
        value = getattr(args, key)
        if value is not None:
            settings[key] = value
    if args.steps is not None:
        settings["steps"] = args.steps
    overrides.update(dict(args.overrides))
    cfg = get_config(settings.pop("preset"), **overrides)
    kwargs = {
        **settings,
        "data_root": data,
        "epochs": args.epochs,
        "amp": args.amp,
        "device": args.device,
        "seed": args.seed,
        "num_workers": args.workers,
        "checkpoint_every": args.checkpoint_every,
        "resume": args.resume,
        "eval_at_end": not args.no_final_eval,
        "train_split": args.train_split,
        "val_split": (settings.pop("val_split", "val") if args.val_split is None else args.val_split) or None,
        "weights": args.weights,
        "synth_count": synth_count,
        "progress": not args.quiet,
        "impl": args.impl,
    }
    kwargs.setdefault("steps", None)
    return cfg, kwargs


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg, kwargs = resolve_arguments(args)
    data_root = kwargs.pop("data_root")
    try:
        result = train(cfg, data_root, args.out, **kwargs)
    except NonFiniteLossError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if int(os.environ.get("RANK", "0")) == 0:
        summary = {"step": result["step"], **result["losses"], **result["metrics"]}
        print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in summary.items()}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mrcnn.train", description=__doc__.split("\n")[0])
    return run(add_arguments(parser).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
