"""The harness's cases (names, parsing, a reason for an absent backend), the parity statistics
between two detection sets, and one registered pipeline per compiler."""

from __future__ import annotations

import pytest
import torch

from mrcnn.parity import match_detections
from mrcnn_bench.running import pipelines
from mrcnn_bench.running.cases import CASES, COMPILERS, Case, Workload, parse_cases
from mrcnn_bench.running.parity import aggregate_parity, parity_stats
from mrcnn_bench.running.pipelines import compact


def _dets(boxes, labels, scores, size=(40, 50)) -> dict[str, torch.Tensor]:
    boxes = torch.tensor(boxes, dtype=torch.float32)
    masks = torch.zeros(len(boxes), 1, *size)
    for i, (x1, y1, x2, y2) in enumerate(boxes.int().tolist()):
        masks[i, 0, y1:y2, x1:x2] = 0.9
    return {"boxes": boxes, "labels": torch.tensor(labels), "scores": torch.tensor(scores), "masks": masks}


REF = _dets([[0, 0, 20, 20], [10, 10, 40, 30], [5, 20, 25, 38]], [1, 2, 1], [0.9, 0.8, 0.6])


# ------------------------------------------------------------------------------------------------
# Cases


def test_case_names_and_parsing():
    assert Case("static", compiler="inductor", precision="bf16").name == "static/inductor-bf16"
    assert Case("torchvision", backend="xla").name == "torchvision/xla"
    assert Case("static", compiler="inductor", phase="training").name == "static/inductor-train"
    assert [c.name for c in parse_cases("static/eager,quick")][:2] == ["static/eager", "torchvision/eager"]
    assert all(c.phase == "training" for c in parse_cases("training"))
    with pytest.raises(ValueError, match=r"unknown case\(s\) \['static/nope'\]"):
        parse_cases("static/eager,static/nope")
    with pytest.raises(ValueError, match="export and aoti cases exist for static inference only"):
        Case("torchvision", compiler="aoti")
    with pytest.raises(ValueError, match="image_size"):
        Workload("tiny", (0, 10))


def test_absent_backend_has_a_reason():
    reason = CASES["static/cuda"].skip_reason()
    assert (reason is None) == torch.cuda.is_available()
    if reason:
        assert reason == "no CUDA device"


# ------------------------------------------------------------------------------------------------
# Parity


def test_identical_detections_match_fully():
    s = parity_stats(REF, {k: v.clone() for k, v in REF.items()})
    assert (s["num_ref"], s["num_other"], s["matched"]) == (3, 3, 3)
    assert s["matched_ref"] == s["matched_other"] == 1.0
    assert s["mask_iou_min"] == s["mask_iou_mean"] == 1.0


@pytest.mark.parametrize(("key", "index", "change"), [
    ("boxes", 1, torch.tensor([4.0, 0.0, 4.0, 0.0])),  # IoU 26/34 < 0.9
    ("labels", 0, 2),
    ("scores", 2, -0.03),  # beyond the 0.02 score tolerance
])
def test_a_changed_detection_is_unmatched(key, index, change):
    other = {k: v.clone() for k, v in REF.items()}
    other[key][index] += change
    assert parity_stats(REF, other)["matched"] == 2


def test_boolean_masks_and_aggregation():
    other = compact([REF])[0]  # what the harness keeps of each timed output
    assert other["masks"].dtype == torch.bool
    assert match_detections(REF, other).min_mask_iou == 1.0
    empty = {k: v[:0] for k, v in REF.items()}
    agg = aggregate_parity([parity_stats(REF, other), parity_stats(REF, empty)])
    assert agg["matched_ref"] == pytest.approx(0.5) and agg["matched_other"] == 1.0
    assert aggregate_parity([parity_stats(empty, empty)])["matched_ref"] == 1.0


# ------------------------------------------------------------------------------------------------
# The pipeline registry


def test_every_compiler_has_one_registered_pipeline():
    assert set(pipelines.PIPELINES) == set(COMPILERS)
    with pytest.raises(ValueError, match="already registered"):
        pipelines.register_pipeline("eager")(pipelines.build_eager)


def test_auto_mask_buckets_stage_eager_cpu_rows_and_their_flop_count_only(tiny_weights):
    """With the default "auto" mask buckets the eager CPU row runs staged (as ``predict`` does) and
    the compiled and XLA rows the single graph; each row's FLOPs, counted on an eager CPU stand-in,
    are those of the work the row does, so the staged row's are fewer with few detections."""
    from mrcnn.weights import textured_images
    from mrcnn_bench.running.cases import Row
    from mrcnn_bench.running.context import Context
    from mrcnn_bench.running.probes import auto_staged, case_flops

    overrides = {"box_score_thresh": 0.9}  # a few detections: the staged mask branch runs on 8 slots
    ctx = Context("tiny", overrides, Workload(), tiny_weights, textured_images(((240, 320),), 11), [], 1, 0)
    eager, inductor, xla = (Row(CASES[n]) for n in ("static/eager", "static/inductor", "static/xla"))
    assert [auto_staged(r, ctx) for r in (eager, inductor, xla)] == [True, False, False]
    assert auto_staged(Row(CASES["torchvision/eager"]), ctx) is None
    assert auto_staged(Row(CASES["static/inductor+buckets"]), ctx) is None  # its own buckets
    staged, single = case_flops(eager, ctx), case_flops(inductor, ctx)
    assert 0 < staged < single
    assert case_flops(xla, ctx) == single
