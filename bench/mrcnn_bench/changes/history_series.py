"""Per-commit series for the change-point check, from asv's results or from a CSV file.

A series is ``(commits, values)``, oldest first, one value per commit; a mapping of them is keyed by
metric name in the order the metrics first appear. Both readers take outside input and check it at
the edge: what they cannot use is one ValueError naming the file and the place (exit 2).

- :func:`read_csv`: a header naming the columns ``commit`` and ``value`` (and optionally
  ``metric``; without it every row is metric ``"value"``), in any order, other columns ignored;
  each metric's rows in file order are its series; ``commit`` is kept verbatim and may not repeat
  within a metric; ``value`` is a finite number.
- :func:`read_asv`: the held figures (ratios to the ruler, compile counts, ``1 - AP``) of one
  asv machine's results over the commits of one line of history (``git rev-list --reverse REVS``),
  or the stage ratios (:data:`STAGES`), or the work counters (:data:`WORK`).

The work counters are exact (:data:`EXACT`): :func:`exact_metrics` names their series, which the
change-point check takes step by step rather than testing (:func:`mrcnn_bench.changes.changepoints.find`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from pathlib import Path

from mrcnn_bench.base import vcs
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.changes import asv_files
from mrcnn_bench.changes.asv_results_table import suite_versions
from mrcnn_bench.changes.asv_results_table import values as result_values
from mrcnn_bench.changes.changepoints import MIN_POINTS

Series = dict[str, tuple[list[str], list[float]]]
DEFAULT_METRIC = "value"
# The figures the history is judged on: what the dashboard's flags and the report cover.
STAGES = ("Stages.track_ratio",)  # context for a held step: where it happened
# Exact work per stage (mrcnn_bench.running.work_counters): where the work moved, with no noise.
WORK = ("StageWork.track_flops", "StageWork.track_ops", "StageWork.track_bytes")
# Benchmarks whose every change is a step: counts of the same call, identical on every run.
EXACT = WORK
HELD = ("Latency.track_ratio", "Training.track_ratio", "Compiles.track_count", "Accuracy.track_box_error",
        "Accuracy.track_mask_error")  # fmt: skip
MIN_MAIN_COMMITS = 15  # a machine chosen by default holds at least this many of the line's commits
# The paths whose commits the history measures (the Makefile's asv-history lists the same): a commit
# that changes none of them runs the same library as its parent.
MEASURED_PATHS = ("mrcnn", "pyproject.toml")


def read_csv(path: Path) -> Series:
    """The series of a CSV file (see the module docstring)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # a BOM, as spreadsheets write
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise UsageError(f"{path}: cannot read it as CSV ({type(e).__name__}: {e})") from None
    if not rows:
        raise UsageError(f"{path}: empty; expected a header with the columns commit and value")
    header = rows[0]
    missing = [c for c in ("commit", "value") if c not in header]
    if missing:
        raise UsageError(f"{path}: the header {header} has no column {' or '.join(missing)} "
                         "(expected commit, value and optionally metric)")
    twice = sorted({c for c in ("commit", "value", "metric") if header.count(c) > 1})
    if twice:
        raise UsageError(f"{path}: the header names {', '.join(twice)} more than once; which column holds the "
                         "series would be a guess")
    col = {name: header.index(name) for name in ("commit", "value", "metric") if name in header}
    series: Series = {}
    seen: dict[tuple[str, str], int] = {}  # (metric, commit) -> position: a repeat found in O(1)
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue  # a blank line
        if len(row) != len(header):
            raise UsageError(f"{path}, line {line}: {len(row)} fields, the header has {len(header)}")
        commit, text = row[col["commit"]], row[col["value"]]
        metric = row[col["metric"]] if "metric" in col else DEFAULT_METRIC
        if not commit:
            raise UsageError(f"{path}, line {line}: empty commit")
        if not metric:
            raise UsageError(f"{path}, line {line}: empty metric")
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise UsageError(f"{path}, line {line}: value {text!r} is not a finite number")
        commits, values = series.setdefault(metric, ([], []))
        first = seen.setdefault((metric, commit), len(commits))
        if first != len(commits):
            raise UsageError(f"{path}, line {line}: commit {commit!r} repeats in metric {metric!r} "
                             f"(first at position {first})")
        commits.append(commit)
        values.append(value)
    if not series:
        raise UsageError(f"{path}: a header and no rows")
    return series


def machines(results: Path, line: Iterable[str]) -> dict[str, int]:
    """asv machine name -> how many of ``line``'s commits it has results for."""
    wanted = set(line)
    found = {}
    for folder in sorted(p for p in results.iterdir() if (p / "machine.json").exists()):
        found[folder.name] = len({r.commit_hash for r in asv_files.read(results, folder.name).results} & wanted)
    return found


