"""The speed goals a run is judged by: chosen by its workload, each decided on the per-round ratio
to the row it is set against."""

from __future__ import annotations

import numpy as np
import pytest

from mrcnn_bench.gates.goals import FEW_DETECTIONS_THRESH, speed_goals, target_verdict
from mrcnn_bench.gates.row_stats import useful_fraction
from mrcnn_bench.running.records import Record

STREAM = "stream 472x472,406x507"
FEW = {"box_score_thresh": FEW_DETECTIONS_THRESH}


def rec(case: str, times: list[float], preset: str = "coco_r50_fpn", **fields) -> Record:
    return Record(row=case, case=case, preset=preset, status="ok", times_s=times,
                  median_s=float(np.median(times)), **fields)


def bases(case: str, preset: str, image_size: str = "480x640", overrides=None) -> list[tuple[str, float]]:
    return [(g.base, g.factor) for g in speed_goals(case, preset, image_size, overrides)]


def test_the_workload_chooses_the_goals():
    # COCO size: the static eager default has a goal only where detections are few; inductor's
    # differ between all 100 slots filled and about ten.
    assert bases("static/eager", "coco_r50_fpn") == []
    assert bases("static/eager", "coco_r50_fpn", overrides=FEW) == [("torchvision/eager", 0.9)]
    assert bases("static/inductor", "coco_r50_fpn") == [("torchvision/eager", 0.6), ("torchvision/inductor", 0.8)]
    assert bases("static/inductor", "coco_r50_fpn", overrides=FEW) == [("torchvision/eager", 0.7)]
    assert bases("static/inductor", "coco_r50_fpn", overrides={"box_score_thresh": 0.5}) == []  # no goal set there
    assert bases("static/aoti", "coco_r50_fpn", overrides=FEW) == [("static/inductor", 1.05)]
    # tiny: the stream against torchvision eager, one fixed size against torchvision inductor.
    assert bases("static/inductor", "tiny", STREAM) == [("torchvision/eager", 0.75), ("static/eager", 0.8)]
    assert bases("static/aoti", "tiny", STREAM) == [("static/inductor", 1.05)]
    # Training on tiny: the static step against torchvision's, the compiled one against the eager one.
    assert bases("static/train", "tiny", "240x320") == [("torchvision/train", 1.0)]
    assert bases("static/inductor-train", "tiny", "240x320") == [("static/train", 0.9)]
    assert bases("static/inductor", "tiny", "240x320") == [("torchvision/inductor", 0.8)]
    assert bases("static/inductor", "some_other_preset", STREAM) == bases("static/inductor", "tiny", STREAM)
    assert bases("torchvision/eager", "tiny", STREAM) == []


def test_every_goal_of_a_row_is_judged_on_its_own_base_and_rounds():
    rng = np.random.default_rng(0)
    ruler = list(1.0 + 0.05 * rng.standard_normal(12))
    tv_inductor = [0.9 * t for t in ruler]
    inductor = [0.75 * t for t in ruler]
    rows = {r.case: r for r in (rec("torchvision/eager", ruler), rec("torchvision/inductor", tv_inductor),
                                rec("static/inductor", inductor), rec("static/aoti", [1.1 * t for t in inductor]))}
    for r in rows.values():
        r.parity_matched_ref = r.parity_matched_other = 1.0
        r.mask_iou_mean = 1.0
    text = target_verdict(rows["static/inductor"], rows)
    first, second = text.split("; ")
    assert first.startswith("<= 0.6x tv: missed (0.750x, 95% CI [0.75, 0.75])")
    assert second.startswith("<= 0.8x torchvision/inductor: missed (0.833x, 95% CI")
    assert target_verdict(rows["static/aoti"], rows).startswith("<= 1.05x static/inductor: missed (1.100x, 95% CI")
    del rows["torchvision/inductor"]
    assert target_verdict(rows["static/inductor"], rows).endswith("<= 0.8x torchvision/inductor: not measured")


def test_a_goal_against_torchvision_needs_parity():
    ruler = [1.0] * 6
    rows = {r.case: r for r in (rec("torchvision/eager", ruler), rec("static/eager", [0.5] * 6))}
    rows["static/eager"].parity_matched_ref = 0.5
    rows["static/eager"].parity_matched_other = 1.0
    rows["static/eager"].mask_iou_mean = 1.0
    text = target_verdict(rows["static/eager"], rows, FEW)
    assert text == "<= 0.9x tv: met (0.500x, 95% CI [0.5, 0.5]), parity FAILED"


def test_training_goals_are_throughput():
    step = [2.0] * 8
    rows = {r.case: r for r in (rec("torchvision/train", step, phase="training"),
                                rec("static/inductor-train+buckets", [1.9] * 8, phase="training"))}
    text = target_verdict(rows["static/inductor-train+buckets"], rows)
    assert text == ">= 1.1x torchvision/train throughput: missed (1.053x, step-time ratio 95% CI [0.95, 0.95])"


def test_a_goal_says_what_fraction_of_the_ceiling_it_needs_on_torchvisions_flops():
    # A 400 GFLOP/s machine; torchvision does 100 GFLOP in 1 s, the static graph 130 GFLOP (padding,
    # empty slots) in 0.75 s. Its own FLOPs run at 0.433 of the ceiling, torchvision's work at
    # 100 / 0.75 / 400 = 0.333; the goal, 0.6 s, needs 100 / 0.6 / 400 = 0.417 of it.
    rows = {r.case: r for r in (rec("torchvision/eager", [1.0] * 6, flops=100e9, frac_peak=100 / 400),
                                rec("static/inductor", [0.75] * 6, flops=130e9, frac_peak=130 / 0.75 / 400))}
    assert useful_fraction(rows["static/inductor"], rows["torchvision/eager"]) == pytest.approx(100 / 0.75 / 400)
    assert useful_fraction(rows["torchvision/eager"], rows["torchvision/eager"]) == pytest.approx(0.25)
    text = target_verdict(rows["static/inductor"], rows)
    assert text.startswith("<= 0.6x tv: missed (0.750x, 95% CI [0.75, 0.75], needs 0.42 of the ceiling)")
    # Set against another row, the goal's time is that row's: 1.05 x 0.75 s for AOTInductor.
    rows["static/aoti"] = rec("static/aoti", [0.9] * 6, flops=130e9, frac_peak=130 / 0.9 / 400)
    assert "needs 0.32 of the ceiling" in target_verdict(rows["static/aoti"], rows)  # 100 / 0.7875 / 400
    # Without FLOPs or a ceiling (CUDA rows, old run files) the verdict says nothing of it.
    rows["static/inductor"].frac_peak = float("nan")
    assert "ceiling" not in target_verdict(rows["static/inductor"], rows)


def test_a_training_goal_needs_the_ceiling_of_its_step_time():
    rows = {r.case: r for r in (rec("torchvision/train", [2.0] * 8, phase="training", flops=400e9, frac_peak=0.5),
                                rec("static/inductor-train+buckets", [1.9] * 8, phase="training", flops=440e9,
                                    frac_peak=440 / 1.9 / 400))}
    text = target_verdict(rows["static/inductor-train+buckets"], rows)
    # 1.1x torchvision's throughput: a step of 2.0 / 1.1 s on torchvision's 400 GFLOP.
    assert text.endswith(f"needs {400 / (2.0 / 1.1) / 400:.2f} of the ceiling)")
