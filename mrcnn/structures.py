"""Fixed-shape containers passed between stages.

Every tensor here has a shape set by the config and the batch size, never by the image content:
what varies from image to image is carried in ``valid`` masks and size tensors. They are
NamedTuples so torch.compile, torch.export and pytree utilities see through them.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class ImageBatch(NamedTuple):
    """Images normalised and zero-padded to one canvas bucket.

    tensors:        [B, 3, H, W] float, normalised; zero outside each image's resized extent
    image_sizes:    [B, 2] int64, (height, width) of each resized image inside the canvas
    original_sizes: [B, 2] int64, (height, width) of each image as given (for post-processing)
    valid:          [B] bool, False for slots that only pad an incomplete batch
    """

    tensors: Tensor
    image_sizes: Tensor
    original_sizes: Tensor
    valid: Tensor


def canvas_of(batch: ImageBatch) -> tuple[int, int]:
    """The (height, width) of the batch's canvas."""
    return (batch.tensors.shape[-2], batch.tensors.shape[-1])


class Targets(NamedTuple):
    """Ground truth padded to ``max_gt_instances`` (G) per image, in canvas coordinates.

    boxes:  [B, G, 4] float (x1, y1, x2, y2)
    labels: [B, G] int64, 0 in padded slots
    masks:  [B, G, S, S] uint8, each instance mask cropped to its box at ``gt_mask_size`` (S)
    valid:  [B, G] bool, real instances (crowd annotations are not valid training targets)
    """

    boxes: Tensor
    labels: Tensor
    masks: Tensor
    valid: Tensor


class Proposals(NamedTuple):
    """RPN output: P boxes per image (P = post-NMS top-n), highest objectness first.

    boxes:  [B, P, 4] float, canvas coordinates clipped to the image
    scores: [B, P] float, objectness probability
    valid:  [B, P] bool
    """

    boxes: Tensor
    scores: Tensor
    valid: Tensor


class BoxDetections(NamedTuple):
    """Box branch output, before the mask branch: K detections per image, best first.

    boxes:  [B, K, 4] float, canvas coordinates
    scores: [B, K] float
    labels: [B, K] int64
    valid:  [B, K] bool; padded slots have score 0 and label 0
    """

    boxes: Tensor
    scores: Tensor
    labels: Tensor
    valid: Tensor


class Detections(NamedTuple):
    """Model output: K detections per image (K = ``box_detections_per_img``), best first.

    boxes:  [B, K, 4] float, resized-image (canvas) coordinates
    scores: [B, K] float
    labels: [B, K] int64
    masks:  [B, K, M, M] float mask probabilities inside each box (M = ``mask_size``)
    valid:  [B, K] bool; padded slots have score 0 and label 0
    """

    boxes: Tensor
    scores: Tensor
    labels: Tensor
    masks: Tensor
    valid: Tensor


class MaskTrainingRoIs(NamedTuple):
    """The mask branch's training slots: the first m of the box sampler's, sampled positives first.

    boxes:    [B, m, 4] float, canvas coordinates; an empty box in padding slots
    labels:   [B, m] int64, the matched ground truth's class (0 where not positive)
    gt_index: [B, m] int64, the matched ground-truth slot
    positive: [B, m] bool, the slots the mask loss counts

    Any prefix that holds every image's positives gives the same mask loss.
    """

    boxes: Tensor
    labels: Tensor
    gt_index: Tensor
    positive: Tensor