def default_machine(results: Path, line: list[str], revs: str) -> str:
    """The one machine with at least :data:`MIN_MAIN_COMMITS` of ``line``'s commits; ValueError
    listing every machine and its count otherwise."""
    counts = machines(results, line)
    chosen = [m for m, n in counts.items() if n >= MIN_MAIN_COMMITS]
    if len(chosen) == 1:
        return chosen[0]
    listed = ", ".join(f"{m} ({n})" for m, n in counts.items()) or "none"
    why = "several machines have" if chosen else "no machine has"
    raise UsageError(f"{why} results for {MIN_MAIN_COMMITS} or more commits of {revs} under {results}; "
                     f"choose one with --machine: {listed}")


def _metric(key: str, params: tuple[str, ...]) -> str:
    name = key.removeprefix("benchmarks.")
    return f"{name}({', '.join(params)})" if params else name


def read_asv(
    results: Path, machine: str, line: list[str], benchmarks: tuple[str, ...] = HELD,
    read: asv_files.MachineResults | None = None,
) -> tuple[Series, list[str], list[asv_files.Skipped]]:
    """The figures of ``benchmarks`` (default: the held ones) of ``machine`` over ``line``'s commits
    (oldest first, 8-character hashes), of the suite's current version only (an older version is
    another series: :func:`mrcnn_bench.changes.asv_results_table.suite_versions`).

    A commit without a figure (not measured, or not measurable there: NaN) is left out of that
    metric's series. Returns the series with at least :data:`MIN_POINTS` points, the names of the
    metrics left out for having fewer, and the result files of the line's commits that could not be
    used (:mod:`asv_files`); ``read``: the machine's files when the caller read them already (one read
    for several sets of benchmarks). UsageError when the machine has no results on the line.
    """
    if not (results / machine / "machine.json").exists():
        raise UsageError(f"no asv machine {machine!r} under {results}")
    versions = suite_versions(results)
    read = read or asv_files.read(results, machine)
    by_commit = {r.commit_hash: r for r in read.results}
    on_line = {c[:8] for c in line}
    skipped = [s for s in read.skipped if s.commit[:8] in on_line or not s.commit]
    series: Series = {}
    for commit in line:
        result = by_commit.get(commit)
        if result is None:
            continue
        for key in sorted(result.get_all_result_keys()):
            if key.removeprefix("benchmarks.") not in benchmarks:
                continue
            for params, value in result_values(result, key, versions).items():
                if value is None or not math.isfinite(value):
                    continue
                commits, values = series.setdefault(_metric(key, params), ([], []))
                commits.append(commit[:8])
                values.append(float(value))
    if not series:
        why = "".join(f"; left out: {s.text()}" for s in skipped[:3])
        raise UsageError(f"machine {machine!r} has no results for these commits under {results}{why}")
    short = [m for m, (c, _) in series.items() if len(c) < MIN_POINTS]
    return {m: s for m, s in series.items() if m not in short}, short, skipped


def exact_metrics(series: Series) -> frozenset[str]:
    """The metrics of ``series`` that are exact: of a benchmark in :data:`EXACT`."""
    return frozenset(m for m in series if m.partition("(")[0] in EXACT)


def unmeasured_between(repo: Path, older: str, newer: str) -> int:
    """How many commits after ``older`` and before ``newer`` change :data:`MEASURED_PATHS`: where a
    machine skipped some, a step it finds at ``newer`` may have come from any of them. 0 when git
    does not know the commits."""
    try:
        hashes = vcs.rev_list(repo, f"{older}..{newer}", MEASURED_PATHS)
    except vcs.GitError:
        return 0
    return sum(1 for h in hashes if not h.startswith(newer))


def skipped_before(repo: Path, series: Series, point_metric: str, index: int) -> tuple[str, int]:
    """(the commit with a value before point ``index`` of ``point_metric``'s series, how many commits
    that change the library lie between them with none: not measured, or failed); ("", 0) for the
    first point, which has none."""
    if index < 1:  # a change point never starts a series; [index - 1] would wrap to its end
        return "", 0
    previous = series[point_metric][0][index - 1]
    return previous, unmeasured_between(repo, previous, series[point_metric][0][index])


def gaps(repo: Path, series: Series, points: Iterable) -> dict[tuple[str, int], tuple[str, int]]:
    """(metric, index) -> :func:`skipped_before` for each change point of ``series`` (anything with
    ``metric`` and ``index``) that has commits without a value before it; the others are left out."""
    found = {(p.metric, p.index): skipped_before(repo, series, p.metric, p.index) for p in points}
    return {key: gap for key, gap in found.items() if gap[1]}
