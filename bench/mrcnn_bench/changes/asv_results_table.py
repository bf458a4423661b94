"""The held metrics of every commit one asv machine has results for, oldest first, as one table.

    mrcnn-bench asv table MACHINE [--revs REVS] [--steps] [--results results/asv] [--repo .]
        [--out FILE.md]

Reads asv's result files through asv's own loader and prints, per commit (ordered by commit date):
the ratio of each inference case and of the training step to the ruler, the compile counts (XLA
compiles and fallbacks; inductor graphs, breaks, recompiles) and ``1 - AP`` for box and mask. These
are the figures the history is judged on (:data:`mrcnn_bench.changes.asv_regressions.HELD`); the dashboard
draws the rest. The commit's subject comes from git when the repository has the commit. ``--steps`` adds the levels
asv's own step detection finds in each ratio, in both directions: the regressions page lists only
increases, so an improvement shows here and nowhere else. ``--revs`` keeps the commits ``git rev-list
REVS`` names (``main``; ``asv-scratch~7..asv-scratch``): one machine may hold main's history and the
scratch range, whose commits interleave by date, and steps are only meaningful along one line of
commits. Exit 2 when the machine has no results there, or git cannot read REVS.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
from asv.step_detect import detect_steps

from mrcnn_bench.base import vcs
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.text import cell
from mrcnn_bench.changes import asv_files

RATIOS = ("benchmarks.Latency.track_ratio", "benchmarks.Training.track_ratio")
COUNTS = "benchmarks.Compiles.track_count"
ERRORS = {"1 - box AP": "benchmarks.Accuracy.track_box_error", "1 - mask AP": "benchmarks.Accuracy.track_mask_error"}


def suite_versions(results: Path) -> dict[str, str] | None:
    """Each benchmark's version in the suite asv last discovered (``RESULTS/benchmarks.json``), or
    None when there is no such file. A result of another version belongs to another series: asv's
    dashboard leaves it out, and so do the readers here."""
    path = results / "benchmarks.json"
    if not path.is_file():
        return None
    try:
        suite = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: not asv's benchmarks.json ({e})") from None
    return {name: b["version"] for name, b in suite.items() if isinstance(b, dict) and "version" in b}


def values(result, key: str, versions: dict[str, str] | None = None) -> dict[tuple[str, ...], float]:
    """One benchmark's values by parameter combination (asv stores them flat, in product order);
    none when ``versions`` (:func:`suite_versions`) gives the benchmark another version than the
    result's."""
    if key not in result.get_all_result_keys():
        return {}
    if versions is not None and result.benchmark_version.get(key) != versions.get(key):
        return {}
    stored = result.get_result_params(key)
    names = [[p.strip("'") for p in axis] for axis in stored]
    return dict(zip(itertools.product(*names), result.get_result_value(key, stored), strict=True))


def _count(values: dict[tuple[str, ...], float], case: str, names: tuple[str, ...]) -> str:
    got = [values.get((case, n)) for n in names]
    return ", ".join("-" if v is None or v != v else f"{v:.0f}" for v in got)


def _subject(repo: Path, commit: str) -> str:
    return (vcs.output(repo, "log", "-1", "--format=%s", "--end-of-options", commit, "--") or "")[:60]


def line_of_commits(repo: Path, revs: str) -> list[str]:
    """Full hashes of ``git rev-list --reverse REVS`` in ``repo``: oldest first; ValueError naming
    git's first line of complaint when git cannot."""
    return vcs.rev_list(repo, revs, reverse=True)


def commits(repo: Path, revs: str) -> set[str]:
    """The full hashes ``git rev-list REVS`` lists in ``repo``; ValueError when git cannot read REVS."""
    return set(line_of_commits(repo, revs))


