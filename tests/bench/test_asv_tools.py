"""The asv tools' logic: the flags and the scratch verdict, the A/A spread, the table of held metrics, the
dashboard screenshots' checks (bench/tools/*.py are their command lines)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mrcnn_bench.changes import asv_regressions, asv_results_table
from mrcnn_bench.history import aa_spread
from mrcnn_bench.publish import screenshots


def _part(record=None, error=None, skipped=False):
    return {"record": record, "error": error, "seconds": 1.0, "skipped": skipped}


def test_flags_name_the_machine_of_each_step(tmp_path):
    """asv leaves the machine out of a flag's parameters when only one machine has results."""
    graph = "graphs/arch-x86_64/branch-asv-scratch/cpu-AMD EPYC/machine-amd-epyc-2c-fx37278115/python-3.11/x.json"
    (tmp_path / "index.json").write_text(json.dumps({"revision_to_hash": {"7": "abc", "9": "def"}}))
    (tmp_path / "regressions.json").write_text(json.dumps({"regressions": [
        ["benchmarks.Latency.track_ratio('static/eager')", graph, {"branch": "asv-scratch"}, 0, 1.1, 1.0,
         [[7, 9, 1.0, 1.1]]],
        ["benchmarks.Accuracy.track_box_error", graph, {"machine": "other"}, 0, 0.9, 0.2, [[6, 7, 0.2, 0.9]]],
    ]}))
    rows = asv_regressions.flags(tmp_path)
    assert [(r["machine"], r["branch"], r["commit"], r["after"]) for r in rows] == [
        ("amd-epyc-2c-fx37278115", "asv-scratch", "def", 1.1), ("other", "", "abc", 0.9)
    ]


def test_flags_verdict_holds_the_range_and_names_main_s_steps():
    """Held flags on the range must be its injected commits; one on main's history is named, not counted."""
    verdict = asv_regressions.verdict
    kinds = {"s1": "slowdown", "r1": "recompile", "a1": "accuracy", "n1": "noop", "n2": "noop"}

    def row(commit, benchmark="benchmarks.Latency.track_ratio('static/eager')"):
        return {"benchmark": benchmark, "commit": commit}

    injected = [row("s1"), row("r1", "benchmarks.Compiles.track_count('static/xla', 'xla_compiles')"),
                row("a1", "benchmarks.Accuracy.track_box_error")]
    ok, lines = verdict([*injected, row("n1", "benchmarks.Latency.track_seconds('static/eager')"),
                         row("5505aa86fb00")], kinds)
    assert ok and "3 of the 3 injected commits and 0 other" in lines[0]
    assert lines[1].startswith("Held metrics on main's commits: 1 commit(s) flagged (5505aa86fb)")
    ok, lines = verdict([*injected, row("n2")], kinds)
    assert not ok and "1 other commit(s)" in lines[0] and "does NOT hold" in lines[0]
    ok, lines = verdict(injected[:2], kinds)
    assert not ok and "2 of the 3" in lines[0] and lines[1].endswith("0 commit(s) flagged.")


def test_spread_summary_of_repeated_runs(tmp_path):
    module = aa_spread
    for k, (ratio, seconds) in enumerate(((1.00, 0.20), (1.02, 0.25), (0.99, 0.30)), 1):
        record = {
            "ratio_median": ratio,
            "seconds_median": seconds,
            "ruler_seconds_median": seconds / ratio,
            "first_result_s": 1.0,
            "peak_memory_gb": 1.0,
            "loadavg_after": 0.5,
            "stage_ratio_median": {"backbone": ratio + 0.1},
            "stage_s": {"backbone": [0.1, 0.3, 0.2], "outside": [0.1, 0.1, 0.1], "total": [0.25, 0.4, 0.3]},
        }
        run = {"timing": {"static/eager": _part(record)}, "compiles": {}, "accuracy": _part(skipped=True),
               "wall_s": 100.0 * k}
        (tmp_path / f"run_{k}.json").write_text(json.dumps(run))
    table = module.summarise(tmp_path)
    assert table.loc["static/eager stage backbone", "median"] == pytest.approx(1.1)
    assert table.loc["static/eager stage medians / call median", "median"] == pytest.approx(0.3 / 0.3)
    assert table.loc["measurement wall_s", "median"] == 200.0
    assert table.loc["static/eager ratio", "spread"] == pytest.approx(0.03 / 1.00)
    assert table.loc["static/eager seconds", "spread"] == pytest.approx(0.10 / 0.25)
    assert table.loc["static/eager ratio", "cv"] == pytest.approx(np.std([1.00, 1.02, 0.99], ddof=1) / np.mean(
        [1.00, 1.02, 0.99]))
    assert (tmp_path / "spread.md").read_text().startswith("# A/A spread over 3 runs")


