"""Statistics of one row of a run: its median, its per-round ratio to another row, its parity, its
speed on the reference's work as a fraction of the machine's ceiling.

Shared by the table (:mod:`mrcnn_bench.reports.report`) and the goals' verdicts (:mod:`mrcnn_bench.gates.goals`).
"""

from __future__ import annotations

import math

from mrcnn_bench.gates.stats import MIN_SAMPLES, paired_ratio_ci
from mrcnn_bench.running.cases import PARITY_MIN_MASK_IOU, PARITY_MIN_MATCHED
from mrcnn_bench.running.records import Record, as_number


def median(rec: Record) -> float:
    """The record's median seconds per call; NaN from fewer than :data:`MIN_SAMPLES` timed calls."""
    return as_number(rec.median_s) if len(rec.times_s) >= MIN_SAMPLES else math.nan


def parity_ok(rec: Record) -> bool:
    """Whether the row's detections matched torchvision eager's, both ways, with the mask IoU required."""
    return (as_number(rec.parity_matched_ref) >= PARITY_MIN_MATCHED and as_number(rec.parity_matched_other)
            >= PARITY_MIN_MATCHED and as_number(rec.mask_iou_mean) >= PARITY_MIN_MASK_IOU)


def paired_ratio(rec: Record, ref: Record | None) -> tuple[float, float, float] | None:
    """(median per-round ratio to the reference row, its 95% bootstrap interval) for rows timed in the
    same rounds; None when the rounds cannot be paired or are too few. The table shows this ratio
    rather than the ratio of the two medians, so that its point estimate is the one the interval is
    for (the two differ when the rows' slow rounds do not coincide)."""
    if ref is None or rec is ref or len(rec.times_s) < MIN_SAMPLES or len(rec.times_s) != len(ref.times_s):
        return None
    return paired_ratio_ci(ref.times_s, rec.times_s)


def useful_ceiling_seconds(rec: Record, ref: Record | None) -> float:
    """Seconds the reference row's FLOPs per call (torchvision's, for the same images) take at the
    full ceiling of ``rec``'s precision: the shortest call of that work the machine allows. NaN
    without a median, FLOPs or a ceiling fraction."""
    if ref is None:
        return math.nan
    own, useful = as_number(rec.flops), as_number(ref.flops)
    if not own > 0 or not useful > 0:
        return math.nan
    # frac_peak = own FLOPs / median / ceiling, so useful FLOPs / ceiling = frac_peak * median * useful / own.
    return as_number(rec.frac_peak) * median(rec) * useful / own


def useful_fraction(rec: Record, ref: Record | None) -> float:
    """The row's speed on useful work as a fraction of the machine's ceiling: the reference row's
    FLOPs per call over this row's median, over the ceiling of the row's precision
    (:func:`useful_ceiling_seconds` / median). Unlike ``frac_peak``, which divides the row's own
    FLOPs, this counts the static graph's padding and empty slots as waste. NaN without a median,
    FLOPs or ceiling."""
    return useful_ceiling_seconds(rec, ref) / median(rec)


def interval_text(interval: tuple[float, float] | None) -> str:
    return "" if interval is None else f"[{interval[0]:.3g}, {interval[1]:.3g}]"
