"""``mrcnn-bench steps``: change points found where a level moved, none in A/A noise, and its contract
(CSV at the edge, the JSON list, exit codes)."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.changes import changepoints
from mrcnn_bench.cli import commands as cli
from tests.helpers.asv_results import write_stage_result
from tests.helpers.git_line import git_line

REPO = Path(__file__).resolve().parents[2]
KEYS = ["metric", "commit", "index", "before", "after", "change_pct", "p_value", "direction"]


@pytest.fixture(autouse=True)
def otava():
    """The Otava environment `make test` builds; elsewhere its absence skips, in CI it fails."""
    try:
        changepoints.otava_python()
    except ValueError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(e))


def steps(*argv: str, capsys) -> tuple[int, list | None, str]:
    """Exit code, the JSON list on stdout (with --json), stderr."""
    code = cli.main(["steps", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if "--json" in argv and code != 2 else None), err


def write(path: Path, header: str, rows: list[tuple]) -> Path:
    path.write_text("\n".join([header, *(",".join(map(str, r)) for r in rows)]) + "\n")
    return path


def noisy(n: int, seed: int, cv: float = 0.01, step_at: int | None = None, step: float = 0.0) -> list[float]:
    """A ratio of about 1.2 with ``cv`` relative noise, ``step`` higher from ``step_at`` on."""
    values = 1.2 * (1 + cv * np.random.default_rng(seed).standard_normal(n))
    if step_at is not None:
        values[step_at:] *= 1 + step
    return [round(float(v), 6) for v in values]


def test_a_five_percent_step_is_found_at_its_commit(tmp_path, capsys):
    values = noisy(20, seed=3, step_at=11, step=0.05)
    f = write(tmp_path / "s.csv", "commit,value", [(f"c{i:02d}", v) for i, v in enumerate(values)])
    code, points, _ = steps("--series", str(f), "--json", capsys=capsys)
    assert code == 1
    assert [(p["index"], p["commit"], p["direction"]) for p in points] == [(11, "c11", "regression")]
    (p,) = points
    assert p["before"] == pytest.approx(np.mean(values[:11])) and p["after"] == pytest.approx(np.mean(values[11:]))
    assert p["change_pct"] == pytest.approx(100 * (p["after"] - p["before"]) / p["before"])
    assert 3 < p["change_pct"] < 7 and 0 <= p["p_value"] < changepoints.SETTINGS["max_pvalue"]


def test_a_a_noise_is_flagged_at_most_once_per_100_commits(tmp_path, capsys):
    """200 A/A histories of 20 commits as 200 metrics of one file: the goal's false-alarm rate holds."""
    rows = [(f"aa{k}", f"c{i}", v) for k in range(200) for i, v in enumerate(noisy(20, seed=100 + k, cv=0.013))]
    code, points, err = steps("--series", str(write(tmp_path / "aa.csv", "metric,commit,value", rows)), "--json",
                              capsys=capsys)  # fmt: skip
    assert code in (0, 1), err
    assert len(points) <= 200 * 20 / 100, points


def test_one_a_a_history_is_not_flagged(tmp_path, capsys):
    rows = [(f"c{i}", v) for i, v in enumerate(noisy(20, seed=0, cv=0.013))]
    code, points, err = steps("--series", str(write(tmp_path / "aa.csv", "commit,value", rows)), "--json",
                              capsys=capsys)  # fmt: skip
    assert (code, points) == (0, [])
    assert "none" in err


def test_metrics_keep_their_order_and_an_improvement_exits_0(tmp_path, capsys):
    """Columns by name in any order, extra ones ignored; a commit may repeat across metrics."""
    faster = noisy(12, seed=1, step_at=6, step=-0.10)
    flat = noisy(12, seed=2)
    rows = [("zeta", f"c{i}", v, "x") for i, v in enumerate(faster)] + [("alpha", f"c{i}", v, "y")
                                                                        for i, v in enumerate(flat)]  # fmt: skip
    f = write(tmp_path / "m.csv", "metric,commit,value,note", rows)
    code, points, _ = steps("--series", str(f), "--json", capsys=capsys)
    assert code == 0
    assert [list(p) for p in points] == [KEYS]
    assert (points[0]["metric"], points[0]["index"], points[0]["direction"]) == ("zeta", 6, "improvement")


def test_two_steps_take_the_means_between_adjacent_change_points(tmp_path, capsys):
    values = noisy(10, seed=4) + noisy(10, seed=5, step_at=0, step=0.10) + noisy(10, seed=6, step_at=0, step=0.05)
    f = write(tmp_path / "two.csv", "value,commit", [(v, f"{i:x}") for i, v in enumerate(values)])
    code, points, _ = steps("--series", str(f), "--json", capsys=capsys)
    assert code == 1 and [p["index"] for p in points] == [10, 20]
    assert points[0]["metric"] == "value" and points[1]["commit"] == "14"
    assert points[0]["after"] == pytest.approx(np.mean(values[10:20])) == points[1]["before"]
    assert [p["direction"] for p in points] == ["regression", "improvement"]


