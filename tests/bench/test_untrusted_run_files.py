"""Run files and journals from outside: nothing written outside --out, nothing raw in a page, no finished
round lost to a forgotten --resume, a second process, a torn line or a crash mid-write."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.cli import commands as cli
from mrcnn_bench.reports import report
from mrcnn_bench.running import journal, store
from mrcnn_bench.running.cases import Workload
from mrcnn_bench.running.records import Record, RunDocument, RunInfo

SCRIPT = "<script>alert(1)</script>"
QUOTE_BREAK = '"><img src=x onerror=alert(1)>'


def _doc(name: str = "t", row: str = "static/eager", detail: str = "") -> RunDocument:
    times = [0.1, 0.11, 0.12]
    records = [Record(row=row, case="static/eager", impl="static", compiler="eager", backend="cpu",
                      status="error" if detail else "ok", detail=detail, times_s=times,
                      median_s=float(np.median(times)))]
    info = RunInfo(workload=Workload(), options={"rounds": 3, "warmup": 1}, weights="synthetic")
    env = {k: "?" for k in ("torch", "torchvision", "torch_xla", "cpu", "gpu", "threads", "seed", "commit", "date",
                            "affinity")}
    return RunDocument(name=name, records=records, run=info, environment=env)


def test_the_page_escapes_what_run_files_hold(tmp_path):
    doc = _doc(row=f"x{SCRIPT}", detail=QUOTE_BREAK)
    report.write(doc, tmp_path, with_plots=False)
    page = (tmp_path / "t.html").read_text()
    assert SCRIPT not in page and "onerror=alert(1)>" not in page
    assert "&lt;script&gt;" in page


@pytest.mark.parametrize("name", ["../ESCAPED", "/tmp/abs", "a/b", ".hidden", "", "x..y", None, 3])
def test_a_run_name_that_is_not_a_file_stem_is_refused(tmp_path, name):
    raw = json.loads(store.dumps(_doc()))
    raw["name"] = name
    path = tmp_path / "run.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="file stem"):
        store.load(path)
    with pytest.raises(ValueError, match="--name must be a file stem"):
        journal.path_for(tmp_path, name)


def test_report_of_a_run_file_named_outside_out_exits_2_and_writes_nothing(tmp_path):
    raw = json.loads(store.dumps(_doc()))
    raw["name"] = "../ESCAPED"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "run.json").write_text(json.dumps(raw))
    proc = subprocess.run([sys.executable, "-m", "mrcnn_bench", "report", str(tmp_path / "in" / "run.json"),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "file stem" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("ESCAPED*"))


def _journal(path, rounds: int, torn: bool = False) -> None:
    w = journal.Writer(path, {"k": 1}, fresh=True)
    for i in range(rounds):
        w.round(i, {"a": journal.RowRound("ok", 0.1 + i)}, {})
    if torn:
        with path.open("a") as f:
            f.write('{"kind": "round", "round": 9')  # a write cut short by a crash


def test_a_fresh_run_over_finished_rounds_is_refused_unless_told(tmp_path):
    path = tmp_path / "r.rounds.jsonl"
    _journal(path, 2)
    with pytest.raises(ValueError, match=r"2 finished round\(s\).*--resume continues it, --start-over discards it"):
        journal.check_fresh(path, start_over=False)
    journal.check_fresh(path, start_over=True)
    _journal(path, 0)  # a start line alone: nothing to lose
    journal.check_fresh(path, start_over=False)
    journal.check_fresh(tmp_path / "absent.rounds.jsonl", start_over=False)


def test_resume_cuts_a_torn_tail_before_appending(tmp_path):
    path = tmp_path / "r.rounds.jsonl"
    _journal(path, 2, torn=True)
    w = journal.Writer(path, {"k": 1}, fresh=False)
    w.round(2, {"a": journal.RowRound("ok", 0.3)}, {})
    w.round(3, {"a": journal.RowRound("ok", 0.4)}, {})
    back = journal.read(path, {"k": 1})
    assert [r["a"].seconds for r in back.rounds] == [0.1, 1.1, 0.3, 0.4]


def test_one_process_at_a_time_holds_a_journal(tmp_path):
    path = tmp_path / "r.rounds.jsonl"
    held = journal.hold(path)
    code = f"from mrcnn_bench.running import journal; from pathlib import Path; journal.hold(Path({str(path)!r}))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert other.returncode != 0 and f"being written by process {os.getpid()}" in other.stderr
    held.close()
    journal.hold(path).close()  # free again once the holder is gone
    assert [p.name for p in tmp_path.iterdir()] == [path.name], "the lock is the journal: nothing else is added"


def test_the_lock_is_seen_whatever_the_temporary_folder(tmp_path, monkeypatch):
    """Two runs of one --out and --name with different TMPDIRs see each other's lock."""
    path = tmp_path / "out" / "r.rounds.jsonl"
    held = journal.hold(path)
    code = f"from mrcnn_bench.running import journal; from pathlib import Path; journal.hold(Path({str(path)!r}))"
    elsewhere = tmp_path / "other-tmp"
    elsewhere.mkdir()
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "TMPDIR": str(elsewhere)})
    held.close()
    assert other.returncode != 0 and "being written by process" in other.stderr, other.stderr


