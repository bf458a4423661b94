"""What a reader of a run's report sees: tail percentiles only where the samples reach them, the
geometric-mean summary by backend and compiler, the distribution plot, and a target column that
explains itself."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy.stats import gmean

from mrcnn_bench.reports import report, run_notes
from mrcnn_bench.running.cases import Workload, stream_workload
from mrcnn_bench.running.records import Record, RunDocument, RunInfo, first_pass_seconds


def rec(case: str, times: list[float], **fields) -> Record:
    impl, variant = case.split("/")
    compiler = "inductor" if "inductor" in variant else "eager"
    backend = "xla" if "xla" in variant else "cpu"
    return Record(row=case, case=case, impl=impl, compiler=compiler, backend=backend, status="ok",
                  times_s=times, median_s=float(np.median(times)), **fields)


@pytest.mark.parametrize(("n", "p90", "p99"), [(9, False, False), (10, True, False), (99, True, False),
                                               (100, True, True)])
def test_tail_percentiles_need_enough_samples_to_reach_them(n, p90, p99):
    times = list(np.linspace(1.0, 2.0, n))
    r = rec("static/eager", times)
    assert math.isnan(report.tail(r, 0.90)) != p90
    assert math.isnan(report.tail(r, 0.99)) != p99
    if p99:
        assert report.tail(r, 0.99) == pytest.approx(np.quantile(times, 0.99))
    row = report.table_frame([rec("torchvision/eager", times), r]).iloc[1]
    assert (row["p90_s"] == row["p90_s"]) == p90 and row["n"] == n


def test_geomean_summary_by_backend_and_compiler_leaves_the_reference_out():
    ref = rec("torchvision/eager", [1.0] * 5)
    rows = [ref, rec("static/eager", [1.2] * 5), rec("static/inductor", [0.5] * 5),
            rec("torchvision/inductor", [0.8] * 5), rec("static/xla", [0.9] * 5)]
    other_run = [rec("torchvision/eager", [2.0] * 5), rec("static/inductor", [1.6] * 5)]
    df = report.geomean_frame([rows, other_run]).set_index(["backend", "compiler"])
    inductor = df.loc[("cpu", "inductor")]
    assert inductor["geomean_ratio_vs_tv"] == pytest.approx(gmean([0.5, 0.8, 0.8]))  # 1.6 / 2.0 in its own run
    assert inductor["rows"] == 3
    assert df.loc[("cpu", "eager"), "rows"] == 1  # static/eager only: the reference is not averaged in
    assert df.loc[("xla", "eager"), "geomean_ratio_vs_tv"] == pytest.approx(0.9)
    assert len(report.geomean_frame([[ref]])) == 0


def test_the_written_report_has_the_summary_the_goal_and_a_distribution_plot(tmp_path):
    records = [rec("torchvision/eager", [1.0, 1.1, 0.9] * 4), rec("static/inductor", [0.6, 0.7, 0.65] * 4)]
    info = RunInfo(workload=Workload(), options={"rounds": 12, "warmup": 1}, weights="synthetic")
    env = {k: "?" for k in ("torch", "torchvision", "torch_xla", "cpu", "gpu", "threads", "seed", "commit", "date",
                            "affinity")}
    doc = RunDocument(name="t", records=records, run=info, environment=env)
    md = report.markdown(doc)
    assert "geometric mean" in md and "target: this project's speed goals" in md and "issue" not in md
    paths = report.write(doc, tmp_path)
    assert (tmp_path / "t_inference.png") in paths
    assert '<div class="scroll">' in (tmp_path / "t.html").read_text()


def test_other_load_is_the_busy_time_the_run_did_not_use():
    # 2 s intervals: the machine was busy 3.0 CPU-s, the run's own processes used 2.0 of them.
    states = [{"wall_s": 2.0 * i, "cpu_busy_s": 3.0 * i, "own_cpu_s": 2.0 * i, "steal_s": 0.2 * i}
              for i in range(5)]
    got = run_notes.other_load(states)
    assert got == {"other_cores": pytest.approx(0.5), "steal_cores": pytest.approx(0.1), "intervals": 4.0}
    assert run_notes.other_load([{"loadavg_1m": 1.0}, {"loadavg_1m": 2.0}]) == {}  # run files from before


def test_every_ratio_against_torchvision_carries_its_interval():
    rng = np.random.default_rng(1)
    ref_times = list(1.0 + 0.02 * rng.standard_normal(12))
    records = [rec("torchvision/eager", ref_times),
               rec("static/inductor", [0.6 * t for t in ref_times]),
               rec("static/xla", [0.9 * t for t in ref_times]),
               rec("static/eager", [0.8 * t for t in ref_times[:5]])]  # fewer rounds: cannot be paired
    for r in records:
        r.image_size = "stream 224x320,320x224"  # the main job's stream, whose goals are against torchvision eager
    table = report.table_frame(records).set_index("row")
    assert table.loc["static/inductor", "ratio_ci95"] == "[0.6, 0.6]"
    assert "met (0.600x, 95% CI [0.6, 0.6])" in table.loc["static/inductor", "target"]
    assert table.loc["static/eager", "ratio_ci95"] == "" and table.loc["torchvision/eager", "ratio_ci95"] == ""
    assert "95% CI" not in table.loc["static/xla", "target"]  # its goal is against static/eager


def test_the_ratio_shown_is_the_paired_one_its_interval_is_for():
    """When the two rows' slow rounds fall in different rounds, the ratio of their medians can lie
    outside the interval of the per-round ratio (a run printed 1.46x [1.48, 1.64]); the table
    shows the median per-round ratio, so its estimate is inside its own interval."""
    rng = np.random.default_rng(1)  # a draw where the two estimates differ by 0.33
    ref_times = list(np.exp(0.3 * rng.standard_normal(15)))
    case_times = list(1.5 * np.exp(0.3 * rng.standard_normal(15)))  # slow rounds independent of the ruler's
    records = [rec("torchvision/eager", ref_times), rec("static/eager", case_times, image_size="stream 224x320")]
    row = report.table_frame(records).set_index("row").loc["static/eager"]
    per_round = float(np.exp(np.median(np.log(np.array(case_times) / ref_times))))
    of_medians = float(np.median(case_times) / np.median(ref_times))
    assert abs(per_round - of_medians) > 0.3
    assert row["ratio_vs_tv"] == pytest.approx(per_round)
    low, high = (float(x) for x in row["ratio_ci95"].strip("[]").split(","))
    assert low <= row["ratio_vs_tv"] <= high
    assert f"({per_round:.3f}x" in row["target"]
    unpaired = report.table_frame([rec("torchvision/eager", ref_times), rec("static/eager", case_times[:5])])
    assert unpaired.set_index("row").loc["static/eager", "ratio_vs_tv"] == pytest.approx(
        np.median(case_times[:5]) / np.median(ref_times))  # rounds that cannot be paired: ratio of medians


def test_a_goal_whose_interval_holds_it_is_not_decided():
    """Met only when the whole 95% interval meets the goal, missed only when none of it does: a
    median on the met side with an interval across the goal reads 'not decided'."""
    ref_times = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    # per-round median 0.474 (the geometric mean of the middle two), interval across 0.55 (inductor's
    # COCO goal at about ten detections)
    wide = [0.3, 0.4, 0.45, 0.5, 0.9, 1.0]
    records = [rec("torchvision/eager", ref_times), rec("static/inductor", wide),
               rec("static/eager", [0.5 * t for t in ref_times]),
               rec("static/inductor+buckets", [0.9 * t for t in ref_times])]
    for r in records:
        r.preset = "coco_r50_fpn"
    table = report.table_frame(records, {"box_score_thresh": 0.75}).set_index("row")
    assert "not decided (the 95% CI holds the goal) (0.474x" in table.loc["static/inductor", "target"]
    assert ": met (0.500x" in table.loc["static/eager", "target"]  # goal 0.9
    assert ": missed (0.900x" in table.loc["static/inductor+buckets", "target"]  # goal 0.55


def run_doc(name: str, workload: Workload, records: list[Record]) -> RunDocument:
    env = {k: "?" for k in ("torch", "torchvision", "torch_xla", "cpu", "gpu", "threads", "seed", "commit", "date",
                            "affinity")}
    info = RunInfo(workload=workload, options={"rounds": 12, "warmup": 1}, weights="synthetic", limit_s=120.0,
                   total_s=100.0)
    for r in records:
        r.env = {"host": "box", "commit": "abc"}
    return RunDocument(name=name, records=records, run=info, environment=env)


def test_first_pass_is_one_cold_pass_over_the_distinct_images():
    stream = stream_workload("tiny", seed=0)  # 8 images
    warm = [30.0] + [20.0] * 7
    assert first_pass_seconds(warm, "inference", stream) == pytest.approx(170.0)
    assert first_pass_seconds(warm, "inference", dataclasses.replace(stream, batch_size=2)) == pytest.approx(90.0)
    # --warmup 5 over 3 images: one pass is the first 3 calls
    assert first_pass_seconds([1.0, 0.5, 0.5, 0.5, 0.5], "inference", Workload()) == pytest.approx(2.0)
    assert first_pass_seconds([9.0, 0.5], "training", stream) == 9.0
    assert math.isnan(first_pass_seconds([], "inference", stream))  # nothing recorded
    r = rec("static/inductor", [0.1] * 4, warmup_s=warm, first_pass_s=170.0)
    assert math.isnan(report.first_pass(rec("static/eager", [0.1] * 4)))  # an old run file: not recorded
    table = report.table_frame([rec("torchvision/eager", [0.1] * 4, warmup_s=[0.2] * 8), r]).set_index("row")
    assert table.loc["static/inductor", "first_pass_s"] == pytest.approx(170.0)
    assert list(table.columns).index("first_pass_s") == list(table.columns).index("first_result_s") + 1


def test_report_labels_stream_and_fixed_runs_and_shows_the_cold_pass(tmp_path):
    from mrcnn_bench.reports import dashboard
    from mrcnn_bench.running import store

    stream = run_doc("stream_tiny", stream_workload("tiny", seed=0),
                     [rec("torchvision/eager", [0.1] * 12, warmup_s=[0.3] * 8, first_pass_s=2.4),
                      rec("static/inductor", [0.08] * 12, warmup_s=[40.0] + [30.0] * 7, first_pass_s=250.0)])
    fixed = run_doc("fixed_tiny", Workload("tiny", (240, 320), 1, 3),
                    [rec("torchvision/eager", [0.1] * 12, warmup_s=[0.3] * 3, first_pass_s=0.9),
                     rec("static/inductor", [0.08] * 12)])  # a record from before warm-up calls were kept
    files = []
    for doc in (stream, fixed):
        files.append(str(store.save(doc, tmp_path / f"{doc.name}.json")))
    dashboard.build(files, tmp_path / "out")
    index = (tmp_path / "out" / "index.html").read_text()
    assert "stream_tiny: stream of 8 sizes [box, abc]" in index and "fixed_tiny: fixed 240x320 [box, abc]" in index
    assert "One cold pass over each run&#x27;s images" in index or "One cold pass over each run's images" in index
    assert "250 s" in index  # static/inductor's cold pass over the stream: 40 + 7 x 30
    page = (tmp_path / "out" / "stream_tiny.html").read_text()
    assert "stream of 8 sizes (472x472, 406x507" in page and "cold pass s" in page
    md = report.markdown(stream)
    assert md.startswith("Workload: tiny stream of 8 sizes (")
    assert "first_pass_s (cold pass s): one cold pass over the run's distinct images" in md
    for column in report.TABLE_COLUMNS:  # every column is explained under the table
        assert f"- {column}" in md
    fixed_md = report.markdown(fixed)
    assert "images: fixed 240x320, 3 generated textured image(s)" in fixed_md
    row = report.shown_frame(fixed).set_index("row").loc["static/inductor"]
    assert row["first_pass_s"] == ""  # NaN shown blank


def test_the_html_table_uses_short_headers_that_wrap():
    doc = run_doc("t", Workload(), [rec("torchvision/eager", [0.1] * 12)])
    page = report.html_page(doc)
    assert "<th" in page and "cold pass s" in page and "first_pass_s</code> in the CSV" in page
    assert "white-space:normal" in page and "min-width" in page


def test_the_useful_column_divides_torchvisions_flops_not_the_rows_own():
    records = [rec("torchvision/eager", [1.0] * 6, flops=100e9, frac_peak=0.25),
               rec("static/inductor", [0.5] * 6, flops=150e9, frac_peak=150 / 0.5 / 400),
               rec("static/eager", [0.8] * 6)]  # no FLOPs counted: nothing to show
    table = report.table_frame(records).set_index("row")
    assert table.loc["static/inductor", "frac_peak"] == pytest.approx(0.75)
    assert table.loc["static/inductor", "useful_peak"] == pytest.approx(0.5)  # 100 GFLOP in 0.5 s of 400
    assert table.loc["torchvision/eager", "useful_peak"] == pytest.approx(0.25)
    assert math.isnan(table.loc["static/eager", "useful_peak"])
    assert math.isnan(report.table_frame(records[1:]).set_index("row").loc["static/inductor", "useful_peak"])