def _asv_result(folder: Path, commit: str, date_ms: int, ratio: float, box_error: float) -> None:
    """A result file as asv writes it (api version 2), with the benchmarks asv_table reads."""
    columns = ["result", "params", "version", "started_at", "duration"]
    latency = ["'torchvision/eager'", "'static/eager'"]
    counts = [["'static/xla'", "'static/inductor'"], ["'xla_compiles'", "'fallback_ops'", "'graphs'", "'graph_breaks'",
                                                      "'recompiles'"]]
    results = {
        "benchmarks.Latency.track_ratio": [[1.0, ratio], [latency], "v", date_ms, 1.0],
        "benchmarks.Training.track_ratio": [[1.2], [["'static/train'"]], "v", date_ms, 1.0],
        "benchmarks.Compiles.track_count": [[2, 0, None, None, None, None, None, 2, 0, 1], counts, "v", date_ms, 1.0],
        "benchmarks.Accuracy.track_box_error": [[box_error], [], "v", date_ms, 1.0],
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "machine.json").write_text(json.dumps({"machine": folder.name, "version": 1}))
    (folder / f"{commit[:8]}-env-x.json").write_text(json.dumps({
        "commit_hash": commit, "env_name": "env-x", "date": date_ms, "params": {"machine": folder.name},
        "python": "3.11", "requirements": {}, "env_vars": {}, "result_columns": columns, "results": results,
        "durations": {}, "version": 2,
    }))


def test_asv_table_orders_commits_by_date_and_reads_every_held_metric(tmp_path):
    module = asv_results_table
    machine = tmp_path / "m1"
    _asv_result(machine, "b" * 40, 2_000_000_000_000, 1.10, 0.9)
    _asv_result(machine, "a" * 40, 1_000_000_000_000, 0.98, 0.2)
    frame = module.table(tmp_path, "m1")
    assert list(frame["commit"]) == ["aaaaaaaa", "bbbbbbbb"]
    assert list(frame["static/eager"]) == [0.98, 1.10] and list(frame["static/train"]) == [1.2, 1.2]
    assert list(frame["compiles (xla; inductor)"]) == ["2, 0; 2, 0, 1"] * 2
    assert list(frame["1 - box AP"]) == [0.2, 0.9] and frame["1 - mask AP"].isna().all()
    out = tmp_path / "t.md"
    assert module.main(["m1", "--results", str(tmp_path), "--out", str(out)]) == 0
    assert out.read_text().startswith("# m1: 2 commits")
    assert module.main(["nothing", "--results", str(tmp_path)]) == 2


def test_asv_table_levels_show_a_step_in_either_direction(tmp_path):
    """An improvement is a level too: the regressions page would not list it."""
    module = asv_results_table
    for k, ratio in enumerate((1.30, 1.31, 1.29, 1.00, 1.01, 0.99)):
        _asv_result(tmp_path / "m1", f"{k}" * 40, 1_000_000_000_000 + k * 1000, ratio, 0.2)
    levels = module.levels(module.table(tmp_path, "m1"))
    eager = levels[levels["ratio"] == "static/eager"]
    assert list(eager["from"]) == ["00000000", "33333333"] and list(eager["commits"]) == [3, 3]
    assert list(levels[levels["ratio"] == "static/train"]["commits"]) == [6]


def test_asv_table_keeps_the_commits_revs_names(tmp_path):
    """One machine may hold main's history and the scratch range, which interleave by date."""
    module = asv_results_table
    repo = tmp_path / "repo"
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "--quiet", str(repo)], check=True)
    hashes = []
    for k in range(3):
        subprocess.run([*git, "commit", "--quiet", "--allow-empty", "-m", f"c{k}"], check=True)
        done = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        hashes.append(done.stdout.strip())
    results = tmp_path / "results"
    for k, commit in enumerate(hashes):
        _asv_result(results / "m1", commit, 1_000_000_000_000 + k * 1000, 1.0, 0.2)
    _asv_result(results / "m1", "f" * 40, 1_000_000_000_500, 1.3, 0.2)  # another line of commits, between them
    assert len(module.table(results, "m1")) == 4
    assert module.commits(repo, "HEAD~1..HEAD") == {hashes[2]}
    frame = module.table(results, "m1", only=module.commits(repo, "HEAD"))
    assert list(frame["commit"]) == [h[:8] for h in hashes]
    out = tmp_path / "t.md"
    assert module.main(["m1", "--results", str(results), "--repo", str(repo), "--revs", "HEAD~1..HEAD",
                        "--out", str(out)]) == 0
    assert out.read_text().startswith("# m1: 1 commits of HEAD~1..HEAD")
    with pytest.raises(ValueError, match="no-such-branch"):
        module.commits(repo, "no-such-branch")
    assert module.main(["m1", "--results", str(results), "--repo", str(repo), "--revs", "no-such-branch"]) == 2
    assert module.main(["nothing", "--results", str(results), "--repo", str(repo), "--revs", "HEAD"]) == 2