@pytest.mark.parametrize("sign", [1, -1])
def test_direction_follows_lower_is_better_whatever_the_sign(tmp_path, capsys, sign):
    """A negative series (a margin, a log ratio) that rises is a regression and one that falls an
    improvement; the percentage's sign is the direction's."""
    values = [sign * v for v in noisy(20, seed=3, step_at=11, step=0.05)]
    f = write(tmp_path / "s.csv", "commit,value", [(f"c{i:02d}", v) for i, v in enumerate(values)])
    code, points, _ = steps("--series", str(f), "--json", capsys=capsys)
    (p,) = points
    rose = p["after"] > p["before"]
    assert rose == (sign == 1) and p["direction"] == ("regression" if rose else "improvement")
    assert code == (1 if rose else 0) and (p["change_pct"] > 0) == rose


@pytest.mark.parametrize("magnitude", [1e-300, 1e160, 1e300, 1e307])
def test_a_step_is_found_at_any_magnitude(tmp_path, capsys, magnitude):
    """The same 5% step scaled near the ends of the float range: found, at the same place and size."""
    values = noisy(20, seed=3, step_at=11, step=0.05)
    f = write(tmp_path / "s.csv", "commit,value", [(f"c{i:02d}", repr(v * magnitude)) for i, v in enumerate(values)])
    code, points, err = steps("--series", str(f), "--json", capsys=capsys)
    assert code == 1, err
    (p,) = points
    assert p["index"] == 11 and 3 < p["change_pct"] < 7
    assert p["after"] == pytest.approx(np.mean(values[11:]) * magnitude)


def test_a_long_series_file_is_read_in_one_pass(tmp_path):
    """200,000 rows over 4 metrics: the repeat check is a set lookup per row, not a scan of the rows
    before it (which took minutes at this size); a repeat at the end is still found, named by position."""
    from mrcnn_bench.changes import history_series

    rows = [(f"c{i}", 1.0, f"m{i % 4}") for i in range(200_000)]
    f = write(tmp_path / "long.csv", "commit,value,metric", rows)
    series = history_series.read_csv(f)
    assert len(series) == 4 and all(len(c) == 50_000 for c, _ in series.values())
    g = write(tmp_path / "repeat.csv", "commit,value,metric", [*rows, ("c8", 2.0, "m0")])
    with pytest.raises(UsageError, match=r"line 200002: commit 'c8' repeats in metric 'm0' \(first at position 2\)"):
        history_series.read_csv(g)


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty"),
    ("commit,metric\na,m\n", "no column value"),
    ("commit,value\na,1\nb,nan\n", "line 3: value 'nan' is not a finite number"),
    ("commit,value\na,1\nb,fast\n", "line 3: value 'fast'"),
    ("commit,value\na,1\na,2\nb,1\nc,1\n", "line 3: commit 'a' repeats in metric 'value'"),
    ("commit,value\na,1,3\n", "line 2: 3 fields"),
    ("commit,value\n", "a header and no rows"),
    ("commit,value\na,1\nb,2\nc,3\n", "at least 4 points"),
    ("commit,value,value\na,1,9\nb,2,9\nc,3,9\nd,4,9\n", "names value more than once"),
])  # fmt: skip
def test_bad_series_files_exit_2_with_one_line(tmp_path, capsys, text, message):
    f = tmp_path / "bad.csv"
    f.write_text(text)
    code, _, err = steps("--series", str(f), "--json", capsys=capsys)
    assert code == 2 and message in err and "Traceback" not in err
    assert capsys.readouterr().out == ""


def test_a_missing_or_binary_file_exits_2(tmp_path, capsys):
    assert steps("--series", str(tmp_path / "nope.csv"), capsys=capsys)[0] == 2
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00commit")
    code, _, err = steps("--series", str(tmp_path / "bin.csv"), capsys=capsys)
    assert code == 2 and "cannot read it as CSV" in err


def test_no_machine_to_choose_exits_2_listing_them(tmp_path, capsys):
    (tmp_path / "few").mkdir()
    (tmp_path / "few" / "machine.json").write_text('{"machine": "few", "version": 1}')
    code, _, err = steps("--results", str(tmp_path), "--repo", str(REPO), capsys=capsys)
    assert code == 2 and "choose one with --machine: few (0)" in err
    (tmp_path / "few" / "machine.json").write_text("{}")  # damaged: asv would read it as no results
    code, _, err = steps("--results", str(tmp_path), "--repo", str(REPO), capsys=capsys)
    assert code == 2 and "few/machine.json: not asv's machine.json" in err
    code, _, err = steps("--results", str(tmp_path), "--machine", "other", "--repo", str(REPO), capsys=capsys)
    assert code == 2 and "no asv machine 'other'" in err


