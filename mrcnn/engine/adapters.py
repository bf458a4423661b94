"""What differs between training the static model and torchvision's ``MaskRCNN``, behind one interface.

The loop (:mod:`mrcnn.engine.trainer`) asks an :class:`Adapter` how to collate a batch, how to
move it to the device (and count its ground-truth instances), and how to evaluate; the forward is
``model(*batch.inputs)`` for both, returning the five losses.

torchvision's model starts from the same initial weights as the static one
(:func:`mrcnn.engine.build.build_model`), draws the same batches (same sampler, same images per
step) and uses the same optimiser, schedule, AMP and evaluator. Its input is torchvision's own:
each batch is the list of unpadded original images (float in [0, 1]) and a list of target dicts
(boxes in original pixels, labels, full-image masks) with the same instances the static batch
keeps (crowd annotations dropped, at most ``max_gt_instances``); torchvision's
``GeneralizedRCNNTransform`` resizes, normalises and pads them itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mrcnn.config import Config
from mrcnn.data.coco import CocoDataset
from mrcnn.engine.evaluation import evaluate, evaluate_torchvision
from mrcnn.losses import check_targets
from mrcnn.structures import ImageBatch, Targets


@dataclass(frozen=True)
class PreparedBatch:
    """A batch on the training device: ``model(*inputs)`` gives the losses; ``gt_count`` instances in it."""

    inputs: tuple[Any, ...]
    gt_count: int


class Adapter:
    """How the loop feeds and evaluates one implementation (subclasses below)."""

    #: replaces the loader's collate function; None keeps the static batches of ``make_loader``
    collate_fn: Callable[[Sequence[Any]], Any] | None = None

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def prepare(self, item: Any, device: torch.device) -> PreparedBatch:
        """A loader item -> the model's inputs on ``device`` and its ground-truth instance count."""
        raise NotImplementedError

    def evaluate(
        self, model: nn.Module, dataset: CocoDataset, batch_size: int, device: torch.device, amp: str
    ) -> dict[str, float]:
        """COCO ``bbox/*`` and ``segm/*`` metrics of ``model`` on ``dataset`` (leaves it in eval mode)."""
        raise NotImplementedError


class StaticAdapter(Adapter):
    """This package's model: static ``(ImageBatch, Targets, BatchMeta)`` batches."""

    def prepare(self, item: tuple[ImageBatch, Targets, Any], device: torch.device) -> PreparedBatch:
        batch, targets, _meta = item
        gt_count = int(targets.valid.sum())
        if device.type != "cpu":
            check_targets(targets, self.cfg, batch)  # on the host, before the copy (the model checks CPU input)
            batch = ImageBatch(*(t.to(device, non_blocking=True) for t in batch))
            targets = Targets(*(t.to(device, non_blocking=True) for t in targets))
        return PreparedBatch((batch, targets), gt_count)

    def evaluate(
        self, model: nn.Module, dataset: CocoDataset, batch_size: int, device: torch.device, amp: str
    ) -> dict[str, float]:
        return evaluate(model, dataset, self.cfg, batch_size, device, amp)


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


class TorchvisionAdapter(Adapter):
    """torchvision's ``MaskRCNN``: lists of unpadded images and target dicts (:class:`TorchvisionCollate`)."""

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self.collate_fn = TorchvisionCollate(cfg.max_gt_instances)

    def prepare(self, item: tuple[list, list], device: torch.device) -> PreparedBatch:
        images, targets = item
        gt_count = sum(len(t["labels"]) for t in targets)
        images = [im.to(device) for im in images]
        targets = [{k: v.to(device) if torch.is_tensor(v) else v for k, v in t.items()} for t in targets]
        return PreparedBatch((images, targets), gt_count)

    def evaluate(
        self, model: nn.Module, dataset: CocoDataset, batch_size: int, device: torch.device, amp: str
    ) -> dict[str, float]:
        return evaluate_torchvision(model, dataset, batch_size, device, amp)


ADAPTERS: dict[str, type[Adapter]] = {"static": StaticAdapter, "torchvision": TorchvisionAdapter}


def make_adapter(impl: str, cfg: Config) -> Adapter:
    """The adapter of ``impl`` ("static" or "torchvision")."""
    if impl not in ADAPTERS:
        raise ValueError(f"impl must be one of {tuple(ADAPTERS)}, got {impl!r}")
    return ADAPTERS[impl](cfg)
