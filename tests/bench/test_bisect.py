"""bisect: the search over commits, skipped commits, and the command's exit codes and record.

The verdicts here come from a judge that knows where the step is (the live compare's own
statistics are tested in test_pair_compare.py); what is tested is which commits get measured and
what is concluded from their verdicts.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from mrcnn_bench.base import vcs
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.changes import bisection as bisect
from mrcnn_bench.running import store

COMMITS = [f"c{i:02d}" for i in range(20)]


def _judge(step: int, skip: frozenset[int] = frozenset(), seen: list[str] | None = None):
    def judge(commit: str) -> bool | None:
        i = COMMITS.index(commit)
        if seen is not None:
            seen.append(commit)
        return None if i in skip else i >= step

    return judge


@pytest.mark.parametrize("step", [0, 1, 7, 18, 19])
def test_the_first_slow_commit_is_found_measuring_about_log2_commits(step):
    seen: list[str] = []
    found = bisect.search(COMMITS, _judge(step, seen=seen))
    assert found.first_bad == COMMITS[step] and found.candidates == [COMMITS[step]] and not found.skipped
    assert seen[0] == COMMITS[-1]  # BAD first
    assert len(seen) <= 1 + math.ceil(math.log2(len(COMMITS)))
    assert len(set(seen)) == len(seen)  # no commit measured twice


def test_a_skipped_commit_is_stepped_around_and_named():
    found = bisect.search(COMMITS, _judge(12, skip=frozenset({9, 10})))
    assert found.first_bad == COMMITS[12] and set(found.skipped) <= {COMMITS[9], COMMITS[10]}
    # The commit just before the step cannot be measured: either may be the first.
    found = bisect.search(COMMITS, _judge(12, skip=frozenset({11})))
    assert found.first_bad is None and found.candidates == [COMMITS[11], COMMITS[12]]
    assert found.skipped == [COMMITS[11]]


def test_bad_not_slower_or_not_measured_ends_the_search_at_once():
    seen: list[str] = []
    found = bisect.search(COMMITS, _judge(99, seen=seen))
    assert found.first_bad is None and seen == [COMMITS[-1]] and found.verdicts == {COMMITS[-1]: False}
    found = bisect.search(COMMITS, _judge(0, skip=frozenset({19})))
    assert found.first_bad is None and found.skipped == [COMMITS[-1]]


def _fake_judge(step_index: int):
    def make(opts, log=None):
        records: list[dict] = []
        commits = bisect.commits_between(opts.good, opts.bad)

        def judge(commit: str) -> bool | None:
            verdict = commits.index(commit) >= step_index
            records.append({"commit": commit, "verdict": verdict})
            return verdict

        return judge, records

    return make


def test_the_command_names_the_commit_and_writes_every_verdict(tmp_path, monkeypatch, capsys):
    """On this repository's own line HEAD~3..HEAD, with the judge replaced (no timing here)."""
    try:
        commits = vcs.rev_list(store.REPO, "HEAD~3..HEAD", reverse=True)
    except vcs.GitError:
        pytest.skip("the checkout has fewer than 4 commits")
    if len(commits) != 3:
        pytest.skip("HEAD~3..HEAD is not a straight line here")
    run = SimpleNamespace(rounds=20)  # only its round count is recorded: the judge runs nothing
    opts = bisect.BisectOptions("HEAD~3", "HEAD", cases=[], run=run, out=str(tmp_path / "b.json"))  # type: ignore[arg-type]
    monkeypatch.setattr(bisect, "live_judge", _fake_judge(1))
    assert bisect.bisect(opts) == bisect.FOUND
    assert f"first slower commit: {commits[1]}" in capsys.readouterr().out
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["first_bad"] == commits[1] and doc["commits"] == commits and doc["compares"][0]["commit"] == commits[-1]
    monkeypatch.setattr(bisect, "live_judge", _fake_judge(99))
    assert bisect.bisect(opts) == bisect.NOTHING


@pytest.mark.parametrize(("good", "bad", "match"), [
    ("HEAD", "HEAD~1", "must come after"),
    ("no-such-ref-x", "HEAD", "names no commit"),
    ("--output=/tmp/x", "HEAD", "names no commit"),
])
def test_refs_that_make_no_line_are_refused_in_one_line(good, bad, match):
    with pytest.raises(UsageError, match=match):
        bisect.commits_between(good, bad)


def test_the_bisect_study_breaks_one_commit_of_a_copy_of_the_steps_range(tmp_path):
    """bisect_teeth: asv-steps-skip is the steps range with one commit whose mrcnn cannot be imported
    and its repair inserted; every other commit keeps its tree, and the bisects expect the range's
    slowdowns (the second starting from the first)."""
    import subprocess

    from studies.bisect_teeth import bisect_on_range as study

    from mrcnn_bench.history.scratch_commits import STEPS
    from mrcnn_bench.history.scratch_range import Git, create

    if vcs.run(store.REPO, "cat-file", "-e", f"{STEPS.base}^{{commit}}", check=False).returncode != 0:
        pytest.skip(f"the steps range's base {STEPS.base[:10]} is not in this clone (shallow?)")
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "--no-checkout", "--shared", "--quiet", str(store.REPO), str(repo)], check=True)
    git = Git(repo)
    steps = create(repo, STEPS)
    line = create(repo, study.SKIP)
    assert len(line) == len(steps) + 2 and git.run("rev-parse", study.SKIP_BRANCH).strip() == line[-1]["hash"]
    tree = lambda c: git.run("rev-parse", f"{c}^{{tree}}").strip()  # noqa: E731
    broken, repair = line[study.SKIP_AFTER], line[study.SKIP_AFTER + 1]
    anchor = steps[study.SKIP_AFTER - 1]["hash"]
    assert git.run("diff", "--name-only", anchor, broken["hash"]).split() == [study.BROKEN]
    assert study.BROKEN_LINE in git.run("show", f"{broken['hash']}:{study.BROKEN}")
    assert tree(repair["hash"]) == tree(anchor)
    copies = line[:study.SKIP_AFTER] + line[study.SKIP_AFTER + 2:]
    assert [tree(c["hash"]) for c in copies] == [tree(c["hash"]) for c in steps]
    assert [c["kind"] for c in copies] == [c["kind"] for c in steps]
    count = git.run("rev-list", "--first-parent", "--count", f"{STEPS.base}..{study.SKIP_BRANCH}")
    assert int(count) == len(line)
    seen: list[str] = []
    bisect.search([c["hash"] for c in line], lambda c: seen.append(c) or c != broken["hash"] or None)
    assert seen[:2] == [line[-1]["hash"], broken["hash"]], "the search must meet the broken commit first"
    plan = study.bisects(steps, line)
    slow = [c["hash"] for c in steps if c["kind"] == "slowdown"]
    assert plan["first"]["expected"] == slow[0]
    assert (plan["second"]["good"], plan["second"]["expected"]) == (slow[0], slow[1])
    assert plan["skip"]["broken"] == broken["hash"] and plan["skip"]["bad"] == line[-1]["hash"]
    assert plan["skip"]["expected"] == next(c["hash"] for c in line if c["kind"] == "slowdown")
