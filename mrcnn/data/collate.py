"""Static batches: variable-size COCO samples in, fixed-shape ``ImageBatch`` + ``Targets`` out.

Mapillary's PackedSequence idea (pack variable-size items into one static tensor and carry their
sizes beside it) done with padding plus sizes:

- canvas buckets: :class:`BucketBatchSampler` groups images by the smallest ``cfg.canvases``
  bucket that holds them once resized, so a batch never mixes portrait and landscape and each
  batch is padded to the tightest canvas (one compiled graph per bucket);
- ground truth padded to ``cfg.max_gt_instances`` (G) with a ``valid`` mask; crowd annotations are
  never valid training targets; an image with more than G instances keeps its first G (annotation
  order) with a :class:`~mrcnn.data.coco.CocoDataWarning`, and the count is in ``BatchMeta``;
- masks cropped to their boxes at ``cfg.gt_mask_size`` (S) by RoIAlign on the original-resolution
  mask, as torchvision's ``project_masks_on_boxes`` crops its mask targets, then binarised at 0.5;
- an incomplete last batch padded to ``batch_size`` with ``valid=False`` slots, so a compiled
  graph never sees a new batch size.

Collation runs in the DataLoader workers, so the full-resolution masks never cross processes:
only the S x S crops do.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler, Subset
from torchvision.ops import roi_align

from mrcnn.config import Canvas, Config
from mrcnn.data.coco import CocoDataWarning
from mrcnn.structures import ImageBatch, Targets
from mrcnn.transform import resized_size, select_canvas, to_image_batch

Sample = tuple[Tensor, dict[str, Any]]


class BatchMeta(NamedTuple):
    """What a static batch carries besides the model inputs.

    image_ids:     [B] int64, COCO image id of each slot, -1 for padding slots
    num_truncated: [B] int64, instances dropped because the image had more than G
    """

    image_ids: Tensor
    num_truncated: Tensor


def crop_masks_to_boxes(masks: Tensor, boxes: Tensor, size: int) -> Tensor:
    """Crop each full-image mask to its box and resample it to ``size`` x ``size``.

    Args:
        masks: [N, H, W] uint8/bool 0/1 instance masks.
        boxes: [N, 4] float (x1, y1, x2, y2) in the masks' pixel coordinates.
        size: S, the output side.
    Returns:
        [N, S, S] uint8 0/1: RoIAlign (aligned=False, adaptive sampling: torchvision's mask-target
        settings) of the mask inside its box, thresholded at 0.5.
    """
    n, height, width = masks.shape
    out = torch.zeros(n, size, size, dtype=torch.uint8)
    boxes = boxes.float()
    for k in range(n):
        x1, y1, x2, y2 = boxes[k].tolist()
        # RoIAlign on a window one pixel wider than the box on every side reads the same pixels as
        # on the whole mask (bilinear taps reach at most one pixel out), without a float copy of it.
        wx0, wy0 = max(math.floor(x1) - 1, 0), max(math.floor(y1) - 1, 0)
        wx1, wy1 = min(math.ceil(x2) + 2, width), min(math.ceil(y2) + 2, height)
        if wx1 <= wx0 or wy1 <= wy0:
            continue
        window = masks[k, wy0:wy1, wx0:wx1].float()[None, None]
        roi = torch.tensor([[0.0, x1 - wx0, y1 - wy0, x2 - wx0, y2 - wy0]])
        out[k] = (roi_align(window, roi, (size, size), 1.0)[0, 0] >= 0.5).to(torch.uint8)
    return out


def scale_boxes(boxes: Tensor, original_size: tuple[int, int], new_size: tuple[int, int]) -> Tensor:
    """[N, 4] xyxy boxes from an (h, w) image to its resized (h', w') copy, as torchvision's resize_boxes."""
    ratio_h, ratio_w = (
        torch.tensor(s, dtype=torch.float32) / torch.tensor(s_orig, dtype=torch.float32)
        for s, s_orig in zip(new_size, original_size)
    )
    return boxes.float() * torch.stack([ratio_w, ratio_h, ratio_w, ratio_h])


