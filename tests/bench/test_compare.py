"""compare A B and the tables it shares with run: comparable settings only, stored runs through their
reference row, ``n`` beside every median and no median from too few samples, Holm across cases, and
warm-up over every input the rounds use. Synthetic timings only: nothing here is timed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from mrcnn_bench.base import defaults
from mrcnn_bench.cli import commands as cli
from mrcnn_bench.gates import ab
from mrcnn_bench.reports import report
from mrcnn_bench.running import runner, store
from mrcnn_bench.running.cases import CASES, REFERENCE, Row, Workload
from mrcnn_bench.running.records import Record, RowResult, RunDocument, RunInfo

REPO = Path(__file__).resolve().parents[2]
ROUNDS = 10


def _times(seconds: float, seed: int, drift: np.ndarray, rounds: int = ROUNDS) -> list[float]:
    """Per-round times: the run's drift (shared by every row of a round) times a little noise."""
    noise = np.exp(0.01 * np.random.default_rng(seed).standard_normal(rounds))
    return (seconds * drift[:rounds] * noise).tolist()


def _run(cases: dict[str, float], speed: float = 1.0, seed: int = 0, threads: int = 2, preset: str = "tiny",
         cpu: str = "AMD EPYC", only: dict[str, int] | None = None) -> RunDocument:
    """A stored run: each case's seconds per call, the machine ``speed`` times slower, drifting per round."""
    drift = speed * np.exp(0.2 * np.random.default_rng(100 + seed).standard_normal(ROUNDS))
    env = {"threads": threads, "cpu": cpu, "host": "vm"}
    records = []
    for i, (case, seconds) in enumerate(cases.items()):
        times = _times(seconds, seed * 10 + i, drift, (only or {}).get(case, ROUNDS))
        records.append(Record(row=case, case=case, status="ok", preset=preset, image_size="240x320",
                              times_s=times, median_s=float(np.median(times)), env=env))
    info = RunInfo(workload=Workload(preset), threads=threads, options={"rounds": ROUNDS, "overrides": {}})
    return RunDocument("r", env, info, records)


def _compare(tmp_path: Path, a: RunDocument, b: RunDocument, *extra: str) -> int:
    paths = [store.save(doc, tmp_path / f"{name}.json") for name, doc in (("a", a), ("b", b))]
    return cli.main(["compare", *map(str, paths), *extra])


BASE = {REFERENCE: 0.10, "static/eager": 0.13, "static/inductor": 0.09}


@pytest.mark.parametrize(("change", "named"), [
    ({"threads": 1}, "threads (A: 2; B: 1)"),
    ({"preset": "coco_r50_fpn"}, "preset (A: tiny; B: coco_r50_fpn)"),
    ({"cpu": "Intel Xeon"}, "cpu (A: AMD EPYC; B: Intel Xeon)"),
])
def test_runs_with_different_settings_are_refused(tmp_path, capsys, change, named):
    assert _compare(tmp_path, _run(BASE), _run(BASE, seed=1, **change)) == 2
    assert named in capsys.readouterr().err


def test_different_overrides_are_refused(tmp_path, capsys):
    b = _run(BASE, seed=1)
    b.run.options["overrides"] = {"min_size": 224}
    assert _compare(tmp_path, _run(BASE), b) == 2
    err = capsys.readouterr().err
    assert 'cannot be compared, their settings differ: overrides (A: {}; B: {"min_size": 224})' in err


def test_stored_runs_are_compared_through_their_reference_row(tmp_path, capsys):
    """B's machine is 1.8x slower throughout: no regression, the reference row is not flagged."""
    assert _compare(tmp_path, _run(BASE), _run(BASE, speed=1.8, seed=1), "--out", str(tmp_path / "c.json")) == 0
    out = capsys.readouterr().out
    assert "REGRESSION" not in out and "reference row" in out
    table = ab.compare_records(_run(BASE).records, _run(BASE, speed=1.8, seed=1).records, relative=True)
    assert not table["regression"].any()
    assert table.set_index("case").loc["static/eager", "ratio_b_over_a"] == pytest.approx(1.0, abs=0.03)


def test_a_real_slowdown_between_stored_runs_is_flagged(tmp_path, capsys):
    slower = {**BASE, "static/eager": 0.13 * 1.3}
    assert _compare(tmp_path, _run(BASE), _run(slower, speed=1.8, seed=1)) == 1
    out = capsys.readouterr().out
    assert "REGRESSION static/eager: B is 3" in out and "REGRESSION static/inductor" not in out


def test_stored_runs_allow_for_the_spread_between_runs(tmp_path, capsys):
    """12% slower, with next to no noise in either run: a per-round test would flag it; against the
    spread of levels between separate runs (the default between-run sd) it is not shown; told there
    is none, the same files are flagged."""
    slower = {**BASE, "static/eager": 0.13 * 1.12}
    assert _compare(tmp_path, _run(BASE), _run(slower, speed=1.8, seed=1)) == 0
    out = capsys.readouterr().out
    assert f"z-test against 5% slower, between-run sd {defaults.BETWEEN_RUN_SD:.3f}" in out
    assert "compare the two pieces of code live" in out
    assert _compare(tmp_path, _run(BASE), _run(slower, speed=1.8, seed=1), "--between-run-sd", "0") == 1
    assert "REGRESSION static/eager" in capsys.readouterr().out


