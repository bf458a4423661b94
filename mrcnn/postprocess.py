"""Off-graph post-processing: fixed-shape Detections -> torchvision-style list[dict].

This is the one step whose output size depends on the data (the number of valid detections and
the original image size), so it runs on the host after the graph, exactly as torchvision's
``GeneralizedRCNNTransform.postprocess`` does: boxes rescaled to the original image, and masks
pasted at the original size with torchvision's own paste.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor
from torchvision.models.detection.roi_heads import paste_masks_in_image

from mrcnn.structures import Detections, ImageBatch


class ImageDetections(NamedTuple):
    """The valid detections of one image, boxes already in original-image coordinates."""

    index: int  # slot in the batch
    boxes: Tensor  # [N, 4] float32, original-image coordinates
    scores: Tensor  # [N]
    labels: Tensor  # [N]
    masks: Tensor  # [N, M, M] mask probabilities inside each box
    original_size: tuple[int, int]  # (height, width)


def per_image(det: Detections, batch: ImageBatch) -> Iterator[ImageDetections]:
    """Valid images of a batch and their valid detections, on the CPU, boxes rescaled to the image."""
    det = Detections(*(t.detach().cpu() for t in det))
    image_sizes, original_sizes = batch.image_sizes.cpu(), batch.original_sizes.cpu()
    for i in torch.nonzero(batch.valid.cpu()).flatten().tolist():
        keep = det.valid[i]
        (rh, rw), (oh, ow) = image_sizes[i].tolist(), original_sizes[i].tolist()
        # Same arithmetic as torchvision's resize_boxes: per-axis float32 ratios.
        ratio = torch.tensor([ow, oh, ow, oh], dtype=torch.float32) / torch.tensor(
            [rw, rh, rw, rh], dtype=torch.float32
        )
        yield ImageDetections(
            i,
            det.boxes[i][keep].float() * ratio,
            det.scores[i][keep].float(),
            det.labels[i][keep],
            det.masks[i][keep],
            (oh, ow),
        )


def postprocess(det: Detections, batch: ImageBatch, mask_threshold: float | None = None) -> list[dict[str, Tensor]]:
    """One dict per valid image: boxes [N, 4], scores [N], labels [N], masks [N, 1, h, w].

    Masks are probabilities, as torchvision returns them, unless ``mask_threshold`` is given, in
    which case they are uint8 0/1.
    """
    results = []
    for d in per_image(det, batch):
        masks = paste_masks_in_image(d.masks[:, None].float(), d.boxes, d.original_size)
        if mask_threshold is not None:
            masks = (masks > mask_threshold).to(torch.uint8)
        results.append({"boxes": d.boxes, "scores": d.scores, "labels": d.labels, "masks": masks})
    return results