def test_screenshot_graph_hash_leaves_machine_fields_free_unless_chosen():
    """Pinning each machine field to its first value selects nothing where machines disagree."""
    module = screenshots
    index = {
        "params": {"arch": [None, "x86_64"], "machine": ["a", "b"]},
        "benchmarks": {"L.track_ratio": {"param_names": ["case"], "params": [["'static/eager'", "'static/xla'"]]}},
    }
    assert module.graph_hash(index, "L.track_ratio") == "#L.track_ratio?p-case='static%2Feager'"
    chosen = {"branch": "main", "p-case": "'static/xla'"}
    assert module.graph_hash(index, "L.track_ratio", chosen) == "#L.track_ratio?p-case='static%2Fxla'&branch=main"
    assert module.drew_series('<div class="flot-tick-label tickLabel">1.2</div>')
    assert not module.drew_series('<div class="flot-base"></div>')


def test_screenshot_verdict_reads_whichever_pages_were_taken():
    """The index proves the scripts ran by listing the first benchmark; a graph, by drawing ticks."""
    not_rendered = screenshots.not_rendered
    grid, graph = '<a href="#A.track_x">x</a>', '<div class="tickLabel">1.2</div>'
    assert not_rendered({"index": grid, "graph": graph}, "A.track_x", "B.track_y") is None
    assert not_rendered({"graph": graph}, "A.track_x", "B.track_y") is None  # --pages graph
    assert "does not list A.track_x" in not_rendered({"index": "<body></body>"}, "A.track_x", "B")
    assert "B.track_y drew no series" in not_rendered({"graph": "<div></div>"}, "A.track_x", "B.track_y")
    failed = not_rendered({"graph": graph + "JavaScript dependencies failed to load"}, "A.track_x", "B")
    assert failed.startswith("the graph page's DOM shows")


def test_spread_refuses_a_folder_of_runs_from_another_plan(tmp_path, monkeypatch, capsys):
    """Runs of the old method (no plan recorded) or of another process plan are never pooled with new ones."""
    measured = []

    class Record:
        def to_dict(self):
            return {"timing": {}, "compiles": {}, "accuracy": _part(skipped=True)}

    monkeypatch.setattr(aa_spread, "measure_commit", lambda **kw: measured.append(kw) or Record())
    monkeypatch.setattr(aa_spread, "summarise", lambda out: pd.DataFrame())
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "run_1.json").write_text(json.dumps({"timing": {}, "compiles": {}, "accuracy": {}}))
    assert aa_spread.main(["--runs", "2", "--out", str(tmp_path / "old")]) == 2
    assert "run_1.json: no plan recorded" in capsys.readouterr().err and measured == []

    assert aa_spread.main(["--runs", "2", "--out", str(tmp_path / "new")]) == 0
    assert len(measured) == 2
    plan = json.loads((tmp_path / "new" / "run_2.json").read_text())["plan"]
    assert plan["method"] == "shared-rounds" and plan["processes"] == aa_spread.SHARED_PROCESSES
    assert aa_spread.main(["--runs", "3", "--out", str(tmp_path / "new")]) == 0 and len(measured) == 3  # resumes
    assert aa_spread.main(["--runs", "3", "--out", str(tmp_path / "new"), "--compiled-from", "7"]) == 2


@pytest.mark.parametrize("text", ["{", "[1, 2]", "[" * 100_000 + "]" * 100_000, '{"model_sha256": 7}', "\udcff"])
def test_a_damaged_fixture_or_run_record_is_one_line_naming_it(tmp_path, text):
    """Files the harness wrote but a user may have damaged: UsageError (exit 2) naming the file, never a bug."""
    from mrcnn_bench.base.errors import UsageError
    from mrcnn_bench.base.files import read_json
    from mrcnn_bench.history import asv_machine
    from mrcnn_bench.history.fixed_accuracy import Fixture

    path = tmp_path / "fixture.json"
    path.write_text(text, errors="surrogateescape")
    fixture = Fixture(tmp_path)
    if text.startswith('{"'):
        assert read_json(path, "x", dict) == {"model_sha256": 7}
    else:
        with pytest.raises(UsageError, match=r"fixture\.json: not x"):
            read_json(path, "x", dict)
    (tmp_path / "model.pt").write_bytes(b"weights")
    assert fixture.missing_reason() is None
    with pytest.raises(UsageError, match=r"fixture\.json"):
        asv_machine.machine_name(fixture)


def test_asv_table_escapes_names_from_the_result_files(tmp_path, capsys):
    """A case name in asv's results with '|' or an escape byte cannot add a column or reach the terminal."""
    machine = tmp_path / "m1"
    _asv_result(machine, "a" * 40, 1_000_000_000_000, 0.98, 0.2)
    path = next(machine.glob("aaaaaaaa-*.json"))
    doc = json.loads(path.read_text())
    doc["results"]["benchmarks.Latency.track_ratio"][1] = [["'torchvision/eager'", "'static|x\x1b[31m'"]]
    path.write_text(json.dumps(doc))
    assert asv_results_table.main(["m1", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "static\\|x\\x1b[31m" in out
    header, rule, *rows = [line for line in out.splitlines() if line.startswith("|")]
    assert header.count("|") - header.count("\\|") == rule.count("|") == rows[0].count("|")