def test_a_run_without_the_reference_row_is_refused(tmp_path, capsys):
    a = _run({k: v for k, v in BASE.items() if k != REFERENCE})
    assert _compare(tmp_path, a, _run(BASE)) == 2
    assert f"run A has no {REFERENCE} row" in capsys.readouterr().err


def test_too_few_samples_give_no_ratio_or_verdict():
    table = ab.compare_records(_run(BASE).records, _run(BASE, only={"static/inductor": 1}).records, relative=True)
    line = table.set_index("case").loc["static/inductor"]
    assert line["n"] == 1 and np.isnan(line["ratio_b_over_a"]) and np.isnan(line["median_b_s"])
    assert line["verdict"] == "n=1: too few samples" and not line["regression"]
    assert table.set_index("case").loc["static/eager", "n"] == ROUNDS


def test_a_case_that_could_not_be_tested_exits_2(tmp_path, capsys):
    """A compare that measured too little of a case decides nothing about it: never exit 0."""
    assert _compare(tmp_path, _run(BASE), _run(BASE, only={"static/inductor": 1})) == 2
    assert "NOT DECIDED static/inductor: n=1: too few samples" in capsys.readouterr().err


def test_holm_corrects_across_the_cases_of_one_comparison():
    """Two cases each slower in all 7 rounds: p = 1/128 < 0.01 alone, 2/128 > 0.01 after Holm."""
    a = [Record(case=c, status="ok", times_s=[0.1] * 7, median_s=0.1) for c in ("static/eager", "static/xla")]
    b = [dataclasses.replace(r, times_s=[0.2] * 7, median_s=0.2) for r in a]
    table = ab.compare_records(a, b)
    assert not table["regression"].any()
    assert table["p_value"].tolist() == pytest.approx([2 / 128, 2 / 128])
    assert all("95% CI" in v and "n=7" in v for v in table["verdict"])
    assert ab.compare_records(a[:1], b[:1])["regression"].all()  # one case alone: flagged


def test_run_table_shows_n_and_no_median_from_one_sample():
    """The committed run whose torchvision/xla timed out in round 2, after one timed call."""
    doc = store.load(REPO / "results" / "runs" / "run_tiny.json")
    frame = report.table_frame(doc.records).set_index("row")
    assert frame.loc["torchvision/xla", "n"] == 1 and np.isnan(frame.loc["torchvision/xla", "median_s"])
    assert frame.loc["static/eager", "n"] == 10 and frame.loc["static/eager", "median_s"] > 0
    shown = report.shown_frame(doc).set_index("row")
    assert shown.loc["torchvision/xla", "median_s"] == "n=1: too few samples"
    assert list(shown.columns[:3]) == ["status", "n", "median_s"]


# ------------------------------------------------------------------------------------------------
# Warm-up: every input the rounds use is called before round 1


class _FakeRow:
    """A row runner that records which call indices it got, and when."""

    def __init__(self) -> None:
        self.phase, self.calls = "warm-up", {"warm-up": [], "rounds": []}

    def setup(self) -> None:
        pass

    def call(self, index: int, first: bool = False) -> tuple[float, dict[str, float], float, float]:
        self.calls[self.phase].append(index)
        return 0.01, {"loss": 1.0}, 0.0, 0.0

    def counters(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("images", "batch", "warmup"), [(3, 1, 1), (3, 2, 1), (4, 2, 1), (5, 3, 2), (2, 1, 5)])
def test_warm_up_calls_every_input_of_the_rounds(images, batch, warmup):
    opts = runner.RunOptions(Workload(images=images, batch_size=batch), rows=[], rounds=7, warmup=warmup,
                             progress=False)
    results = [RowResult(Row(CASES[name])) for name in ("static/eager", "static/train")]
    fakes = {r.row.name: _FakeRow() for r in results}
    runner.warm_up(results, fakes, opts)
    for fake in fakes.values():
        fake.phase = "rounds"
    runner.timed_rounds(results, fakes, opts)

    def inputs(index: int) -> tuple[int, ...]:  # the images of a call, as Context.call_images picks them
        return tuple((index * batch + k) % images for k in range(batch))

    infer = fakes["static/eager"].calls
    assert len(infer["warm-up"]) >= warmup and infer["warm-up"] == list(range(len(infer["warm-up"])))
    assert {inputs(i) for i in infer["rounds"]} <= {inputs(i) for i in infer["warm-up"]}
    assert len(infer["rounds"]) == 7 and min(infer["rounds"]) >= len(infer["warm-up"])
    # A training step takes the same samples; the second is the first with the optimiser's state.
    assert len(fakes["static/train"].calls["warm-up"]) == max(warmup, runner.TRAIN_WARMUP)
