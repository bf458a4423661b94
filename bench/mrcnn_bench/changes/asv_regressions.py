"""Every regression asv flagged, by commit, and whether the scratch range's verdict holds.

    mrcnn-bench asv flags [--html results/html] [--out results/asv/regressions.md]

Reads what ``asv publish`` wrote (``regressions.json``, ``index.json``) and lists each flag: the
benchmark and its parameters, the branch, the commit where the step is, the values before and
after. Commits of the scratch range (``mrcnn-bench asv scratch``) are named by their kind. The verdict
covers the held metrics only (ratios to the ruler, compile counts, ``1 - AP``): on the scratch
branch, the commits of the range they flag must be exactly the three injected ones. Raw seconds,
time to first result, peak memory and FLOPs are listed but not held to it. A held flag on one of
main's commits is a real step in main's history, not a fault of the verdict: it is named on a line
of its own. asv draws a branch's line through every ancestor that has results, so such a flag may
carry the branch ``asv-scratch`` (main's commits before the range's base), and it is listed only
where the step lasts to the end of that line (``asv.step_detect.detect_regressions``). Exit 0 when
the verdict holds, 1 when it does not, 2 when there is nothing to read.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.history.scratch_range import expected

HELD = ("track_ratio", "track_count", "track_box_error", "track_mask_error")
SCRATCH_BRANCH = "asv-scratch"


def _scratch_commits(repo: Path) -> dict[str, str]:
    """Full hash -> kind, for the commits mrcnn-bench asv scratch builds (computed, not read from the branch)."""
    return {c["hash"]: c["kind"] for c in expected(repo)}


def flags(html: Path) -> list[dict[str, object]]:
    """One row per (benchmark, branch, step) that asv's regression detection reports; UsageError when
    ``html`` does not hold the index.json and regressions.json asv publish writes."""
    try:
        return _flags(html)
    except (ValueError, KeyError, TypeError) as e:  # asv's files, read as they are
        raise UsageError(f"{html}: not asv publish's index and regressions ({type(e).__name__}: {e})") from None


def _flags(html: Path) -> list[dict[str, object]]:
    index = json.loads((html / "index.json").read_text())
    to_hash = index["revision_to_hash"]
    rows = []
    for name, graph, params, _idx, _last, _best, steps in json.loads((html / "regressions.json").read_text())[
        "regressions"
    ]:
        for _before, after, value_before, value_after in steps:
            rows.append(
                {
                    "benchmark": name,
                    "branch": params.get("branch", ""),
                    # asv names a parameter only where graphs differ in it; the graph's path always has it.
                    "machine": params.get("machine") or next(iter(re.findall(r"machine-([^/]+)", graph)), ""),
                    "commit": to_hash[str(after)],
                    "before": value_before,
                    "after": value_after,
                }
            )
    return rows


def _held(row: dict[str, object]) -> bool:
    return any(h in str(row["benchmark"]) for h in HELD)


def verdict(rows: list[dict[str, object]], kinds: dict[str, str]) -> tuple[bool, list[str]]:
    """Whether the held flags on the range are exactly its injected commits; the lines that say so.

    The second line names the held flags on main's own commits (those not in ``kinds``), which the
    verdict leaves out but a reader must not miss.
    """
    injected = {h for h, k in kinds.items() if k != "noop"}
    # A commit of the range lies on the scratch branch only (asv leaves the branch out of a graph's
    # parameters when only one branch has results), so the commit alone places a flag.
    flagged = {str(r["commit"]) for r in rows if str(r["commit"]) in kinds and _held(r)}
    ok = flagged == injected
    lines = [
        f"Held metrics on {SCRATCH_BRANCH}: flagged {len(flagged & injected)} of the {len(injected)} injected "
        f"commits and {len(flagged - injected)} other commit(s) of the range: "
        + ("the verdict holds." if ok else "the verdict does NOT hold.")
    ]
    on_main = sorted({str(r["commit"])[:10] for r in rows if str(r["commit"]) not in kinds and _held(r)})
    lines.append(
        f"Held metrics on main's commits: {len(on_main)} commit(s) flagged"
        + (f" ({', '.join(on_main)}): real steps in main's history, see the rows marked main." if on_main else ".")
    )
    return ok, lines


def build_parser(prog: str = "mrcnn-bench asv flags") -> argparse.ArgumentParser:
    """``mrcnn-bench asv flags``'s arguments."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--html", type=Path, default=Path("results/html"),
                        help="asv's published folder (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here (markdown)")
    parser.add_argument("--repo", type=Path, default=Path("."),
                        help="the repository, for the scratch hashes (default: %(default)s)")
    return parser


def main(argv: list[str] | None = None, prog: str = "mrcnn-bench asv flags") -> int:
    args = build_parser(prog).parse_args(argv)
    if not (args.html / "regressions.json").is_file():
        print(f"{prog}: no regressions.json in {args.html}: run make asv-publish first", file=sys.stderr)
        return 2
    kinds = _scratch_commits(args.repo)
    rows = flags(args.html)
    lines = ["| benchmark | machine | branch | commit | commit of | before | after | held |", "| --- " * 8 + "|"]
    for r in sorted(rows, key=lambda r: (r["machine"], r["branch"], r["commit"], r["benchmark"])):
        kind = kinds.get(str(r["commit"]))
        lines.append(
            f"| `{r['benchmark']}` | {r['machine']} | {r['branch']} | {str(r['commit'])[:10]} | "
            f"{f'scratch: {kind}' if kind else 'main'} | {r['before']:.4g} | {r['after']:.4g} | "
            f"{'yes' if _held(r) else 'no'} |"
        )
    ok, said = verdict(rows, kinds)
    text = "\n".join([*said, "", *lines]) + "\n"
    print(text)
    if args.out:
        args.out.write_text(
            f"# What asv flagged\n\n`{' '.join([prog, *(argv or sys.argv[1:])])}`\n\n"
            + text
        )
    return 0 if ok else 1

