"""No finished round is lost or counted twice, however a run dies: SIGKILL at seeded points (during a
round, between rounds, in the middle of a journal line through the writer's fault hook), each followed
by ``--resume`` (3 points in CI, one of each kind; 20 in ``make test-all``); and two runs racing for
one name. A real row (static eager, tiny, in process) at a small image size keeps each cycle to
seconds.

After each kill, the journal's whole rounds are read: a round once finished must stay, with the same
seconds. The final run file must hold exactly the rounds asked for, every round seen finished with
the seconds it was journaled with.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mrcnn_bench.running import journal

ROUNDS = 60
ROW = "static/eager"
ARGS = ["run", "--cases", ROW, "--image-size", "64x64", "--images", "1", "--rounds", str(ROUNDS), "--threads", "1",
        "--peak-reps", "0", "--no-flops", "--no-plots", "--no-progress", "--in-process", "--name", "k"]


def _start(out: Path, cache: Path, *extra: str, tear_at: int | None = None) -> subprocess.Popen:
    env = {**os.environ, "MRCNN_CONTEXT_CACHE": str(cache)}  # the inputs made once, not in every cycle
    if tear_at is not None:
        env[journal.TEAR_ENV] = str(tear_at)
    resume = ["--resume"] if journal.path_for(out, "k").is_file() else []
    return subprocess.Popen([sys.executable, "-m", "mrcnn_bench", *ARGS, "--out", str(out), *resume, *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def _finished(out: Path) -> dict[int, float]:
    """Round -> the row's seconds, of every whole round line in the journal."""
    lines = journal.read_lines(journal.path_for(out, "k"))
    return {line["round"]: line["rows"][ROW]["seconds"] for line in lines if line.get("kind") == "round"}


def _wait_for_round(out: Path, proc: subprocess.Popen, target: int, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while len(_finished(out)) < target and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)


def _kill_and_resume(tmp_path: Path, kills: int) -> None:
    """``kills`` runs killed in turn (each kind in rotation, at seeded moments), then one resumed to the end."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    rng = random.Random(0)
    seen: dict[int, float] = {}
    kinds = ["during a round", "between rounds", "mid-line"]
    for i in range(kills):
        done = len(_finished(out))
        kind = kinds[i % 3]
        if kind == "mid-line":
            proc = _start(out, cache, tear_at=done + rng.randint(0, 1))
        else:
            proc = _start(out, cache)
            _wait_for_round(out, proc, done + rng.randint(1, 2))
            time.sleep(rng.uniform(0.0, 0.05) if kind == "between rounds" else rng.uniform(0.05, 0.2))
            proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL, (kind, proc.returncode, err)
        now = _finished(out)
        assert {r: now[r] for r in seen} == seen, f"a finished round was lost or rewritten after a kill {kind}"
        assert sorted(now) == list(range(len(now))), "rounds in order, none twice"
        seen = now
    assert len(seen) < ROUNDS, "every kill came before the run could finish"

    last = _start(out, cache)
    _, err = last.communicate(timeout=600)
    assert last.returncode == 0, err
    (record,) = json.loads((out / "k.json").read_text())["records"]
    assert len(record["times_s"]) == ROUNDS
    assert all(record["times_s"][r] == s for r, s in seen.items()), "each finished round kept, exactly once"
    assert not journal.path_for(out, "k").exists()


@pytest.mark.slow
def test_sigkill_at_three_points_loses_no_round_and_repeats_none(tmp_path):
    _kill_and_resume(tmp_path, 3)  # one of each kind


@pytest.mark.slow  # twenty runs started and killed: the slowest test of the suite
@pytest.mark.extended(ci="tests/bench/test_kill_resume.py::test_sigkill_at_three_points_loses_no_round_and_repeats_none")
def test_sigkill_at_twenty_points_loses_no_round_and_repeats_none(tmp_path):
    _kill_and_resume(tmp_path, 20)  # 7, 7 and 6 of the three kinds


def test_two_runs_racing_for_one_name(tmp_path):
    """Both start at once: one is refused at once naming the holder, the other is killed after 2 rounds
    and resumed; the rounds it journaled are in the run file, once."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    rounds = ["--rounds", "12"]  # after ARGS' own --rounds: argparse keeps the last
    a, b = _start(out, cache, *rounds), _start(out, cache, *rounds)
    deadline = time.monotonic() + 120
    while a.poll() is None and b.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    loser, winner = (a, b) if a.poll() is not None else (b, a)
    _, err = loser.communicate(timeout=60)
    assert loser.returncode == 2 and "being written by process" in err, err
    _wait_for_round(out, winner, 2)
    winner.send_signal(signal.SIGKILL)
    winner.communicate(timeout=120)
    before = _finished(out)
    assert len(before) >= 2
    last = _start(out, cache, *rounds)
    _, err = last.communicate(timeout=600)
    assert last.returncode == 0, err
    (record,) = json.loads((out / "k.json").read_text())["records"]
    assert len(record["times_s"]) == 12 and all(record["times_s"][r] == s for r, s in before.items())