def collate(
    samples: Sequence[Sample], cfg: Config, batch_size: int | None = None
) -> tuple[ImageBatch, Targets, BatchMeta]:
    """Samples from :class:`~mrcnn.data.coco.CocoDataset` -> one static batch.

    Args:
        samples: ``(image [3, h, w] uint8, target)`` pairs; target as CocoDataset returns it
            (boxes [N, 4] xyxy in original pixels, labels [N], masks [N, h, w], iscrowd [N], image_id).
        cfg: gives the canvases, G = ``max_gt_instances`` and S = ``gt_mask_size``.
        batch_size: pad to this many slots (default ``len(samples)``).
    Returns:
        ``ImageBatch`` [B, 3, H, W] on one canvas; ``Targets`` in canvas coordinates: boxes
        [B, G, 4], labels [B, G], masks [B, G, S, S] uint8, valid [B, G]; ``BatchMeta``.
    """
    batch = to_image_batch([image for image, _ in samples], cfg, batch_size)
    b, g, s = batch.tensors.shape[0], cfg.max_gt_instances, cfg.gt_mask_size
    boxes = torch.zeros(b, g, 4)
    labels = torch.zeros(b, g, dtype=torch.int64)
    masks = torch.zeros(b, g, s, s, dtype=torch.uint8)
    valid = torch.zeros(b, g, dtype=torch.bool)
    image_ids = torch.full((b,), -1, dtype=torch.int64)
    num_truncated = torch.zeros(b, dtype=torch.int64)
    for i, (image, target) in enumerate(samples):
        image_id = int(target["image_id"])
        image_ids[i] = image_id
        height, width = image.shape[-2:]
        if target["masks"].shape[-2:] != (height, width):
            raise ValueError(
                f"image id {image_id}: masks are {tuple(target['masks'].shape[-2:])}, image is {(height, width)}"
            )
        keep = torch.ones(len(target["labels"]), dtype=torch.bool)
        if "iscrowd" in target:
            keep &= target["iscrowd"] == 0
        idx = torch.nonzero(keep).flatten()
        if len(idx) > g:
            num_truncated[i] = len(idx) - g
            warnings.warn(
                f"image id {image_id}: {len(idx)} instances, keeping the first {g} (max_gt_instances)",
                CocoDataWarning,
                stacklevel=2,
            )
            idx = idx[:g]
        n = len(idx)
        if n == 0:
            continue
        box = target["boxes"][idx].float()
        masks[i, :n] = crop_masks_to_boxes(target["masks"][idx], box, s)
        new_size = tuple(batch.image_sizes[i].tolist())
        boxes[i, :n] = scale_boxes(box, (height, width), new_size)
        labels[i, :n] = target["labels"][idx]
        valid[i, :n] = True
    device = batch.tensors.device
    targets = Targets(boxes.to(device), labels.to(device), masks.to(device), valid.to(device))
    return batch, targets, BatchMeta(image_ids, num_truncated)


class StaticCollate:
    """Picklable ``collate_fn`` (DataLoader workers) for a fixed ``cfg`` and ``batch_size``."""

    def __init__(self, cfg: Config, batch_size: int) -> None:
        self.cfg = cfg
        self.batch_size = batch_size

    def __call__(self, samples: Sequence[Sample]) -> tuple[ImageBatch, Targets, BatchMeta]:
        return collate(samples, self.cfg, self.batch_size)


def canvas_of(height: int, width: int, cfg: Config) -> Canvas:
    """The smallest canvas bucket that holds an (height, width) image once resized."""
    return select_canvas([resized_size(height, width, cfg)], cfg)


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of dataset indices whose images all fit one canvas bucket.

    Every batch has ``batch_size`` indices except at most one per bucket (the collate pads it),
    or none with ``drop_last``. With ``shuffle``, call :meth:`set_epoch` each epoch, as with
    DistributedSampler. With ``num_replicas`` > 1, each rank gets every num_replicas-th batch;
    the batch list is first extended by repeating its head, so all ranks take the same number of
    steps (as DistributedSampler repeats samples).

    Args:
        sizes: (height, width) of every item before resizing, e.g. ``CocoDataset.sizes``.
    """

    def __init__(
        self,
        sizes: Sequence[tuple[int, int]],
        cfg: Config,
        batch_size: int,
        *,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.seed, self.epoch = seed, 0
        self.num_replicas, self.rank = num_replicas, rank
        self.groups: dict[Canvas, list[int]] = {}
        for index, (h, w) in enumerate(sizes):
            self.groups.setdefault(canvas_of(h, w, cfg), []).append(index)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        batches: list[list[int]] = []
        for canvas in sorted(self.groups):
            indices = self.groups[canvas]
            if self.shuffle:
                indices = [indices[j] for j in torch.randperm(len(indices), generator=gen).tolist()]
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start : start + self.batch_size]
                if len(chunk) == self.batch_size or not self.drop_last:
                    batches.append(chunk)
        if self.shuffle:
            batches = [batches[j] for j in torch.randperm(len(batches), generator=gen).tolist()]
        else:
            batches.sort(key=lambda chunk: chunk[0])  # close to data set order
        if self.num_replicas > 1 and batches:
            per_rank = -(-len(batches) // self.num_replicas)
            batches = (batches * self.num_replicas)[: per_rank * self.num_replicas][self.rank :: self.num_replicas]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


def _dataset_sizes(dataset: Dataset) -> list[tuple[int, int]]:
    if isinstance(dataset, Subset):
        parent = _dataset_sizes(dataset.dataset)
        return [parent[i] for i in dataset.indices]
    sizes = getattr(dataset, "sizes", None)
    if sizes is None:
        raise TypeError(
            f"{type(dataset).__name__} has no 'sizes' ((height, width) per item), which canvas bucketing needs"
        )
    return list(sizes)


def make_loader(
    dataset: Dataset,
    cfg: Config,
    batch_size: int,
    *,
    num_workers: int = 0,
    shuffle: bool = False,
    drop_last: bool = False,
    seed: int = 0,
    num_replicas: int = 1,
    rank: int = 0,
    pin_memory: bool = False,
) -> DataLoader:
    """A DataLoader of static batches ``(ImageBatch, Targets, BatchMeta)``, bucketed by canvas.

    Every batch has exactly ``batch_size`` slots; incomplete ones are padded with ``valid=False``.
    ``dataset`` needs ``sizes`` (CocoDataset, or a Subset of one). With ``shuffle``, call
    ``loader.batch_sampler.set_epoch(epoch)`` each epoch.
    """
    sampler = BucketBatchSampler(
        _dataset_sizes(dataset),
        cfg,
        batch_size,
        shuffle=shuffle,
        drop_last=drop_last,
        seed=seed,
        num_replicas=num_replicas,
        rank=rank,
    )
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=StaticCollate(cfg, batch_size),
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
    )