def test_a_symlink_at_the_journal_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    journal.path_for(out, "r").symlink_to(target)
    with pytest.raises(UsageError, match="symbolic link"):
        journal.open_for_run(str(out), "r", resume=True, start_over=False)
    with pytest.raises(UsageError, match="symbolic link"):
        journal.open_for_run(str(out), "r", resume=False, start_over=True)
    assert target.read_text() == "keep me\n"


def test_run_refuses_before_measuring_over_finished_rounds_and_while_held(tmp_path):
    path = journal.path_for(tmp_path, "r")
    _journal(path, 3)
    args = [sys.executable, "-m", "mrcnn_bench", "run", "--cases", "static/eager", "--rounds", "1",
            "--out", str(tmp_path), "--name", "r", "--no-progress"]
    refused = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "--start-over discards it" in refused.stderr, refused.stderr
    assert journal.read_lines(path)[-1]["round"] == 2, "the finished rounds are still there"
    held = journal.hold(path)
    busy = subprocess.run([*args, "--start-over"], capture_output=True, text=True, timeout=300)
    held.close()
    assert busy.returncode == 2 and "being written by process" in busy.stderr, busy.stderr
    both = subprocess.run([*args, "--start-over", "--resume"], capture_output=True, text=True, timeout=300)
    assert both.returncode == 2 and "give one" in both.stderr


def test_a_crash_while_saving_leaves_the_previous_run_file(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    store.save(_doc(), path)
    before = path.read_text()

    def crash(*_args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        store.save(_doc(detail="changed"), path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"], "no temporary file left behind"


def test_two_run_files_of_one_name_get_a_page_each(tmp_path):
    for machine in ("a", "b"):
        store.save(_doc(name="run_tiny"), tmp_path / machine / "run_tiny.json")
    proc = subprocess.run([sys.executable, "-m", "mrcnn_bench", "report", str(tmp_path / "a" / "run_tiny.json"),
                           str(tmp_path / "b" / "run_tiny.json"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "shown as 'run_tiny-2'" in proc.stderr
    assert (tmp_path / "out" / "run_tiny.html").is_file() and (tmp_path / "out" / "run_tiny-2.html").is_file()
    assert "run_tiny-2.html" in (tmp_path / "out" / "index.html").read_text()


@pytest.mark.parametrize("times", [[0.1, None], [-0.1, 0.2], [float("nan")], "0.1", [True]])
def test_a_run_file_whose_times_are_not_times_is_refused(tmp_path, times):
    raw = json.loads(store.dumps(_doc()))
    raw["records"][0]["times_s"] = times
    path = tmp_path / "run.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"run\.json: record 'static/eager': times_s must be a list of seconds"):
        store.load(path)
    if times == [0.1, None]:  # the command line once (it crashed with exit 3 on this file)
        proc = subprocess.run([sys.executable, "-m", "mrcnn_bench", "report", str(path), "--out",
                               str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and "times_s" in proc.stderr and "internal error" not in proc.stderr


@pytest.mark.parametrize(("row", "problem"), [({"status": "ok", "seconds": float("nan")}, "not a time"),
                                              ({"status": "ok", "seconds": -1.0}, "not a time"),
                                              ({"status": "ok", "bogus": 1}, "not a round")])
def test_a_journal_round_that_is_not_a_round_is_refused(tmp_path, row, problem):
    path = tmp_path / "r.rounds.jsonl"
    _journal(path, 1)
    with path.open("a") as f:
        f.write(json.dumps({"kind": "round", "round": 1, "machine": {}, "rows": {"a": row}}) + "\n")
    with pytest.raises(ValueError, match=rf"line 3.*{problem}"):
        journal.read(path, {"k": 1})


def test_a_damaged_run_file_in_a_folder_is_an_error_other_json_is_not(tmp_path):
    store.save(_doc(name="good"), tmp_path / "good.json")
    (tmp_path / "notes.json").write_text('{"other": "json"}')
    assert [doc.name for _, doc in store.load_runs([tmp_path])] == ["good"]
    raw = json.loads(store.dumps(_doc(name="bad")))
    raw["records"][0]["times_s"] = None
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"bad\.json"):
        store.load_runs([tmp_path])


@pytest.mark.parametrize("tag", ["a,b", "a/b", "a b"])
def test_a_case_tag_that_cannot_be_selected_is_refused(tag):
    from mrcnn_bench.running.cases import Case  # here: the other tests need no case machinery

    with pytest.raises(ValueError, match="case tag"):
        Case("static", tag=tag)


@pytest.mark.parametrize("command", [["report", "{f}", "--out", "{out}"], ["compare", "{f}", "{f}"],
                                     ["check-benchmarks", "{f}"]])
def test_json_nested_too_deeply_is_one_line_exit_2(tmp_path, capsys, command):
    """50,000 levels of nesting: Python's parser runs out of stack; the file is named, never a traceback."""
    f = tmp_path / "deep.json"
    f.write_text("[" * 50_000 + "]" * 50_000)
    code = cli.main([part.format(f=f, out=tmp_path / "out") for part in command])
    err = capsys.readouterr().err
    assert code == 2 and "deep.json" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