def table(results: Path, machine: str, repo: Path | None = None, only: set[str] | None = None) -> pd.DataFrame:
    """One row per commit (of ``only``, full hashes, when given), oldest first; columns as the module
    docstring lists them. ``attrs["skipped"]``: the result files left out (:mod:`asv_files`)."""
    rows, ratios = [], {}
    versions = suite_versions(results)
    read = asv_files.read(results, machine)
    for result in read.results:
        if only is not None and result.commit_hash not in only:
            continue
        row: dict[str, object] = {
            "commit": result.commit_hash[:8],
            "date": datetime.fromtimestamp(result.date / 1000, UTC).strftime("%Y-%m-%d %H:%M"),
        }
        if repo is not None:
            row["subject"] = _subject(repo, result.commit_hash)
        for key in RATIOS:
            cases = {case[0]: value for case, value in values(result, key, versions).items()}
            row.update(cases)
            ratios.update(dict.fromkeys(cases))
        counts = values(result, COUNTS, versions)
        row["compiles (xla; inductor)"] = (
            _count(counts, "static/xla", ("xla_compiles", "fallback_ops"))
            + "; "
            + _count(counts, "static/inductor", ("graphs", "graph_breaks", "recompiles"))
        )
        for name, key in ERRORS.items():
            row[name] = next(iter(values(result, key, versions).values()), float("nan"))
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame.attrs["ratios"] = list(ratios)  # which columns are ratios to the ruler, for levels()
    frame.attrs["skipped"] = read.skipped
    return frame


def printable(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every name and text cell escaped for a markdown table on a terminal: case names come
    from asv's result files and subjects from git, either of which may hold '|', newlines or escapes."""
    out = frame.rename(columns=cell)
    for column in out.columns:
        if out[column].dtype == object:
            out[column] = out[column].map(lambda v: cell(v) if isinstance(v, str) else v)
    return out


def levels(frame: pd.DataFrame) -> pd.DataFrame:
    """The levels ``asv.step_detect.detect_steps`` finds in each ratio column: one row per level."""
    rows = []
    for column in frame.attrs["ratios"]:
        values = frame[column].tolist()
        for left, right, value, _low, _err in detect_steps(values):
            rows.append(
                {
                    "ratio": column,
                    "from": frame["commit"][left],
                    "to": frame["commit"][right - 1],
                    "commits": right - left,
                    "level": value,
                }
            )
    return pd.DataFrame(rows)


def build_parser(prog: str = "mrcnn-bench asv table") -> argparse.ArgumentParser:
    """``mrcnn-bench asv table``'s arguments."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("machine", help="asv's machine name (a folder under --results)")
    parser.add_argument("--results", type=Path, default=Path("results/asv"),
                        help="asv's results_dir (default: %(default)s)")
    parser.add_argument("--repo", type=Path, default=Path("."),
                        help="the repository, for commit subjects (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here (markdown)")
    parser.add_argument("--revs", default=None, help="only the commits `git rev-list REVS` lists (default: all)")
    parser.add_argument("--steps", action="store_true", help="also the levels asv's step detection finds")
    return parser


def main(argv: list[str] | None = None, prog: str = "mrcnn-bench asv table") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        only = None if args.revs is None else commits(args.repo, args.revs)
        frame = table(args.results, args.machine, args.repo, only)
    except UsageError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    among = "" if args.revs is None else f" of {args.revs}"
    left_out = [f"- {cell(s.text())}" for s in frame.attrs.get("skipped", [])]
    for line in left_out:
        print(f"{prog}: result file left out: {line[2:]}", file=sys.stderr)
    if frame.empty:
        print(f"{prog}: no results for machine {args.machine!r} under {args.results}{among}", file=sys.stderr)
        return 2
    text = printable(frame).to_markdown(index=False, floatfmt=".4f")
    if args.steps:
        steps = printable(levels(frame)).to_markdown(index=False, floatfmt=".4f")
        text += f"\n\nLevels (asv.step_detect, oldest first):\n\n{steps}"
    if left_out:
        text += "\n\nResult files left out (their commits are missing above):\n\n" + "\n".join(left_out)
    print(text)
    if args.out:
        command = " ".join([prog, *(argv if argv is not None else sys.argv[1:])])
        args.out.write_text(f"# {args.machine}: {len(frame)} commits{among}\n\n`{command}`\n\n{text}\n")
    return 0

