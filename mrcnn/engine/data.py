"""Training data: the synthetic set on demand, and one epoch's loader at a time (for exact resume).

Each epoch's DataLoader draws its worker seeds from its own generator, so building a loader
mid-epoch (after a resume) never disturbs the global RNG, and the batches of an epoch are those
of :class:`mrcnn.data.collate.BucketBatchSampler` for that epoch, whenever the loader is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from mrcnn.data.collate import BucketBatchSampler
from mrcnn.data.synthetic import generate


def annotation_file(root: str | Path, split: str) -> Path:
    """Where a COCO-layout data root keeps ``split``'s annotations."""
    return Path(root) / "annotations" / f"instances_{split}.json"


def ensure_synthetic(root: str | Path, split: str, count: int, seed: int) -> None:
    """Write the synthetic data set's ``split`` under ``root`` unless its annotation file exists."""
    if not annotation_file(root, split).is_file():
        generate(root, count, seed, split, progress=False)


class EpochBatches(Sampler[list[int]]):
    """One epoch of a :class:`BucketBatchSampler`, starting after the first ``start`` batches (resume)."""

    def __init__(self, sampler: BucketBatchSampler, epoch: int, start: int = 0) -> None:
        sampler.set_epoch(epoch)
        self.batches = list(sampler)[start:]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def epoch_loader(
    template: DataLoader,
    epoch: int,
    start: int,
    seed: int,
    num_workers: int,
    collate_fn: Callable[[Any], Any] | None = None,
) -> DataLoader:
    """The rest of ``epoch`` from ``template`` (a :func:`mrcnn.data.collate.make_loader` loader).

    ``collate_fn`` replaces the template's (the torchvision adapter's input format).
    """
    return DataLoader(
        template.dataset,
        batch_sampler=EpochBatches(template.batch_sampler, epoch, start),
        collate_fn=collate_fn or template.collate_fn,
        num_workers=num_workers,
        pin_memory=template.pin_memory,
        generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch),
    )
