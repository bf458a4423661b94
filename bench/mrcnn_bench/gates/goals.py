"""The project's speed goals, and whether a run met them.

A goal is a multiple of another row's median in the same interleaved run (training: a multiple of
torchvision's throughput), set per preset and, where the goals differ by workload, per kind of run:
a stream of sizes or one fixed size; all 100 detection slots filled or a score threshold that
leaves about ten. The report prints each row's goals with their verdicts in its ``target`` column.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mrcnn_bench.gates.row_stats import interval_text, median, paired_ratio, parity_ok, useful_ceiling_seconds
from mrcnn_bench.running.cases import REFERENCE, TRAIN_REFERENCE
from mrcnn_bench.running.records import Record, as_number


@dataclass(frozen=True)
class Goal:
    """At most ``factor`` times ``base``'s median time per call or step, in the same run."""

    base: str
    factor: float

    def label(self, training: bool) -> str:
        if training:  # stated as throughput, as the goals are
            return f">= {1 / self.factor:.2g}x {self.base} throughput"
        return f"<= {self.factor:g}x {'tv' if self.base == REFERENCE else self.base}"


# Which runs of a preset a goal is for: (the row's image_size, the run's config overrides) -> bool.
Where = Callable[[str, Mapping[str, Any]], bool]

# The score threshold of the COCO-size workload with realistic detection counts (6 to 13 detections
# on the synthetic weights, where the default threshold fills all 100 slots).
FEW_DETECTIONS_THRESH = 0.75


def _anywhere(image_size: str, overrides: Mapping[str, Any]) -> bool:
    return True


def _stream(image_size: str, overrides: Mapping[str, Any]) -> bool:
    return image_size.startswith("stream ")


def _fixed(image_size: str, overrides: Mapping[str, Any]) -> bool:
    return not _stream(image_size, overrides)


def _all_slots(image_size: str, overrides: Mapping[str, Any]) -> bool:
    return "box_score_thresh" not in overrides


def _few_detections(image_size: str, overrides: Mapping[str, Any]) -> bool:
    return overrides.get("box_score_thresh") == FEW_DETECTIONS_THRESH


TV_INDUCTOR = "torchvision/inductor"
STATIC_INDUCTOR = "static/inductor"
# Training: static inductor at least 1.1x torchvision eager's images/s at COCO settings and 1.8x
# under bf16 autocast (still over torchvision's fp32); on tiny (the main job's rows) the static
# step at most torchvision's, static inductor's at most 0.9x the static eager step's.
_COCO_TRAIN = [
    (_anywhere, "static/inductor-train", Goal(TRAIN_REFERENCE, 1 / 1.1)),
    (_anywhere, "static/inductor-train+buckets", Goal(TRAIN_REFERENCE, 1 / 1.1)),
    (_anywhere, "static/inductor-bf16-train+buckets", Goal(TRAIN_REFERENCE, 1 / 1.8)),
]
GOALS: dict[str, list[tuple[Where, str, Goal]]] = {
    # ResNet-50 FPN at COCO size. All 100 slots: static inductor 0.6x torchvision eager and 0.8x
    # torchvision inductor. About ten detections: static eager (the staged default) 0.9x, static
    # inductor 0.7x (the single graph) and 0.55x with mask buckets. Both: bf16 at most 0.55x fp32
    # under inductor, XLA:CPU at most 1.15x inductor, AOTInductor at most 1.05x inductor.
    "coco_r50_fpn": [
        (_all_slots, STATIC_INDUCTOR, Goal(REFERENCE, 0.6)),
        (_all_slots, STATIC_INDUCTOR, Goal(TV_INDUCTOR, 0.8)),
        (_few_detections, "static/eager", Goal(REFERENCE, 0.9)),
        (_few_detections, STATIC_INDUCTOR, Goal(REFERENCE, 0.7)),
        (_few_detections, "static/inductor+buckets", Goal(REFERENCE, 0.55)),
        (_anywhere, "static/inductor-bf16", Goal(STATIC_INDUCTOR, 0.55)),
        (_anywhere, "static/xla", Goal(STATIC_INDUCTOR, 1.15)),
        (_anywhere, "static/aoti", Goal(STATIC_INDUCTOR, 1.05)),
        *_COCO_TRAIN,
    ],
    # The tiny preset, as the main job runs it. The stream of sizes: static eager 0.9x torchvision
    # eager; inductor 0.75x torchvision eager and 0.8x static eager; AOTInductor within 1.05x
    # inductor. One fixed size, where torchvision compiles too: static eager 0.9x and static
    # inductor 0.8x torchvision inductor. XLA:CPU within 1.5x static eager.
    "tiny": [
        (_stream, "static/eager", Goal(REFERENCE, 0.9)),
        (_stream, STATIC_INDUCTOR, Goal(REFERENCE, 0.75)),
        (_stream, STATIC_INDUCTOR, Goal("static/eager", 0.8)),
        (_stream, "static/aoti", Goal(STATIC_INDUCTOR, 1.05)),
        (_fixed, "static/eager", Goal(TV_INDUCTOR, 0.9)),
        (_fixed, STATIC_INDUCTOR, Goal(TV_INDUCTOR, 0.8)),
        (_anywhere, "static/xla", Goal("static/eager", 1.5)),
        (_anywhere, "static/train", Goal(TRAIN_REFERENCE, 1.0)),
        (_anywhere, "static/inductor-train", Goal("static/train", 0.9)),
    ],
}


