"""The exact work counters beside the regression report: the work that changed at a step, and every
rise in work on a line of commits.

A work counter (``StageWork``: FLOPs, aten operators dispatched and bytes written by them, per stage
of one call; :mod:`mrcnn_bench.running.work_counters`) counts the same on every run and host, so
each change from one commit to the next is a step, with no p-value
(:func:`mrcnn_bench.changes.changepoints.find` with ``exact``). The report shows, in each regression
block, the work of the same case that changed within :data:`WINDOW` commits of it, and lists every
rise in work on each line and machine: more work is a regression of its own, one that the timed
ratios may be too noisy to show. What the counters cannot see is how long the work takes: threads,
memory bandwidth and caches (a change in how RoIAlign splits over two cores moves the ratios and
none of the counters).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.text import cell
from mrcnn_bench.changes import asv_files, changepoints, history_series
from mrcnn_bench.changes.changepoints import ChangePoint
from mrcnn_bench.changes.confirm_command import case_of

WINDOW = 1  # a work step counts for a block when it is this many commits or fewer from the block's step
EXACT_NOTE = "exact counters: any change between consecutive commits is a step, no p-value"


def steps(results: Path, machine: str, commits: list[str],
          read: asv_files.MachineResults | None = None) -> list[ChangePoint]:
    """Every step of ``machine``'s work counters over ``commits`` (oldest first); none when the machine
    measured no counters there (results from before the counters existed). ``read``: as
    :func:`history_series.read_asv` takes it."""
    try:
        series, _, _ = history_series.read_asv(results, machine, commits, history_series.WORK, read)
    except UsageError:
        return []
    return changepoints.find(series, history_series.exact_metrics(series))


def near(point: ChangePoint, work: Sequence[ChangePoint], position: dict[str, int]) -> list[ChangePoint]:
    """The steps of ``work`` of ``point``'s case within :data:`WINDOW` commits of it (``position``:
    commit -> its place on the line), in either direction."""
    at, case = position.get(point.commit), case_of(point.metric)
    return [w for w in work if at is not None and w.commit in position and case_of(w.metric) == case
            and abs(position[w.commit] - at) <= WINDOW]


def describe(step: ChangePoint) -> str:
    """``track_flops(static/eager, mask_head) +1.00% at 1a2b3c4d`` (``from 0`` when it was 0 before)."""
    change = "from 0" if step.change_pct is None else f"{step.change_pct:+.2f}%"
    return f"{step.metric.removeprefix('StageWork.')} {change} at {step.commit}"


def rises(work: Sequence[ChangePoint]) -> list[ChangePoint]:
    """The steps in which work grew: lower is better for every counter."""
    return [w for w in work if w.direction == "regression"]


def markdown(sections: Sequence[tuple[str, str, Sequence[ChangePoint]]]) -> str:
    """A section listing the rises in work of each (line, machine, steps); "" when there is none."""
    rows = [f"| {cell(line)} | {cell(machine)} | {cell(w.metric)} | {cell(w.commit)} | {w.before:.6g} | "
            f"{w.after:.6g} | {'-' if w.change_pct is None else f'{w.change_pct:+.2f}%'} |"
            for line, machine, work in sections for w in rises(work)]
    if not rows:
        return ""
    return ("\n## More work at a commit (" + EXACT_NOTE + ")\n\n"
            "| line | machine | counter | commit | before | after | change |\n|---|---|---|---|---|---|---|\n"
            + "\n".join(rows) + "\n")


def page_part(work: Sequence[ChangePoint]) -> str:
    """The dashboard page's list of one line and machine's rises in work."""
    grown = rises(work)
    if not grown:
        return ""
    items = "".join(f"<li class=\"regression\">{html.escape(describe(w))} ({w.before:.6g} to {w.after:.6g})</li>"
                    for w in grown)
    return f"<h3>More work at a commit ({html.escape(EXACT_NOTE)})</h3><ul>{items}</ul>"
