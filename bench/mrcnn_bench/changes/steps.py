"""``mrcnn-bench steps``: the change points of the history across commits, and which are regressions.

    mrcnn-bench steps [--machine NAME] [--results results/asv] [--revs main] [--stages | --work] [--json]
    mrcnn-bench steps --series FILE.csv [--json]

Reads the held figures of one asv machine over one line of commits (default: main's line, on the
one machine that has results for :data:`mrcnn_bench.changes.history_series.MIN_MAIN_COMMITS` or more of its
commits) or, with ``--series``, plain series from a CSV file (``commit``, ``value``, optionally
``metric``: :func:`mrcnn_bench.changes.history_series.read_csv`), and finds each metric's change points
with the method of :mod:`mrcnn_bench.changes.changepoints`. Lower is better in every series. ``--stages``
reads the stage ratios instead (``Stages.track_ratio``: each stage of a case over the ruler's same
stage): where in the model a level moved, including steps too small to move the whole call.
``--work`` reads the work counters instead (``StageWork.track_flops``, ``track_ops``, ``track_bytes``:
FLOPs, aten operators and bytes written per stage of each inference case), which are exact: any
change between consecutive commits is a change point, found with no test and given no p-value
(``exact`` in the table, ``null`` in the JSON). A change point whose machine has no value for some
commits that change the library before it (not measured there, or failed) gets a line under the
table: the step lies anywhere after the last commit with a value.

Prints a table; with ``--json`` only a JSON list on stdout (the table goes to stderr), one object
per change point with the keys ``metric``, ``commit``, ``index``, ``before``, ``after``,
``change_pct``, ``p_value`` (``null`` for an exact series), ``direction``, sorted by each metric's
first appearance, then by index (``[]`` when there is none). ``change_pct`` is ``100 (after -
before) / before``, ``null`` when ``before`` is 0 (a count that was 0); ``direction`` is
``"regression"`` exactly when it is above 0 (or, when it is null, when ``after`` is above
``before``), else ``"improvement"``. Exit 2 when the input is unreadable or a metric has too few
points (:data:`mrcnn_bench.changes.changepoints.MIN_POINTS`), else 1 when a regression was found,
else 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.text import cell, strict_json
from mrcnn_bench.changes import asv_results_table, changepoints, history_series
from mrcnn_bench.changes.changepoints import ChangePoint

DEFAULT_RESULTS = "results/asv"
DEFAULT_REVS = "main"
COLUMNS = ("metric", "commit", "index", "before", "after", "change_pct", "p_value", "direction")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--series", type=Path, default=None, metavar="FILE.csv",
                        help="plain series instead of asv's results: a CSV with a header naming commit, value and "
                             "optionally metric; each metric's rows in file order, oldest first")
    parser.add_argument("--machine", default=None,
                        help="asv machine (default: the one with results for "
                             f"{history_series.MIN_MAIN_COMMITS} or more commits of --revs)")
    parser.add_argument("--results", type=Path, default=Path(DEFAULT_RESULTS),
                        help="asv's results_dir (default: %(default)s)")
    parser.add_argument("--revs", default=DEFAULT_REVS,
                        help="the line of commits, as `git rev-list` takes it (default: %(default)s)")
    parser.add_argument("--repo", type=Path, default=Path("."), help="the git repository (default: %(default)s)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--stages", action="store_true",
                       help="the stage ratios (Stages.track_ratio) instead of the held figures; not with --series")
    which.add_argument("--work", action="store_true",
                       help="the exact work counters per stage (StageWork: FLOPs, operators, bytes written) instead "
                            "of the held figures: every change is a step; not with --series")
    parser.add_argument("--json", action="store_true",
                        help="print only the change points as a JSON list on stdout; the table goes to stderr")


def read(args: argparse.Namespace) -> tuple[history_series.Series, str]:
    """The series the arguments name, and a line saying where they come from (and which result files
    were left out, and why)."""
    if args.series is not None:
        if args.stages or args.work:
            flag = "--stages" if args.stages else "--work"
            raise UsageError(f"{flag} reads asv's results; a --series file holds its own metrics")
        series = history_series.read_csv(args.series)
        return series, f"{args.series}: {len(series)} metric(s)"
    line = asv_results_table.line_of_commits(args.repo, args.revs)
    machine = args.machine or history_series.default_machine(args.results, line, args.revs)
    which = history_series.STAGES if args.stages else history_series.WORK if args.work else history_series.HELD
    series, short, left_out = history_series.read_asv(args.results, machine, line, which)
    if not series:
        raise UsageError(f"machine {machine!r}: no metric has {changepoints.MIN_POINTS} or more commits of "
                         f"{args.revs} (the change-point method needs that many)")
    where = f"{machine}, {max(len(c) for c, _ in series.values())} commits of {args.revs}, {len(series)} metrics"
    if short:
        where += f" ({len(short)} left out with fewer than {changepoints.MIN_POINTS} commits: {', '.join(short)})"
    if left_out:
        where += (f"; {len(left_out)} result file(s) left out, their commits missing: "
                  + "; ".join(s.text() for s in left_out))
    return series, where


def table(points: list[ChangePoint], where: str, exact: bool = False) -> str:
    """The change points as a markdown table under a line naming the input and the method (and
    saying so when some series are exact)."""
    settings = ", ".join(f"{k} {v:g}" for k, v in changepoints.SETTINGS.items())
    head = f"change points of {cell(where)} (Apache Otava, {settings})"
    if exact:
        head += "; exact series (work counters): any change between consecutive commits is a step, no p-value"
    if not points:
        return f"{head}: none"
    rows = [f"| {' | '.join(COLUMNS)} |", "|" + "---|" * len(COLUMNS)]
    for p in points:
        change = "-" if p.change_pct is None else f"{p.change_pct:+.2f}%"
        p_value = "exact" if p.p_value is None else f"{p.p_value:.2g}"
        rows.append(f"| {cell(p.metric)} | {cell(p.commit)} | {p.index} | {p.before:.6g} | {p.after:.6g} | {change} | "
                    f"{p_value} | {p.direction} |")
    return "\n".join([head, "", *rows])


def skipped(points: list[ChangePoint], series: history_series.Series, repo: Path) -> list[str]:
    """A line for each change point whose machine has no value for some commits that change the library
    before it (not measured there, or their run failed): the step lies somewhere after the last commit
    with a value, not necessarily at the one named."""
    found = history_series.gaps(repo, series, points)
    out = []
    for p in points:
        if (p.metric, p.index) in found:
            previous, n = found[(p.metric, p.index)]
            out.append(f"- {cell(p.metric)} at {cell(p.commit)}: {n} commit(s) that change the library since "
                       f"{cell(previous)} have no value on this machine (not measured, or failed); the step lies in "
                       f"{cell(previous)}..{cell(p.commit)}")
    return out


def run(args: argparse.Namespace) -> int:
    series, where = read(args)
    exact = history_series.exact_metrics(series)
    points = changepoints.find(series, exact)
    text = table(points, where, exact=bool(exact))
    notes = [] if args.series is not None else skipped(points, series, args.repo)
    if notes:
        text += "\n\nafter commits with no value on this machine:\n" + "\n".join(notes)
    if args.json:
        print(text, file=sys.stderr)
        print(strict_json([p.to_dict() for p in points], indent=1))
    else:
        print(text)
    return 1 if any(p.direction == "regression" for p in points) else 0
