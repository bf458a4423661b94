"""Parity between two sets of torchvision-style detections (the oracle check of this project).

A detection of one set has a partner in the other when it has the same label, box IoU of at least
``iou_min`` and a score within ``score_tol``. Partners are assigned greedily, best score first, one
to one. Pasted masks of partners are compared by IoU after thresholding at 0.5.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torchvision.ops.boxes as tv_boxes
from torch import Tensor
from torchvision.ops import box_iou, nms


@dataclass(frozen=True)
class Parity:
    """How well ``other`` reproduces ``ref`` for one image."""

    num_ref: int
    num_other: int
    matched: int
    mask_ious: Tensor  # [matched] IoU of the pasted masks of each partner pair

    @property
    def ref_matched(self) -> float:
        """Fraction of the reference's detections that found a partner (1.0 when both are empty)."""
        return self.matched / self.num_ref if self.num_ref else float(self.num_other == 0)

    @property
    def other_matched(self) -> float:
        return self.matched / self.num_other if self.num_other else float(self.num_ref == 0)

    @property
    def min_mask_iou(self) -> float:
        return float(self.mask_ious.min()) if self.mask_ious.numel() else 1.0


def match_detections(
    ref: dict[str, Tensor], other: dict[str, Tensor], iou_min: float = 0.9, score_tol: float = 0.02
) -> Parity:
    """Greedy one-to-one partners between two torchvision-style detection dicts of one image."""
    n_ref, n_other = len(ref["boxes"]), len(other["boxes"])
    if n_ref == 0 or n_other == 0:
        return Parity(n_ref, n_other, 0, torch.zeros(0))
    iou = box_iou(ref["boxes"].float(), other["boxes"].float())
    ok = (
        (ref["labels"][:, None] == other["labels"][None, :])
        & (iou >= iou_min)
        & ((ref["scores"][:, None].float() - other["scores"][None, :].float()).abs() <= score_tol)
    )
    taken = torch.zeros(n_other, dtype=torch.bool)
    pairs = []
    for i in torch.argsort(ref["scores"], descending=True).tolist():
        candidates = ok[i] & ~taken
        if bool(candidates.any()):
            j = int(torch.where(candidates, iou[i], torch.full_like(iou[i], -1.0)).argmax())
            taken[j] = True
            pairs.append((i, j))
    mask_ious = (
        torch.tensor([_mask_iou(ref["masks"][i], other["masks"][j]) for i, j in pairs])
        if ("masks" in ref and "masks" in other)
        else torch.zeros(0)
    )
    return Parity(n_ref, n_other, len(pairs), mask_ious)


def _mask_iou(a: Tensor, b: Tensor) -> float:
    a, b = a > 0.5, b > 0.5
    union = (a | b).sum()
    return float((a & b).sum() / union) if union > 0 else 1.0


@contextlib.contextmanager
def torchvision_stable_ties() -> Iterator[None]:
    """Within the block, torchvision's ``batched_nms`` orders equal scores by index.

    On the CPU, ``batched_nms`` with more than 1000 boxes runs NMS class by class and merges the
    kept boxes with an unstable sort (``std::sort``), so the order of exactly equal scores, and
    which of them survive a ``[:post_nms_top_n]`` or ``[:detections_per_img]`` cut, is whatever
    that sort leaves. Saturated sigmoid objectness (every score 1.0 in fp32) makes the RPN's
    proposals depend on it entirely. The static model's pure-tensor NMS breaks ties by index, a
    rule that can be stated; this makes torchvision follow the same rule, changing nothing else
    (the kept set of each class and the order of distinct scores are the same).
    """
    shipped = tv_boxes._batched_nms_vanilla

    def per_class_then_stable(boxes: Tensor, scores: Tensor, idxs: Tensor, iou_threshold: float) -> Tensor:
        kept = torch.zeros_like(scores, dtype=torch.bool)
        for label in torch.unique(idxs):
            members = (idxs == label).nonzero().squeeze(1)
            kept[members[nms(boxes[members], scores[members], iou_threshold)]] = True
        survivors = kept.nonzero().squeeze(1)
        return survivors[torch.sort(scores[survivors], descending=True, stable=True).indices]

    tv_boxes._batched_nms_vanilla = per_class_then_stable
    try:
        yield
    finally:
        tv_boxes._batched_nms_vanilla = shipped


def same_detections(a: dict[str, Tensor], b: dict[str, Tensor]) -> bool:
    """True when two detection dicts of one image hold the same boxes, scores and labels, in order."""
    return all(torch.equal(a[k], b[k]) for k in ("boxes", "scores", "labels"))
