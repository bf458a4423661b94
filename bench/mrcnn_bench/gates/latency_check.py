"""``mrcnn-bench latency-check``: is this change slower than the commit it starts from? Sized for CI.

B is the working tree; A, the base, is ``--against``, by default the commit the change starts from
(:func:`base_commit`): the merge base with the main line when HEAD is off it (a pull request's
branch), else HEAD's parent (a commit on main). Only ``mrcnn/`` can differ between the two sides:
each side's worker imports its own checkout's ``mrcnn``, while the harness and the installed
packages are this tree's for both. So a diff outside ``mrcnn/`` cannot change B / A: nothing is
measured, and the summary says why (exit 0). A diff inside it selects the cases it can affect
(:func:`cases_for`): static/eager always, the training step too for the modules only training runs;
the summary names the training step but does not measure it unless ``--cases`` does (:data:`OVER_BUDGET`).

The verdict is ``compare``'s in process pairs (:func:`mrcnn_bench.gates.ab.pairs_table`: the pair
the unit, Holm over the cases), with fewer pairs and rounds than compare's defaults so that the
check fits CI's five minutes (:data:`~mrcnn_bench.base.defaults.CHECK_PAIRS` x
:data:`~mrcnn_bench.base.defaults.CHECK_ROUNDS`); the power that buys, under the noise model the
defaults were sized on, is printed with it. Exit 1: a case confirmed slower than the threshold;
2: a case could not be measured, or there is no base to measure against; 0 otherwise. A markdown
summary a reviewer can paste goes to stdout and ``OUT/summary.md``, the table and every pair's
timings to ``OUT/check.json``; nothing is written elsewhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from mrcnn_bench.base import defaults, timing, vcs
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.base.text import finite_or_none
from mrcnn_bench.gates import ab, stats
from mrcnn_bench.running.cases import Case, default_time_limit, default_workload, parse_cases
from mrcnn_bench.running.runner import RunOptions
from mrcnn_bench.running.store import REPO, cpu_model

PRESET = "tiny"
MAIN_LINES = ("origin/main", "main")  # where a change's branch starts from, the first that exists
LIBRARY = "mrcnn/"  # the only code that differs between the two sides
INFERENCE_CASE = "static/eager"
TRAINING_CASE = "static/train"
# Modules only a training step runs (the losses and the matching of proposals to ground truth): a
# change there cannot show in an inference call.
TRAINING_ONLY = ("mrcnn/losses.py", "mrcnn/matching.py")
# Selected by the diff but not measured unless named with --cases: a training step's pairs take
# minutes each, beyond CI's five (results/latency_check/README.md).
OVER_BUDGET = (TRAINING_CASE,)
POWER_AT = (0.05, 0.10)  # slowdowns whose chance of being flagged the summary states
PASSED, SLOWER, UNDECIDED = 0, 1, 2


@dataclass
class CheckOptions:
    """What ``latency-check`` measures; ``cases`` None: the ones the diff can affect."""

    against: str | None = None  # the base's ref; None: base_commit()
    cases: list[Case] | None = None
    pairs: int = defaults.CHECK_PAIRS
    rounds: int = defaults.CHECK_ROUNDS
    threshold: float = defaults.PAIR_THRESHOLD
    alpha: float = defaults.ALPHA
    slowdown: float = 0.0  # extra inference work of the working tree's side, to show the check catches it
    out: str = defaults.CHECK_OUT
    progress: bool = True

    def __post_init__(self) -> None:
        if self.pairs < stats.MIN_PAIRS + 1:  # both start orders twice: the order is a covariate
            raise UsageError(f"--pairs {self.pairs}: the check needs {stats.MIN_PAIRS + 1} or more")
        if self.rounds < 2 or self.rounds % 2:
            raise UsageError(f"--rounds {self.rounds}: must be even and 2 or more (each side first in half)")
        if self.slowdown and self.cases is None:
            raise UsageError("--inject-slowdown tests the check itself: name the cases it slows with --cases")
        if Path(self.out).exists() and not Path(self.out).is_dir():
            raise UsageError(f"--out {self.out}: exists and is not a folder")


@dataclass
class Base:
    """The commit B is measured against, and why it is that one."""

    commit: str
    why: str


@dataclass
class Selection:
    """The diff from the base to the working tree, and the cases it selects (case -> the files that select it)."""

    files: list[str]
    cases: dict[str, list[str]] = field(default_factory=dict)


def base_commit(repo: Path = REPO) -> Base:
    """The merge base with the main line when HEAD is off it, else HEAD's parent; UsageError when
    HEAD has no parent here (a root commit, or a shallow clone)."""
    head = vcs.commit_of(repo, "HEAD")
    if head is None:
        raise UsageError(f"{repo}: no commit at HEAD to take a base from; give --against REF")
    for line in MAIN_LINES:
        if vcs.commit_of(repo, line) is None:
            continue
        fork = vcs.output(repo, "merge-base", "--end-of-options", "HEAD", line)
        if fork and fork != head:
            return Base(fork, f"where HEAD's branch leaves {line}")
        break
    parent = vcs.commit_of(repo, "HEAD~1")
    if parent is None:
        raise UsageError("HEAD has no parent here (a root commit, or a shallow clone: `git fetch --deepen 1`); "
                         "give --against REF")
    return Base(parent, "HEAD's parent: HEAD is on the main line")


def resolve_base(against: str | None) -> Base:
    """``--against``'s commit, or :func:`base_commit`'s; UsageError when the ref names no commit."""
    if against is None:
        return base_commit()
    commit = vcs.commit_of(REPO, against)
    if commit is None:
        raise UsageError(f"--against {against!r} names no commit of {REPO}")
    return Base(commit, f"--against {against}")


def changed_files(base: str, repo: Path = REPO) -> list[str]:
    """Paths that differ between ``base`` and the working tree (staged, unstaged and untracked;
    a rename as its two paths)."""
    diff = vcs.run(repo, "diff", "--name-only", "--no-renames", "--end-of-options", vcs.check_ref(base), "--")
    untracked = vcs.run(repo, "ls-files", "--others", "--exclude-standard")
    names = (diff.stdout + untracked.stdout).decode(errors="replace").splitlines()
    return sorted({n for n in names if n})


def cases_for(files: list[str]) -> Selection:
    """The cases each changed file can affect: static/eager for every file under ``mrcnn/``, the
    training case too for :data:`TRAINING_ONLY`; none for the rest (the same on both sides)."""
    selection = Selection(files)
    for name in files:
        if not name.startswith(LIBRARY):
            continue
        selection.cases.setdefault(INFERENCE_CASE, []).append(name)
        if name.startswith(TRAINING_ONLY):
            selection.cases.setdefault(TRAINING_CASE, []).append(name)
    return selection


def run_options(rounds: int, progress: bool = True) -> RunOptions:
    """A latency check's run (this one's, and the gate's ``--latency-against``): the tiny preset's
    fixed size; no kernel-rate probe or FLOP count (they decide nothing)."""
    return RunOptions(workload=default_workload(PRESET), rows=[], rounds=rounds,
                      time_limit=default_time_limit(PRESET), peak_reps=0, flops=False, progress=progress)


def subject(commit: str) -> str:
    return vcs.output(REPO, "log", "-1", "--format=%h %s", "--end-of-options", commit) or commit[:10]


def design_text(opts: CheckOptions) -> str:
    """How the verdict was reached, and what it can see."""
    def power(slowdown: float) -> float:
        return stats.pair_power(defaults.PROCESS_SD, defaults.ROUND_SD, opts.pairs, opts.rounds, slowdown,
                                opts.threshold, opts.alpha)

    powers = ", ".join(f"{s:.0%} with {power(s):.2f}" for s in POWER_AT)
    return (f"{opts.pairs} pairs of fresh processes x {opts.rounds} interleaved rounds, the pair the unit "
            f"({defaults.PAIR_TEST}, threshold {opts.threshold:.0%}, alpha {opts.alpha:g}, Holm over the cases). "
            f"Power to flag a slowdown of {powers}, under the noise model compare's defaults were sized on "
            f"(between-process sd {defaults.PROCESS_SD}, round sd {defaults.ROUND_SD}: "
            "results/compare_pairs/design.md); this run's own noise is in its verdicts.")


def summary(base: Base, selection: Selection, table: pd.DataFrame | None, opts: CheckOptions, cases: list[Case],
            seconds: float, code: int) -> str:
    """The markdown a reviewer pastes: verdict, the two sides, the table, why these cases, how."""
    head = subject("HEAD")
    dirty = bool(vcs.output(REPO, "status", "--porcelain"))
    word = {PASSED: "not slower", SLOWER: "SLOWER", UNDECIDED: "could not measure"}[code]
    if table is None:
        word = "nothing to measure"
    lines = [f"## Latency check: {word}", "",
             f"B, the working tree at {head}{' with uncommitted changes' if dirty else ''}, against A, "
             f"{subject(base.commit)} ({base.why}).", ""]
    if opts.slowdown:
        lines += [f"B carries an injected slowdown of {opts.slowdown:.0%} of its inference work "
                  "(`--inject-slowdown`): this run tests the check, not a change.", ""]
    if table is None:
        lines += [f"The diff changes no file under `{LIBRARY}`, the only code that differs between the two sides "
                  "(the harness and the installed packages are the working tree's for both), so no case can "
                  f"read differently: nothing was measured. {len(selection.files)} file(s) changed.", ""]
    elif table.empty:
        lines += [f"No case ran on both sides ({', '.join(c.name for c in cases)}): nothing could be compared.", ""]
    else:
        shown = table.assign(
            ratio=table["ratio_b_over_a"].map(lambda r: "" if pd.isna(r) else f"{r:.3f}"),
            p=table["p_value"].map(lambda p: "" if pd.isna(p) else f"{p:.2g}"))
        lines += ["| case | B / A | 95% interval | p (Holm) | verdict |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {r['case']} | {r['ratio']} | {r['ci95']} | {r['p']} | {r['verdict']} |"
                  for _, r in shown.iterrows()]
        lines.append("")
        if opts.cases is None:
            for case, files in selection.cases.items():
                more = f" and {len(files) - 5} more" if len(files) > 5 else ""
                skipped = (f" (not measured: beyond CI's five minutes; `mrcnn-bench latency-check --cases {case}`)"
                           if case in OVER_BUDGET else "")
                lines.append(f"- {case}, for {', '.join(f'`{f}`' for f in files[:5])}{more}{skipped}")
        else:
            lines.append(f"- cases named with --cases: {', '.join(c.name for c in opts.cases)}")
        lines += ["", design_text(opts), ""]
    lines += [f"{seconds / 60:.1f} min on {(cpu_model() or 'this CPU')}. Reproduce: "
              f"`mrcnn-bench latency-check --against {base.commit[:12]}"
              + (f" --cases {','.join(c.name for c in opts.cases)}" if opts.cases else "")
              + (f" --inject-slowdown {opts.slowdown:g}" if opts.slowdown else "") + "`"]
    return "\n".join(lines) + "\n"


def verdict_code(table: pd.DataFrame, cases: list[Case]) -> int:
    """1 when a case is flagged; else 2 when a case has no test (it failed, or ran on one side only); else 0."""
    if table.empty:  # no case ran on both sides (every one skipped here)
        return UNDECIDED
    if table["regression"].any():
        return SLOWER
    tested = set(table.loc[table["p_value"].notna(), "case"])
    return UNDECIDED if any(c.name not in tested for c in cases) else PASSED


def check(opts: CheckOptions) -> int:
    """Measure, print the summary, write ``OUT/summary.md`` and ``OUT/check.json``; the exit code."""
    base = resolve_base(opts.against)
    selection = cases_for(changed_files(base.commit))
    chosen = [name for name in selection.cases if name not in OVER_BUDGET]
    cases = opts.cases if opts.cases is not None else parse_cases(",".join(chosen)) if chosen else []
    clock = timing.Stopwatch()
    table: pd.DataFrame | None = None
    pairs: list[Any] = []
    code = PASSED
    if cases:
        compare = ab.CompareOptions(base.commit, str(REPO), cases=cases, run=run_options(opts.rounds, opts.progress),
                                    slowdown_b=opts.slowdown, pairs=opts.pairs, threshold=opts.threshold,
                                    alpha=opts.alpha)
        pairs = ab.run_live(compare)
        table = ab.live_table(pairs, opts.threshold, opts.alpha)
        code = verdict_code(table, cases)
    text = summary(base, selection, table, opts, cases, clock.elapsed(), code)
    print(text, end="")
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "summary.md", text)
    doc = {"base": base.commit, "why": base.why, "head": vcs.commit_of(REPO, "HEAD"), "files": selection.files,
           "selected": selection.cases, "cases": [c.name for c in cases], "pairs": opts.pairs,
           "rounds": opts.rounds, "threshold": opts.threshold, "alpha": opts.alpha, "slowdown": opts.slowdown,
           "seconds": clock.elapsed(), "exit": code, "cpu": (cpu_model() or 'this CPU'),
           "comparison": [] if table is None else json.loads(table.to_json(orient="records")),
           "timings": ab.pair_timings(pairs)}
    atomic_write(out / "check.json", json.dumps(finite_or_none(doc), indent=1, default=str) + "\n")
    return code

