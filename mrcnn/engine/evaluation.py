"""COCO box and mask metrics of a model on a data set, for the static model and torchvision's.

Both score with the same :class:`mrcnn.evaluate.CocoEvaluator`, in one process; the model is left
in eval mode. The static model reads the set's static batches; torchvision's reads the val images
in order as [3, h, w] floats in [0, 1] (its own transform resizes and pads them) and returns
detections in original-image coordinates.
"""

from __future__ import annotations

import torch
from torch import nn

from mrcnn.config import Config
from mrcnn.data.coco import CocoDataset
from mrcnn.data.collate import make_loader
from mrcnn.engine.precision import eval_autocast
from mrcnn.evaluate import CocoEvaluator
from mrcnn.model import MaskRCNN
from mrcnn.structures import ImageBatch


@torch.no_grad()
def evaluate(
    model: MaskRCNN, dataset: CocoDataset, cfg: Config, batch_size: int, device: torch.device, amp: str = "none"
) -> dict[str, float]:
    """COCO metrics (``bbox/*``, ``segm/*``) of the static ``model`` on ``dataset``."""
    model.eval()
    evaluator = CocoEvaluator(dataset.coco, dataset.label_to_category_id)
    for batch, _, meta in make_loader(dataset, cfg, batch_size):
        on_device = ImageBatch(*(t.to(device) for t in batch)) if device.type != "cpu" else batch
        with eval_autocast(amp, device):
            det = model(on_device)
        det = type(det)(*(t.float().cpu() if t.is_floating_point() else t.cpu() for t in det))
        evaluator.update_detections(det, batch, meta.image_ids)
    return evaluator.summarize()


@torch.no_grad()
def evaluate_torchvision(
    model: nn.Module, dataset: CocoDataset, batch_size: int, device: torch.device, amp: str = "none"
) -> dict[str, float]:
    """:func:`evaluate` for torchvision's ``MaskRCNN``: the val images in order, its own transform."""
    model.eval()
    evaluator = CocoEvaluator(dataset.coco, dataset.label_to_category_id)
    for start in range(0, len(dataset), batch_size):
        samples = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        images = [(image.float() / 255.0).to(device) for image, _ in samples]
        with eval_autocast(amp, device):
            outputs = model(images)
        outputs = [{k: (v.float() if v.is_floating_point() else v).cpu() for k, v in o.items()} for o in outputs]
        evaluator.update(outputs, [int(t["image_id"]) for _, t in samples])
    return evaluator.summarize()
