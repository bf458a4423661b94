"""asv result files from outside: a file whose layout is not asv's is left out and named with why, never
read into a wrong figure or a traceback; a damaged machine.json is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.changes import asv_files, history_series
from mrcnn_bench.changes.asv_results_table import values
from tests.helpers.asv_results import write_stage_result

COMMITS = [f"{k:x}" * 40 for k in range(1, 9)]  # 8 hex hashes, 40 digits each
BENCHMARK = "benchmarks.Stages.track_ratio"


def _edit(folder: Path, commit: str, change) -> str:
    path = folder / f"{commit[:8]}-env-x.json"
    data = json.loads(path.read_text())
    text = change(data)
    path.write_text(text if isinstance(text, str) else json.dumps(data))
    return path.name


HOSTILE = {  # how a file is damaged -> the reason it is left out
    "hash a number": (lambda d: d.update(commit_hash=12345), "commit_hash 12345 is not a hexadecimal"),
    "values strings": (lambda d: d["results"][BENCHMARK].__setitem__(0, ["1.0", "2.0"]), "values are not numbers"),
    "values a dict": (lambda d: d["results"][BENCHMARK].__setitem__(0, {"a": 1}), "values are not numbers"),
    "params shorter": (lambda d: d["results"][BENCHMARK][1].__setitem__(1, ["'backbone'"]),
                       "2 values for 1 parameter combination"),
    "date a string": (lambda d: d.update(date="yesterday"), "date 'yesterday' is not a time"),
    "date past 9999": (lambda d: d.update(date=1e300), "date 1e+300 is not a time"),
    "deep nesting": (lambda d: "[" * 50_000 + "]" * 50_000, "nested too deeply"),
    "not json": (lambda d: "{\"commit_hash\": ", "not JSON"),
}


@pytest.fixture
def machine(tmp_path) -> Path:
    folder = tmp_path / "results" / "m1"
    for k, commit in enumerate(COMMITS):
        write_stage_result(folder, commit, k, "Stages.track_ratio", 1.0 + k / 100, 2.0)
    return folder


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_damaged_result_file_is_left_out_and_named(machine, name):
    change, reason = HOSTILE[name]
    file = _edit(machine, COMMITS[3], change)
    read = asv_files.read(machine.parent, "m1")
    assert sorted(r.commit_hash for r in read.results) == sorted(c for c in COMMITS if c != COMMITS[3])
    (skipped,) = read.skipped
    assert skipped.file == file and skipped.commit == COMMITS[3][:8] and reason in skipped.reason, skipped


def test_the_series_say_which_commits_are_missing(machine):
    _edit(machine, COMMITS[2], HOSTILE["values strings"][0])
    series, short, left_out = history_series.read_asv(machine.parent, "m1", COMMITS, history_series.STAGES)
    (metric,) = [m for m in series if "backbone" in m]
    assert series[metric][0] == [c[:8] for c in COMMITS if c != COMMITS[2]] and short == []
    assert [s.commit for s in left_out] == [COMMITS[2][:8]]
    _, _, elsewhere = history_series.read_asv(machine.parent, "m1", COMMITS[4:], history_series.STAGES)
    assert elsewhere == [], "a file of a commit off the line is not the line's concern"


def test_every_value_of_a_parameter_grid_is_read(machine):
    """The values asv stores flat, in product order, come back under their own parameters."""
    read = asv_files.read(machine.parent, "m1")
    first = next(r for r in read.results if r.commit_hash == COMMITS[0])
    assert values(first, BENCHMARK) == {("static/eager", "backbone"): 1.0, ("static/eager", "mask_head"): 2.0}


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", json.dumps({"version": 1}), "[" * 50_000])
def test_a_damaged_machine_json_is_a_usage_error_naming_it(machine, text):
    (machine / "machine.json").write_text(text)
    with pytest.raises(UsageError, match=r"m1/machine\.json: not asv's machine\.json"):
        asv_files.read(machine.parent, "m1")
