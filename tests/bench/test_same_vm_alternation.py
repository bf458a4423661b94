"""bench/studies/commit_cost/same_vm_aa.sh: which side runs when, what each side is given, resuming
and stopping, with a stand-in for the measuring interpreter (no torch, no timing)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path("bench/studies/commit_cost/same_vm_aa.sh")
THIS_HARNESS = "-m mrcnn_bench asv spread"  # what this checkout's side runs (its bench/ first on the path)

# Stands in for the venv's python: called as `PY history_spread.py --runs K --out DIR [--compiled-from P]` or
# `PY -m mrcnn_bench asv spread --runs K ...`, it writes DIR/run_K.json with what it was given (the words
# before the first option as "script"), as an A/A run writes its record.
FAKE_PYTHON = """#!/usr/bin/env bash
script=$1; shift
while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do script="$script $1"; shift; done
plan=none
while [ $# -gt 0 ]; do
    case $1 in --runs) k=$2; shift 2;; --out) out=$2; shift 2;; --compiled-from) plan=$2; shift 2;; *) shift;; esac
done
printf '{"plan": "%s", "script": "%s", "pythonpath": "%s"}' "$plan" "$script" "$PYTHONPATH" > "$out/run_$k.json"
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository holding the script alone, one commit (the REF both sides measure)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "repo"
    (root / SCRIPT.parent).mkdir(parents=True)
    shutil.copy(REPO / SCRIPT, root / SCRIPT)
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "r"]):
        subprocess.run(["git", "-C", str(root), *args], check=True)
    return root


def alternate(repo: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "fake_python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = {**os.environ, "PY": str(fake), "MRCNN_ASV_FIXTURE": str(tmp_path / "no_fixture")}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=repo, env=env, capture_output=True, text=True, timeout=60)


def starts(log: Path) -> list[str]:
    """'plan-0 1', ... in the order the log says the runs started."""
    return [f"{m[1]} {m[2]}" for m in re.finditer(r"start (\S+) run (\d+)", log.read_text())]


def test_plans_alternate_with_the_first_side_swapped_each_pair(repo, tmp_path):
    first, second = tmp_path / "plan0", tmp_path / "plan1"
    done = alternate(repo, tmp_path, "--plans", "HEAD", "3", str(first), str(second))
    assert done.returncode == 0, done.stderr
    order = ["plan-0 1", "plan-1 1", "plan-1 2", "plan-0 2", "plan-0 3", "plan-1 3"]
    assert starts(second / "alternation.log") == order
    for folder, plan in ((first, "0"), (second, "1")):
        records = [json.loads((folder / f"run_{k}.json").read_text()) for k in (1, 2, 3)]
        assert {r["plan"] for r in records} == {plan}
        # both plans run this checkout's harness (its bench/ first on the path) on REF's model
        assert all(r["pythonpath"].startswith(f"{repo}/bench:") for r in records)
        assert all(r["script"] == THIS_HARNESS for r in records)
    assert "no accuracy fixture" in (second / "alternation.log").read_text()


def test_a_rerun_measures_only_the_missing_runs_and_stop_ends_it(repo, tmp_path):
    first, second = tmp_path / "plan0", tmp_path / "plan1"
    assert alternate(repo, tmp_path, "--plans", "HEAD", "2", str(first), str(second)).returncode == 0
    (second / "run_2.json").unlink()
    (second / "alternation.log").unlink()
    assert alternate(repo, tmp_path, "--plans", "HEAD", "2", str(first), str(second)).returncode == 0
    assert starts(second / "alternation.log") == ["plan-1 2"]
    (second / "STOP").touch()
    assert alternate(repo, tmp_path, "--plans", "HEAD", "4", str(first), str(second)).returncode == 0
    assert not (first / "run_3.json").exists()
    assert "stopped before plan 0 run 1" in (second / "alternation.log").read_text()


def test_the_two_ways_run_refs_harness_then_this_checkouts(repo, tmp_path):
    per_case, shared = tmp_path / "per_case", tmp_path / "shared"
    assert alternate(repo, tmp_path, "HEAD", "2", str(per_case), str(shared)).returncode == 0
    assert starts(shared / "alternation.log") == ["per-case 1", "shared 1", "per-case 2", "shared 2"]
    ref_side = json.loads((per_case / "run_1.json").read_text())
    assert ref_side["plan"] == "none" and not ref_side["script"].startswith(str(repo))  # REF's own worktree
    assert ref_side["script"].endswith("/bench/tools/history_spread.py")
    assert json.loads((shared / "run_1.json").read_text())["script"] == THIS_HARNESS


def test_missing_arguments_are_a_usage_error(repo, tmp_path):
    done = alternate(repo, tmp_path, "--plans", "HEAD")
    assert done.returncode != 0
    assert "usage: same_vm_aa.sh" in done.stderr
