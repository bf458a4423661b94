"""``mrcnn-bench bisect GOOD BAD``: the first commit that a live compare in process pairs confirms slower than GOOD.

The commits are GOOD's descendants on BAD's first-parent line, oldest first (``git rev-list
--first-parent GOOD..BAD``). Every verdict is a live compare of GOOD against one commit, in process
pairs (:func:`mrcnn_bench.gates.ab.run_live`, :func:`mrcnn_bench.gates.ab.live_table`): "slower by
more than the threshold", Holm-corrected over the cases. BAD is judged first: if it is not confirmed
slower there is nothing to bisect. Then a binary search between the last commit known not slower
and the first known slower, as ``asv find`` does, measuring only the commits it needs. A commit
whose compare cannot decide (it does not build, a case errors or is skipped) is skipped and named,
as ``git bisect skip`` does: the next commit tried is the untested one nearest the middle, and when
only skipped commits separate the two ends, each of them may be the first.

The search assumes the slowdown, once in, stays (a step, not a spike); a commit judged against
GOOD, not against its parent, is what makes a verdict at one commit valid for those after it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mrcnn_bench.base import defaults, timing, vcs
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.running import runner, store
from mrcnn_bench.running.cases import Case

Judge = Callable[[str], "bool | None"]  # commit -> slower than GOOD (True), not (False), could not tell (None)
FOUND, NOTHING, UNDECIDED = 1, 0, 2  # exit codes: a first slow commit named; BAD not slower; could not tell


@dataclass
class BisectOptions:
    """``bisect GOOD BAD``: the cases and how each compare runs (``run``'s rows are replaced)."""

    good: str
    bad: str
    cases: list[Case]
    run: runner.RunOptions
    pairs: int = defaults.COMPARE_PAIRS
    threshold: float = defaults.PAIR_THRESHOLD
    alpha: float = defaults.ALPHA
    out: str | None = None  # write every verdict as JSON here


@dataclass
class Search:
    """What the search found: per commit measured, its verdict, in the order measured."""

    commits: list[str]
    verdicts: dict[str, bool | None] = field(default_factory=dict)
    first_bad: str | None = None  # the first slow commit, when no skipped commit comes before it
    candidates: list[str] = field(default_factory=list)  # skipped commits that may be the first, then first_bad

    @property
    def skipped(self) -> list[str]:
        return [c for c in self.commits if self.verdicts.get(c, False) is None]


def search(commits: list[str], judge: Judge) -> Search:
    """Binary search for the first commit ``judge`` calls slower; ``commits`` oldest first, the last
    being BAD (judged first). Skipped commits (verdict None) are stepped around, nearest the middle first."""
    found = Search(commits)
    if not commits:
        return found
    found.verdicts[commits[-1]] = judge(commits[-1])
    if found.verdicts[commits[-1]] is not True:
        return found
    lo, hi = -1, len(commits) - 1  # commits[lo] not slower (-1: GOOD itself), commits[hi] slower
    while True:
        untested = [i for i in range(lo + 1, hi) if commits[i] not in found.verdicts]
        if not untested:
            break
        middle = (lo + hi) / 2
        i = min(untested, key=lambda j: (abs(j - middle), j))
        verdict = found.verdicts[commits[i]] = judge(commits[i])
        if verdict is True:
            hi = i
        elif verdict is False:
            lo = i
    between = [c for c in commits[lo + 1:hi] if found.verdicts.get(c) is None]
    found.candidates = [*between, commits[hi]]
    found.first_bad = commits[hi] if not between else None
    return found


def commits_between(good: str, bad: str) -> list[str]:
    """GOOD's descendants on BAD's first-parent line up to BAD, oldest first; UsageError when BAD is
    not a descendant of GOOD or names no commit."""
    for ref in (good, bad):
        if vcs.commit_of(store.REPO, ref) is None:
            raise UsageError(f"{ref!r} names no commit of {store.REPO}")
    commits = vcs.output(store.REPO, "rev-list", "--first-parent", "--reverse", "--end-of-options",
                         f"{vcs.check_ref(good)}..{vcs.check_ref(bad)}").split()
    if not commits:
        raise UsageError(f"no commit between {good} and {bad}: BAD must come after GOOD")
    if vcs.output(store.REPO, "merge-base", "--end-of-options", good, bad) != vcs.commit_of(store.REPO, good):
        raise UsageError(f"{good} is not an ancestor of {bad}: bisect needs a line from GOOD to BAD")
    return commits


def live_judge(opts: BisectOptions, log: Callable[[str], None] = runner.log) -> tuple[Judge, list[dict[str, Any]]]:
    """A judge that compares GOOD against a commit live, and the record of every compare it ran."""
    from mrcnn_bench.gates import ab  # lazy: loads torch

    records: list[dict[str, Any]] = []

    def judge(commit: str) -> bool | None:
        clock = timing.Stopwatch()
        compare = ab.CompareOptions(opts.good, commit, cases=opts.cases, run=opts.run, pairs=opts.pairs,
                                    threshold=opts.threshold, alpha=opts.alpha)
        try:
            table = ab.live_table(ab.run_live(compare), opts.threshold, opts.alpha)
        except (UsageError, OSError, vcs.GitError) as e:  # a commit that cannot be checked out or run
            verdict, lines = None, [f"{type(e).__name__}: {e}"]
        else:
            decided = not table.empty and table["p_value"].notna().all() and len(table) == len(opts.cases)
            verdict = bool(table["regression"].any()) if decided else None
            lines = [f"{row['case']}: {row['verdict']}" for _, row in table.iterrows()]
        word = {True: "SLOWER", False: "not slower", None: "SKIPPED (could not decide)"}[verdict]
        log(f"bisect: {commit[:10]} {word} than {opts.good} ({clock.elapsed():.0f} s)")
        records.append({"commit": commit, "verdict": verdict, "seconds": clock.elapsed(), "cases": lines})
        return verdict

    return judge, records


def bisect(opts: BisectOptions) -> int:
    """Print the first slow commit (exit 1), that BAD is not slower (0), or that it could not tell (2)."""
    commits = commits_between(opts.good, opts.bad)
    judge, records = live_judge(opts)
    clock = timing.Stopwatch()
    found = search(commits, judge)
    minutes = clock.elapsed() / 60
    summary = f"{len(found.verdicts)} of {len(commits)} commits measured, {minutes:.1f} min"
    skipped = found.skipped
    if skipped:
        summary += "; skipped (could not decide): " + ", ".join(c[:10] for c in skipped)
    if found.verdicts.get(commits[-1]) is not True:
        state = "could not be measured" if found.verdicts.get(commits[-1]) is None else "is not confirmed slower"
        print(f"{opts.bad} {state} than {opts.good}: nothing to bisect ({summary})")
        code = UNDECIDED if found.verdicts.get(commits[-1]) is None else NOTHING
    elif found.first_bad is not None:
        subject = vcs.output(store.REPO, "log", "-1", "--format=%s", found.first_bad)
        print(f"first slower commit: {found.first_bad} {subject!r} ({summary})")
        code = FOUND
    else:
        print(f"the first slower commit is one of {', '.join(c[:10] for c in found.candidates)}: the ones before "
              f"the last could not be measured ({summary})")
        code = UNDECIDED
    if opts.out:
        doc = {"good": opts.good, "bad": opts.bad, "cases": [c.name for c in opts.cases], "commits": commits,
               "first_bad": found.first_bad, "candidates": found.candidates, "skipped": skipped,
               "minutes": minutes, "compares": records, "pairs": opts.pairs, "rounds": opts.run.rounds,
               "threshold": opts.threshold, "alpha": opts.alpha}
        atomic_write(opts.out, json.dumps(doc, indent=1) + "\n")
    return code