def _main_has_history() -> bool:
    done = subprocess.run(["git", "-C", str(REPO), "rev-list", "--count", "main"], capture_output=True, text=True)
    return done.returncode == 0 and int(done.stdout or 0) > 100


@pytest.mark.skipif(not _main_has_history(), reason="needs main's git history (a full clone)")
def test_main_history_of_the_amd_machine(capsys):
    """The committed asv results of main on the AMD host: the two-core RoIAlign, NHWC in eager and the
    one-output mask pasting are found as improvements at their commits, the RoIAlign in the stages that
    run it. (The machine is named: more than one host holds main's history.)"""
    history = ("--results", str(REPO / "results" / "asv"), "--repo", str(REPO), "--json",
               "--machine", "amd-epyc-f25m17-2c-fx021d390f")  # fmt: skip
    code, points, err = steps(*history, capsys=capsys)
    assert code in (0, 1), err
    assert int(re.search(r"amd-epyc-f25m17-2c-fx021d390f, (\d+) commits of main", err)[1]) >= 53
    found = {(p["metric"], p["commit"], p["direction"]) for p in points}
    for case in ("static/eager", "static/xla", "static/inductor"):
        assert (f"Latency.track_ratio({case})", "6cf654da", "improvement") in found
    assert ("Training.track_ratio(static/train)", "6cf654da", "improvement") in found
    assert ("Latency.track_ratio(static/eager)", "ba6640b2", "improvement") in found
    assert ("Latency.track_ratio(static/eager)", "bb0b0b3d", "improvement") in found
    # every commit of the line is in the latency series: ten commits before the RoIAlign step
    assert {p["index"] for p in points if p["commit"] == "6cf654da" and p["metric"].startswith("Latency")} == {10}
    assert "at 6cf654da:" not in err  # its parent was measured
    code, points, err = steps(*history, "--stages", capsys=capsys)
    assert code in (0, 1), err
    stepped = {p["metric"] for p in points if p["commit"] == "6cf654da"}
    assert "Stages.track_ratio(static/eager, roi_rest)" in stepped  # RoIAlign runs in roi_rest
    assert "Stages.track_ratio(static/eager, backbone)" not in stepped


def test_a_count_rising_from_zero_is_a_regression_without_a_percentage(tmp_path, capsys):
    f = write(tmp_path / "breaks.csv", "commit,value", [(c, 0 if i < 4 else 1) for i, c in enumerate("abcdefgh")])
    code, points, _ = steps("--series", str(f), "--json", capsys=capsys)
    assert code == 1
    assert [(p["commit"], p["before"], p["after"], p["change_pct"], p["direction"]) for p in points] == [
        ("e", 0.0, 1.0, None, "regression")]


def test_stages_finds_the_stage_that_stepped(tmp_path, capsys):
    """--stages reads the stage ratios: a 10% backbone step at its commit, the mask head quiet."""
    commits = git_line(tmp_path / "repo", 12)
    backbone, mask_head = noisy(12, seed=3, step_at=6, step=0.10), noisy(12, seed=4)
    for k, commit in enumerate(commits):
        write_stage_result(tmp_path / "results" / "m1", commit, k, "Stages.track_ratio", backbone[k], mask_head[k])
    where = ("--results", str(tmp_path / "results"), "--machine", "m1", "--repo", str(tmp_path / "repo"),
             "--revs", "HEAD")  # fmt: skip
    code, points, err = steps(*where, "--stages", "--json", capsys=capsys)
    assert code == 1, err
    assert [(p["metric"], p["commit"], p["index"]) for p in points] == [
        ("Stages.track_ratio(static/eager, backbone)", commits[6][:8], 6)]
    code, _, err = steps(*where, capsys=capsys)  # the held figures: none in these files
    assert code == 2 and "no results" in err
    code, _, err = steps("--series", str(tmp_path / "x.csv"), "--stages", capsys=capsys)
    assert code == 2 and "--stages reads asv's results" in err


def test_a_hostile_metric_name_cannot_forge_a_row_or_reach_the_terminal(tmp_path, capsys):
    """A metric name with `|`, a newline or an escape byte is printed escaped in the table, kept as is in --json."""
    name = 'x | forged | row\n| \x1b[31mred'
    values = noisy(20, seed=3, step_at=11, step=0.05)
    f = tmp_path / "s.csv"
    with f.open("w", newline="") as out:
        rows = [(name, f"c{i:02d}", v) for i, v in enumerate(values)]
        csv.writer(out).writerows([("metric", "commit", "value"), *rows])
    code = cli.main(["steps", "--series", str(f)])
    table, _ = capsys.readouterr()
    assert code == 1 and "\x1b" not in table
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert len(rows) == 2 and rows[1].count(" | ") == rows[0].count(" | ")  # the header and one change point
    assert "x \\| forged \\| row\\x0a\\| \\x1b[31mred" in rows[1]
    code, points, _ = steps("--series", str(f), "--json", capsys=capsys)
    assert [p["metric"] for p in points] == [name]
