"""A long run keeps what it measured: SIGTERM writes the finished rounds, ``--resume`` times the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mrcnn_bench.running import journal

ROUNDS = 12
ARGS = ["run", "--cases", "torchvision/eager,static/eager", "--rounds", str(ROUNDS), "--image-size", "240x320",
        "--images", "1", "--threads", "1", "--peak-reps", "0", "--no-flops", "--no-plots", "--no-progress",
        "--name", "r"]


def bench(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mrcnn_bench", *ARGS, "--out", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def rounds_in(path: Path) -> int:
    if not path.is_file():
        return 0
    return sum('"kind": "round"' in line for line in path.read_text().splitlines())


def test_sigterm_writes_the_finished_rounds_and_resume_times_the_rest(tmp_path):
    log = tmp_path / "r.rounds.jsonl"
    proc = bench(tmp_path)
    deadline = time.monotonic() + 600
    while rounds_in(log) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "interrupted by SIGTERM" in err and "--resume" in err and "Traceback" not in err

    first = json.loads((tmp_path / "r.json").read_text())
    assert first["run"]["interrupted"] == "SIGTERM"
    done = {len(r["times_s"]) for r in first["records"]}
    assert len(done) == 1, "every row keeps the same rounds: a round cut short is dropped from all"
    (k,) = done
    assert 3 <= k < ROUNDS and rounds_in(log) == k
    assert "INTERRUPTED by SIGTERM" in (tmp_path / "r.md").read_text()

    wrong = bench(tmp_path, "--resume", "--seed", "1")
    _, err = wrong.communicate(timeout=300)
    assert wrong.returncode == 2 and "different run (seed differ)" in err, err

    resumed = bench(tmp_path, "--resume")
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    final = json.loads((tmp_path / "r.json").read_text())
    assert final["run"]["resumed_from_round"] == k and not final["run"].get("interrupted")  # written when set
    for before, after in zip(first["records"], final["records"], strict=True):
        assert len(after["times_s"]) == ROUNDS and after["times_s"][:k] == before["times_s"]
    assert not log.exists(), "a finished run leaves no journal to resume by mistake"


def test_a_torn_last_line_is_ignored_and_another_run_is_refused(tmp_path):
    path = tmp_path / "j.jsonl"
    key = {"rounds": 3, "workload": {"image_size": (240, 320)}}
    writer = journal.Writer(path, key, fresh=True)
    writer.round(0, {"a": journal.RowRound("ok", 0.5)}, {"loadavg_1m": 0.1})
    writer.round(1, {"a": journal.RowRound("timeout", None, "in round 2")}, {"loadavg_1m": 0.2})
    with path.open("a") as f:
        f.write('{"kind": "round", "round": 2, "rows": {"a": {"sta')  # a crash mid-write
    back = journal.read(path, key)
    assert [r["a"].seconds for r in back.rounds] == [0.5, None] and back.rounds[1]["a"].status == "timeout"
    with pytest.raises(ValueError, match="different run"):
        journal.read(path, {**key, "rounds": 4})
    with pytest.raises(ValueError, match="no journal"):
        journal.read(tmp_path / "absent.jsonl", key)
