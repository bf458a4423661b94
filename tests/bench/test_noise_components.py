"""The split of an A/A study's noise (bench/studies/commit_cost/noise_components.py) recovers the
components a synthetic study was made with: per-call scatter, a level per process, a level per run."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "studies" / "commit_cost"))

import noise_components  # noqa: E402


def _study(folder: Path, runs: int, processes: int, rounds: int, call: float, process: float, run: float) -> None:
    """A/A runs of one case whose log seconds are the ruler's plus the three levels; every call
    (case and ruler alike) scatters by ``call`` (standard deviations of log seconds)."""
    rng = np.random.default_rng(7)
    folder.mkdir()
    for k in range(1, runs + 1):
        run_level = rng.normal(0, run)
        case_s, ruler_s, medians = [], [], []
        for _ in range(processes):
            level = run_level + rng.normal(0, process)
            ruler = np.exp(np.log(0.2) + rng.normal(0, call, rounds))
            case = np.exp(np.log(0.2) + level + rng.normal(0, call, rounds))
            case_s += case.tolist()
            ruler_s += ruler.tolist()
            medians.append(float(np.median(case / ruler)))
        record = {"case_s": case_s, "ruler_s": ruler_s, "ratio_per_process": medians,
                  "ratio_median": float(np.median(medians))}
        (folder / f"run_{k}.json").write_text(json.dumps({"timing": {"static/eager": {"record": record}}}))


def test_each_component_is_recovered(tmp_path):
    _study(tmp_path / "aa", runs=40, processes=4, rounds=60, call=0.05, process=0.02, run=0.03)
    runs = noise_components.load_runs(tmp_path / "aa")
    got = noise_components.components(runs, "static/eager")
    assert got["runs"] == 40 and got["processes"] == 4 and got["rounds"] == 60
    assert got["call_case"] == pytest.approx(5.0, rel=0.1) and got["call_ruler"] == pytest.approx(5.0, rel=0.1)
    assert got["call_ratio"] == pytest.approx(5.0 * math.sqrt(2), rel=0.1)  # independent calls: sqrt(2) of one
    assert abs(got["corr"]) < 0.1
    # A process's median: the calls' part (sqrt(pi/2) sigma / sqrt(n)) and the 2% level of its own.
    assert got["process_expected"] == pytest.approx(math.sqrt(math.pi / 2) * got["call_ratio"] / math.sqrt(60))
    assert got["process_observed"] == pytest.approx(math.hypot(got["process_expected"], 2.0), rel=0.2)
    assert got["run_level"] == pytest.approx(3.0, rel=0.3)
    assert noise_components.components(runs, "static/xla") is None  # no runs of that case


def test_no_level_of_its_own_reads_as_the_calls_alone(tmp_path):
    _study(tmp_path / "aa", runs=40, processes=4, rounds=60, call=0.05, process=0.0, run=0.0)
    got = noise_components.components(noise_components.load_runs(tmp_path / "aa"), "static/eager")
    assert got["process_observed"] == pytest.approx(got["process_expected"], rel=0.2)
    assert got["run_level"] < 0.5
    # The figure (the median of 4 process medians) then scatters by less than one process does.
    assert got["figure_cv"] < got["process_observed"]


def test_a_folder_without_runs_is_a_one_line_error(tmp_path, capsys):
    assert noise_components.main([f"x={tmp_path}"]) == 2
    assert "expected LABEL=DIR with DIR/run_K.json" in capsys.readouterr().err
