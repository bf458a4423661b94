"""Mean of each ratio per level of an injected range: how big each designed step came out.

    PYTHONPATH=bench python bench/tools/range_levels.py MACHINE [--revs 'asv-steps~29^..asv-steps']
        [--results results/asv] [--repo .] [--out FILE.md]

A level is the run of commits after each ``[slowdown]`` commit of the range (the subjects that
``mrcnn-bench asv scratch`` writes); level 0 is before the first. For every held ratio
(``Latency``, ``Training``) and every stage ratio (``Stages``) of the machine, the table gives
each level's mean over its measured commits, the number of commits and their coefficient of
variation, and the change of the mean against the level before. Read with
``mrcnn-bench steps`` (held figures) and ``steps --stages``: this says how large each step was,
that says whether the method found it.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

from mrcnn_bench.base import vcs
from mrcnn_bench.changes import asv_results_table, history_series

MARK = "[slowdown]"  # the kind in a range commit's subject (mrcnn_bench.history.scratch_range.message)


def levels_of(repo: Path, line: list[str]) -> dict[str, int]:
    """8-character hash -> level: how many ``[slowdown]`` commits come at or before it."""
    # One git call for every subject, in the line's order (--no-walk=unsorted keeps it).
    subjects = vcs.run(repo, "log", "--no-walk=unsorted", "--format=%s", "--end-of-options", *line).stdout
    subjects = subjects.decode().splitlines()
    levels = itertools.accumulate(int(MARK in subject) for subject in subjects)
    return {commit[:8]: level for commit, level in zip(line, levels, strict=True)}


def table(series: history_series.Series, level: dict[str, int]) -> list[str]:
    rows = ["| ratio | level | commits | mean | CV | change against the level before |", "|---|---|---|---|---|---|"]
    for name, (commits, values) in series.items():
        before = None
        for lv in sorted({level[c] for c in commits}):
            mine = [v for c, v in zip(commits, values) if level[c] == lv]
            mean = statistics.mean(mine)
            cv = statistics.stdev(mine) / mean if len(mine) > 1 else float("nan")
            change = "" if before is None else f"{100 * (mean / before - 1):+.1f}%"
            rows.append(f"| {name} | {lv} | {len(mine)} | {mean:.4f} | {100 * cv:.1f}% | {change} |")
            before = mean
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("machine")
    parser.add_argument("--revs", default="asv-steps~29^..asv-steps")
    parser.add_argument("--results", type=Path, default=Path("results/asv"))
    parser.add_argument("--repo", type=Path, default=Path("."))
    parser.add_argument("--out", type=Path, default=None, help="write the table here (default: stdout)")
    args = parser.parse_args(argv)
    try:
        line = asv_results_table.line_of_commits(args.repo, args.revs)
        held, _, _ = history_series.read_asv(args.results, args.machine, line,
                                          ("Latency.track_ratio", "Training.track_ratio"))  # fmt: skip
        stages, _, _ = history_series.read_asv(args.results, args.machine, line, history_series.STAGES)
    except ValueError as e:  # vcs.GitError among them
        print(f"range_levels: error: {e}", file=sys.stderr)
        return 2
    level = levels_of(args.repo, line)
    text = "\n".join([f"# Levels of {args.revs} on {args.machine}", "",
                      *table({**held, **stages}, level)]) + "\n"  # fmt: skip
    if args.out:
        args.out.write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
