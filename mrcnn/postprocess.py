"""Off-graph post-processing: fixed-shape Detections -> torchvision-style list[dict].

This is the one step whose output size depends on the data (the number of valid detections and
the original image size), so it runs on the host after the graph, exactly as torchvision's
``GeneralizedRCNNTransform.postprocess`` does: boxes rescaled to the original image, and masks
pasted at the original size with the values of torchvision's own paste
(:func:`paste_masks`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.models.detection.roi_heads import expand_boxes, expand_masks

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


class PasteWindow(NamedTuple):
    """Where torchvision's paste puts one mask: the size it resizes the padded mask to, and which of
    its rows and columns land on which rows and columns of the image."""

    size: tuple[int, int]  # (h, w) of the resized mask
    image: tuple[slice, slice]  # rows, columns of the image covered
    mask: tuple[slice, slice]  # rows, columns of the resized mask that land there


def paste_window(box: list[int], height: int, width: int) -> PasteWindow | None:
    """The window of integer ``box`` (x0, y0, x1, y1; torchvision's expanded box) in an image of
    ``height`` x ``width``; None where it covers no pixel of the image."""
    bx0, by0, bx1, by1 = box
    # torchvision treats integer corners as inclusive: the box spans bx1 - bx0 + 1 pixels.
    w, h = max(bx1 - bx0 + 1, 1), max(by1 - by0 + 1, 1)
    x0, x1 = max(bx0, 0), min(bx1 + 1, width)
    y0, y1 = max(by0, 0), min(by1 + 1, height)
    if x1 <= x0 or y1 <= y0:
        return None
    return PasteWindow((h, w), (slice(y0, y1), slice(x0, x1)), (slice(y0 - by0, y1 - by0), slice(x0 - bx0, x1 - bx0)))


def padded_masks(masks: Tensor, boxes: Tensor, padding: int = 1) -> tuple[Tensor, list[list[int]]]:
    """torchvision's first step of the paste: [N, M, M] masks padded by ``padding`` on each side
    -> [N, 1, M + 2p, M + 2p] float, and the [N, 4] boxes grown to match, as integer corners."""
    padded, scale = expand_masks(masks[:, None].float(), padding=padding)
    return padded, expand_boxes(boxes.float(), scale).to(torch.int64).tolist()


def resized_window(mask: Tensor, window: PasteWindow) -> Tensor:
    """The part of one [1, m, m] padded mask that lands in the image, bilinearly resized to its
    box as torchvision resizes it: [rows, columns] of ``window.image``."""
    return F.interpolate(mask[None], size=window.size, mode="bilinear", align_corners=False)[0, 0][window.mask]


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run tiny tensor ops on one intra-op thread.

    Each per-mask op of a paste touches a few thousand pixels. Handing that to a thread pool costs
    more than the work, and far more on a busy machine.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def paste_masks(masks: Tensor, boxes: Tensor, image_size: tuple[int, int], padding: int = 1) -> Tensor:
    """[N, M, M] mask probabilities -> [N, 1, H, W], each pasted into its box of an H x W image.

    The values of torchvision's ``paste_masks_in_image`` to the bit (the same padding, box
    expansion, integer corners and bilinear resize), written straight into one zeroed output:
    torchvision builds N full-size images and stacks them, which reads and writes every pixel
    once more, and indexes its boxes tensor element by element.

    Args:
        masks: [N, M, M] float probabilities.
        boxes: [N, 4] float (x1, y1, x2, y2) in the image's pixels.
        image_size: (H, W) of the image.
    """
    height, width = image_size
    out = torch.zeros((masks.shape[0], 1, height, width), dtype=torch.float32, device=masks.device)
    if masks.shape[0] == 0:
        return out
    padded, int_boxes = padded_masks(masks, boxes, padding)
    with single_thread():
        for pasted, mask, box in zip(out, padded, int_boxes):
            window = paste_window(box, height, width)
            if window is not None:
                pasted[0][window.image] = resized_window(mask, window)
    return out


def postprocess(det: Detections, batch: ImageBatch, mask_threshold: float | None = None) -> list[dict[str, Tensor]]:
    """One dict per valid image: boxes [N, 4], scores [N], labels [N], masks [N, 1, h, w].

    Masks are probabilities, as torchvision returns them, unless ``mask_threshold`` is given, in
    which case they are uint8 0/1.
    """
    results = []
    for d in per_image(det, batch):
        masks = paste_masks(d.masks, d.boxes, d.original_size)
        if mask_threshold is not None:
            masks = (masks > mask_threshold).to(torch.uint8)
        results.append({"boxes": d.boxes, "scores": d.scores, "labels": d.labels, "masks": masks})
    return results
