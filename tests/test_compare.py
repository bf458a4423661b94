"""The comparison harness: parity statistics, the CLI's table and files, and the bounded worker."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from mrcnn import compare
from mrcnn.compare import BoundedRow, RowResult, RowTimeout, match_detections, parity_stats


def _dets(boxes, labels, scores, size=(40, 50)) -> dict[str, torch.Tensor]:
    boxes = torch.tensor(boxes, dtype=torch.float32)
    masks = torch.zeros(len(boxes), 1, *size)
    for i, (x1, y1, x2, y2) in enumerate(boxes.int().tolist()):
        masks[i, 0, y1:y2, x1:x2] = 0.9
    return {"boxes": boxes, "labels": torch.tensor(labels), "scores": torch.tensor(scores), "masks": masks}


REF = _dets([[0, 0, 20, 20], [10, 10, 40, 30], [5, 20, 25, 38]], [1, 2, 1], [0.9, 0.8, 0.6])


def test_identical_detections_match_fully():
    s = parity_stats(REF, {k: v.clone() for k, v in REF.items()})
    assert (s["num_ref"], s["num_other"], s["matched"]) == (3, 3, 3)
    assert s["matched_ref"] == s["matched_other"] == 1.0
    assert s["mask_iou_min"] == s["mask_iou_mean"] == 1.0


def test_shifted_box_is_unmatched():
    other = {k: v.clone() for k, v in REF.items()}
    other["boxes"][1] += torch.tensor([4.0, 0.0, 4.0, 0.0])  # IoU 26/34 < 0.9
    s = parity_stats(REF, other)
    assert s["matched"] == 2 and s["matched_ref"] == pytest.approx(2 / 3)


def test_label_change_is_unmatched():
    other = {k: v.clone() for k, v in REF.items()}
    other["labels"][0] = 3
    assert parity_stats(REF, other)["matched"] == 2


def test_score_difference_above_tolerance_is_unmatched():
    other = {k: v.clone() for k, v in REF.items()}
    other["scores"][2] -= 0.03
    assert parity_stats(REF, other)["matched"] == 2
    other["scores"][2] = REF["scores"][2] - 0.01
    assert parity_stats(REF, other)["matched"] == 3


def test_boolean_masks_and_aggregation():
    other = compare.compact([REF])[0]  # what the harness keeps of each timed output
    assert other["masks"].dtype == torch.bool
    assert match_detections(REF, other).min_mask_iou == 1.0
    empty = {k: v[:0] for k, v in REF.items()}
    agg = compare.aggregate_parity([parity_stats(REF, other), parity_stats(REF, empty)])
    assert agg["matched_ref"] == pytest.approx(0.5) and agg["matched_other"] == 1.0
    assert compare.aggregate_parity([parity_stats(empty, empty)])["matched_ref"] == 1.0


def test_cli_table_and_files(tmp_path, capsys, tiny_weights):
    weights = tmp_path / "weights.pt"
    torch.save(tiny_weights, weights)
    out = tmp_path / "out"
    code = compare.main([
        "--preset", "tiny", "--rows", "torchvision/eager,static/eager", "--rounds", "2", "--images", "1",
        "--weights", str(weights), "--out", str(out), "--name", "t", "--no-progress", "--peak-reps", "1",
    ])
    assert code == 0
    table = capsys.readouterr().out
    header = next(line for line in table.splitlines() if line.startswith("| row"))
    for column in ("ratio_vs_tv", "median_s", "parity_matched_tv", "gflops", "frac_peak"):
        assert column in header
    lines = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "torchvision/eager" in lines and "static/eager" in lines
    assert lines["static/eager"].count("100.0%") == 2  # both directions of parity
    assert {p.name for p in out.iterdir()} == {"t.json", "t.md", "t.csv"}
    data = json.loads((out / "t.json").read_text())
    rows = {r["row"]: r for r in data["rows"]}
    assert len(rows["static/eager"]["times_s"]) == 2 and rows["static/eager"]["status"] == "ok"
    assert rows["static/eager"]["parity"]["matched_ref"] == 1.0
    assert data["environment"]["threads"] >= 1 and data["environment"]["torch"] == torch.__version__
    assert data["flops"]["static"] > 1e9 and data["peaks"]["matmul_fp32"] > 0
    assert "static/eager" in (out / "t.md").read_text() and "ratio_vs_tv" in (out / "t.csv").read_text()


def test_unknown_row_is_a_clear_error(capsys):
    with pytest.raises(ValueError, match="unknown row"):
        compare.parse_rows("static/eager,static/nope")
    assert compare.main(["--rows", "static/nope"]) == 2
    assert "unknown row(s) ['static/nope']" in capsys.readouterr().err


def test_absent_backend_is_reported_as_skipped():
    cuda = compare.ROWS["static/cuda"]
    reason = compare.row_unavailable(cuda)
    assert (reason is None) == torch.cuda.is_available()
    report = {
        "rows": [RowResult(compare.ROWS["torchvision/xla"], status="timeout", detail="> 1 s (in set-up)"),
                 RowResult(cuda, status="skipped", detail="no CUDA device")],
        "peaks": {"matmul_fp32": 1.0, "conv3x3_fp32": 1.0, "matmul_bf16": 1.0, "conv3x3_bf16": 1.0},
        "flops": {}, "options": {"rounds": 1, "warmup": 1}, "limit_s": 1.0, "preset": "tiny",
        "images": [{"size": [1, 1], "canvas": [32, 32]}], "weights": "-", "total_s": 0.0,
        "environment": dict(threads=1, seed=0, torch="", torchvision="", torch_xla="", commit=None),
    }
    table = compare.format_table(report)
    assert "skipped: no CUDA device" in table and "> 1 s" in table


def test_bounded_worker_is_killed_at_its_time_limit(tmp_path):
    (tmp_path / "context.json").write_text(json.dumps({"preset": "tiny", "threads": 1, "seed": 0}))
    row = BoundedRow(compare._TEST_ROWS["test/hang"], tmp_path, limit=1.0)
    start = time.monotonic()
    with pytest.raises(RowTimeout, match=r"> 1 s"):
        row.setup()
    assert time.monotonic() - start < 30
    assert row.proc is not None and row.proc.poll() is not None  # the worker is gone
    row.close()
    assert math.isnan(row.setup_s)


class _Sleep(torch.nn.Module):
    def __init__(self, seconds: float = 0.0, **children: torch.nn.Module) -> None:
        super().__init__()
        self.seconds = seconds
        for name, child in children.items():
            self.add_module(name, child)

    def forward(self, x):
        time.sleep(self.seconds)
        for child in self.children():
            x = child(x)
        return x


def test_stage_times_split_a_call_into_stages():
    """A toy model with the stage names: each stage's own time, rests as differences, the outside."""
    model = _Sleep(
        backbone=_Sleep(body=_Sleep(0.02), fpn=_Sleep(0.01)),
        rpn=_Sleep(0.01, head=_Sleep(0.02)),
        roi_heads=_Sleep(0.01, box_head=_Sleep(), box_predictor=_Sleep(), mask_head=_Sleep(0.02),
                         mask_predictor=_Sleep()),
    )
    times = compare.stage_times({"toy": (model, lambda: (time.sleep(0.03), model(0)))}, reps=1)["toy"]
    assert times["backbone: ResNet body"] == pytest.approx(0.02, abs=0.01)
    assert times["RPN head (convs)"] == pytest.approx(0.02, abs=0.01)
    assert times["RPN rest: anchors, top-k, decode, NMS"] == pytest.approx(0.01, abs=0.01)
    assert times["mask head (convs)"] == pytest.approx(0.02, abs=0.01)
    assert times["outside the network: resize, pad, box rescale, mask paste"] == pytest.approx(0.03, abs=0.01)
    assert times["total, end to end"] == pytest.approx(0.12, abs=0.03)
