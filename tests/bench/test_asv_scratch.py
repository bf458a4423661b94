"""The scratch commit range (``mrcnn-bench asv scratch``, mrcnn_bench.history.scratch_range) is the same everywhere
and changes what it says."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mrcnn_bench.history import scratch_range as scratch

ROOT = Path(__file__).resolve().parents[2]
# Run as a subprocess: the command line itself is tested.
COMMAND = [sys.executable, "-m", "mrcnn_bench", "asv", "scratch"]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="module")
def source_repo() -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--git-dir"], capture_output=True).returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout")
    if subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{scratch.BASE}^{{commit}}"]).returncode != 0:
        pytest.skip(f"base commit {scratch.BASE[:10]} is not in this clone (shallow?): git fetch --unshallow")
    return ROOT


def _clone(source: Path, dest: Path) -> Path:
    subprocess.run(["git", "clone", "--no-checkout", "--shared", "--quiet", str(source), str(dest)], check=True)
    return dest


@pytest.fixture(scope="module")
def built(source_repo, tmp_path_factory) -> tuple[Path, list[dict[str, str]], list[dict[str, str]], str]:
    """A throwaway clone with the range built twice: (clone, first run's commits, second's, HEAD before)."""
    repo = _clone(source_repo, tmp_path_factory.mktemp("scratch") / "repo")
    head = _git(repo, "rev-parse", "HEAD") + _git(repo, "symbolic-ref", "HEAD")
    runs = []
    for _ in range(2):
        result = _script("--repo", str(repo))
        assert result.returncode == 0, result.stderr
        listed = _script("--repo", str(repo), "--list")
        assert listed.returncode == 0, listed.stderr
        commits = json.loads(listed.stdout)
        for c in commits:
            assert c["hash"][:10] in result.stdout  # the table names each commit
        runs.append(commits)
    return repo, runs[0], runs[1], head


def test_same_hashes_every_run_and_check_passes(built, source_repo, tmp_path):
    repo, first, second, head = built
    assert len(first) == len(scratch.COMMITS) == 7
    assert first == second
    assert _git(repo, "rev-parse", scratch.REF).strip() == first[-1]["hash"]
    assert _git(repo, "rev-parse", "HEAD") + _git(repo, "symbolic-ref", "HEAD") == head  # HEAD untouched
    check = _script("--repo", str(repo), "--check")
    assert check.returncode == 0, check.stderr
    # Another clone, never built: --list gives the same hashes and --check fails without writing anything.
    other = _clone(source_repo, tmp_path / "other")
    objects = sorted((other / ".git" / "objects").rglob("*"))
    assert json.loads(_script("--repo", str(other), "--list").stdout) == first
    assert _script("--repo", str(other), "--check").returncode == 1
    assert sorted((other / ".git" / "objects").rglob("*")) == objects


def test_commits_are_linear_on_base_with_fixed_identity(built):
    repo, commits, _, _ = built
    parent = scratch.BASE
    for i, c in enumerate(commits):
        assert _git(repo, "rev-parse", f"{c['hash']}^").strip() == parent
        fields = _git(repo, "log", "-1", "--format=%an|%ae|%aI|%cn|%ce|%cI|%s", c["hash"]).strip().split("|")
        date = f"2026-11-23T15:{i + 1:02d}:00+00:00"
        assert fields == [scratch.AUTHOR_NAME, scratch.AUTHOR_EMAIL, date] * 2 + [c["subject"]]
        assert c["subject"].startswith(f"scratch {i + 1}/7 [{c['kind']}]: ")
        parent = c["hash"]
    assert [c["kind"] for c in commits] == ["noop", "slowdown", "noop", "recompile", "noop", "accuracy", "noop"]


def test_noops_change_no_model_code_and_each_injection_one_file(built):
    repo, commits, _, _ = built
    expected = {"slowdown": "mrcnn/model.py", "recompile": "mrcnn/transform.py", "accuracy": "mrcnn/roi_heads.py"}
    for c in commits:
        changed = _git(repo, "diff-tree", "--no-commit-id", "--name-only", "-r", c["hash"]).split()
        in_mrcnn = [p for p in changed if p.startswith("mrcnn/")]
        if c["kind"] == "noop":
            assert changed and not in_mrcnn, (c["subject"], changed)
        else:
            assert in_mrcnn == changed == [expected[c["kind"]]], (c["subject"], changed)


def test_missing_base_exits_2(tmp_path):
    subprocess.run(["git", "init", "--quiet", str(tmp_path)], check=True)
    for args in ((), ("--check",), ("--list",)):
        result = _script("--repo", str(tmp_path), *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "fetch the full history" in result.stderr


def test_anchor_must_occur_once():
    change = scratch.Replace("mrcnn/x.py", "anchor\n", "new\n")
    assert scratch.apply_change(change, "a\nanchor\nb\n", "commit 2/7 [slowdown]") == "a\nnew\nb\n"
    for content, why in (("a\n", "is missing"), ("anchor\nanchor\n", "occurs 2 times")):
        with pytest.raises(scratch.ScratchError, match=rf"commit 2/7 \[slowdown\]: mrcnn/x.py: .*{why}"):
            scratch.apply_change(change, content, "commit 2/7 [slowdown]")


def test_the_steps_range_slows_one_stage_per_commit_among_noops(source_repo):
    steps = scratch.STEPS
    commits = scratch.expected(source_repo, steps)  # a throwaway object directory: nothing written
    kinds = [c["kind"] for c in commits]
    assert kinds == ["noop"] * 11 + ["slowdown"] + ["noop"] * 11 + ["slowdown"] + ["noop"] * 5
    slow = [c for c in commits if c["kind"] == "slowdown"]
    assert [(c["stage"], c["designed_pct"]) for c in slow] == [("backbone", 3.0), ("mask_head", 5.0)]
    assert all(c["subject"].startswith(f"steps {i + 1}/29 [{c['kind']}]: ") for i, c in enumerate(commits))
    assert steps.revs == "asv-steps~29^..asv-steps"  # the base is measured: the first level has 12 commits
    files = {"backbone": "mrcnn/backbone.py", "mask_head": "mrcnn/mask_head.py"}
    with scratch.throwaway_objects(scratch.Git(source_repo)) as git:
        built = scratch.build(git, steps)
        assert built == commits
        for c in built:
            changed = git.run("diff-tree", "--no-commit-id", "--name-only", "-r", c["hash"]).split()
            assert changed == ([files[c["stage"]]] if c["kind"] == "slowdown" else [scratch.STEPS_NOTES])


def test_the_work_range_changes_work_in_one_stage_per_commit_among_noops(source_repo):
    """The counters' range: the steps range's two injections, 1% more mask-head FLOPs and one more RPN
    operator, each editing one file of its stage, among commits that change no code."""
    commits = scratch.expected(source_repo, scratch.WORK)
    assert [c["kind"] for c in commits] == ["noop", "noop", "work", "noop", "work", "noop", "work", "noop", "work",
                                            "noop", "noop", "noop"]
    assert [c["stage"] for c in commits if c["kind"] == "work"] == ["backbone", "rpn_rest", "mask_head", "mask_head"]
    assert scratch.WORK.revs == "asv-work~12^..asv-work" and "work" not in scratch.RANGES  # asv does not measure it
    files = {"backbone": "mrcnn/backbone.py", "rpn_rest": "mrcnn/rpn.py", "mask_head": "mrcnn/mask_head.py"}
    with scratch.throwaway_objects(scratch.Git(source_repo)) as git:
        for c in scratch.build(git, scratch.WORK):
            changed = git.run("diff-tree", "--no-commit-id", "--name-only", "-r", c["hash"]).split()
            assert changed == ([files[c["stage"]]] if c["kind"] == "work" else [scratch.WORK_NOTES])


def test_the_levels_are_measured_in_turn():
    line = ["b", "n1", "n2", "s1", "n3", "s2", "n4", "n5", "n6"]
    kinds = ["noop", "noop", "noop", "slowdown", "noop", "slowdown", "noop", "noop", "noop"]
    order = scratch.measure_order(line, kinds)
    assert order == ["b", "s1", "s2", "n1", "n3", "n4", "n2", "n5", "n6"]
    assert sorted(order) == sorted(line)
