"""Off-graph post-processing: fixed-shape Detections -> torchvision-style list[dict].

This is the one step whose output size depends on the data (the number of valid detections and
the original image size), so it runs on the host after the graph, exactly as torchvision's
``GeneralizedRCNNTransform.postprocess`` does: boxes rescaled to the original image, and masks
pasted at the original size with torchvision's own paste.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.models.detection.roi_heads import paste_masks_in_image

from mrcnn.structures import Detections, ImageBatch


def postprocess(det: Detections, batch: ImageBatch, mask_threshold: float | None = None) -> list[dict[str, Tensor]]:
    """One dict per valid image: boxes [N, 4], scores [N], labels [N], masks [N, 1, h, w].

    Masks are probabilities, as torchvision returns them, unless ``mask_threshold`` is given, in
    which case they are uint8 0/1.
    """
    det = Detections(*(t.detach().cpu() for t in det))
    image_sizes, original_sizes = batch.image_sizes.cpu(), batch.original_sizes.cpu()
    results = []
    for i in torch.nonzero(batch.valid.cpu()).flatten().tolist():
        keep = det.valid[i]
        (rh, rw), (oh, ow) = image_sizes[i].tolist(), original_sizes[i].tolist()
        # Same arithmetic as torchvision's resize_boxes: per-axis float32 ratios.
        ratio = torch.tensor([ow, oh, ow, oh], dtype=torch.float32) / torch.tensor(
            [rw, rh, rw, rh], dtype=torch.float32
        )
        boxes = det.boxes[i][keep].float() * ratio
        masks = paste_masks_in_image(det.masks[i][keep][:, None].float(), boxes, (oh, ow))
        if mask_threshold is not None:
            masks = (masks > mask_threshold).to(torch.uint8)
        results.append(
            {"boxes": boxes, "scores": det.scores[i][keep].float(), "labels": det.labels[i][keep], "masks": masks}
        )
    return results