def speed_goals(case: str, preset: str, image_size: str = "",
                overrides: Mapping[str, Any] | None = None) -> list[Goal]:
    """The row's goals in a run of ``preset`` (presets not named in :data:`GOALS` take tiny's) with
    the run's config ``overrides``; empty: no goal."""
    rules = GOALS.get(preset, GOALS["tiny"])
    return [goal for where, name, goal in rules if name == case and where(image_size, overrides or {})]


def decision(ratio: float, goal: float, interval: tuple[float, float] | None) -> str:
    """'met' or 'missed' for a time ratio against its goal (at most ``goal``), decided by the 95%
    interval when there is one: 'not decided' when the interval holds the goal."""
    if interval is None:
        return "met" if ratio <= goal + 1e-9 else "missed"
    low, high = interval
    if high <= goal + 1e-9:
        return "met"
    if low > goal + 1e-9:
        return "missed"
    return "not decided (the 95% CI holds the goal)"


def ceiling_needed(rec: Record, goal: Goal, base: Record | None, ref: Record | None) -> float:
    """The fraction of the machine's ceiling the row would run at, on the reference ``ref``'s FLOPs
    (:func:`~mrcnn_bench.gates.row_stats.useful_fraction`) if it took exactly the goal's time: ``factor``
    times ``base``'s median. Above about 0.9 no schedule of those FLOPs reaches the goal on this
    machine; NaN where the row has no ceiling fraction."""
    goal_s = goal.factor * (median(base) if base is not None else math.nan)
    return useful_ceiling_seconds(rec, ref) / goal_s


def goal_verdict(rec: Record, goal: Goal, base: Record | None, ref: Record | None = None) -> str:
    """One goal of the row and whether the run met it: on the per-round ratio to ``base`` with its
    95% interval when the two rows were timed in the same rounds, else on the ratio of the medians,
    with the fraction of the ceiling the goal needs (:func:`ceiling_needed`, on ``ref``'s FLOPs).
    A goal set against a torchvision row also needs parity with torchvision's detections."""
    paired = paired_ratio(rec, base)
    interval = paired[1:] if paired else None
    ratio = paired[0] if paired else median(rec) / (median(base) if base is not None else math.nan)
    training = rec.phase == "training"
    label = goal.label(training)
    if math.isnan(ratio):
        return f"{label}: not measured"
    text_ci = interval_text(interval)
    needed = ceiling_needed(rec, goal, base, ref)
    needs = "" if math.isnan(needed) else f", needs {needed:.2f} of the ceiling"
    if training:
        step = f", step-time ratio 95% CI {text_ci}" if text_ci else ""
        return f"{label}: {decision(ratio, goal.factor, interval)} ({1 / ratio:.3f}x{step}{needs})"
    ci = f", 95% CI {text_ci}" if text_ci else ""
    text = f"{label}: {decision(ratio, goal.factor, interval)} ({ratio:.3f}x{ci}{needs})"
    if goal.base.startswith("torchvision/") and not parity_ok(rec):
        text += ", parity FAILED" if not math.isnan(as_number(rec.parity_matched_ref)) else ", parity not checked"
    return text


def target_verdict(rec: Record, by_case: Mapping[str, Record], overrides: Mapping[str, Any] | None = None) -> str:
    """The row's goals (:func:`speed_goals`) with their verdicts, '; '-separated; '' without a goal."""
    goals = speed_goals(rec.case, rec.preset, rec.image_size, overrides)
    ref = by_case.get(TRAIN_REFERENCE if rec.phase == "training" else REFERENCE)
    return "; ".join(goal_verdict(rec, goal, by_case.get(goal.base), ref) for goal in goals)
