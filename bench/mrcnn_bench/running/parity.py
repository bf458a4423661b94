"""Parity of a row's detections with the reference row's, per image and pooled over a run."""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from mrcnn.parity import match_detections


def parity_stats(ref: dict[str, Tensor], other: dict[str, Tensor]) -> dict[str, Any]:
    """Partner statistics of ``other``'s detections against ``ref``'s, for one image.

    A partner has the same label, box IoU >= 0.9 and |score difference| <= 0.02 (see
    :func:`mrcnn.parity.match_detections`). Masks may be probabilities or booleans [N, 1, h, w];
    they are compared after thresholding at 0.5.

    Returns a dict: num_ref, num_other, matched, matched_ref and matched_other (fractions, 1.0 when
    both sides are empty), mask_iou_mean and mask_iou_min (NaN without a matched pair), mask_ious.
    """
    p = match_detections(ref, other)
    ious = [float(x) for x in p.mask_ious]
    return {
        "num_ref": p.num_ref,
        "num_other": p.num_other,
        "matched": p.matched,
        "matched_ref": p.ref_matched,
        "matched_other": p.other_matched,
        "mask_iou_mean": sum(ious) / len(ious) if ious else math.nan,
        "mask_iou_min": min(ious) if ious else math.nan,
        "mask_ious": ious,
    }


def aggregate_parity(per_image: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool :func:`parity_stats` over images: fractions of all detections, IoU over all pairs."""
    if not per_image:
        return {"images": 0, "matched_ref": math.nan, "matched_other": math.nan,
                "mask_iou_mean": math.nan, "mask_iou_min": math.nan}
    n_ref = sum(s["num_ref"] for s in per_image)
    n_other = sum(s["num_other"] for s in per_image)
    matched = sum(s["matched"] for s in per_image)
    ious = [x for s in per_image for x in s["mask_ious"]]
    return {
        "images": len(per_image),
        "num_ref": n_ref,
        "num_other": n_other,
        "matched": matched,
        "matched_ref": matched / n_ref if n_ref else float(n_other == 0),
        "matched_other": matched / n_other if n_other else float(n_ref == 0),
        "mask_iou_mean": sum(ious) / len(ious) if ious else math.nan,
        "mask_iou_min": min(ious) if ious else math.nan,
    }
