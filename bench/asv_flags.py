"""Every regression asv flagged, by commit, and whether the scratch range's verdict holds.

    PYTHONPATH=bench python bench/asv_flags.py [--html results/html] [--out results/asv/regressions.md]

Reads what ``asv publish`` wrote (``regressions.json``, ``index.json``) and lists each flag: the
benchmark and its parameters, the branch, the commit where the step is, the values before and
after. Commits of the scratch range (``bench/asv_scratch.py``) are named by their kind. The verdict
covers the held metrics only (ratios to the ruler, compile counts, ``1 - AP``): on the scratch
branch, the commits of the range they flag must be exactly the three injected ones. Raw seconds,
time to first result, peak memory and FLOPs are listed but not held to it. Exit 0 when the verdict
holds, 1 when it does not, 2 when there is nothing to read.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path

HELD = ("track_ratio", "track_count", "track_box_error", "track_mask_error")
SCRATCH_BRANCH = "asv-scratch"


def _scratch_commits(repo: Path) -> dict[str, str]:
    """Full hash -> kind, for the commits bench/asv_scratch.py builds (computed, not read from the branch)."""
    spec = importlib.util.spec_from_file_location("asv_scratch", Path(__file__).with_name("asv_scratch.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["asv_scratch"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return {c["hash"]: c["kind"] for c in module.expected(repo)}


def flags(html: Path) -> list[dict[str, object]]:
    """One row per (benchmark, branch, step) that asv's regression detection reports."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--html", type=Path, default=Path("results/html"), help="asv's published folder")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here (markdown)")
    parser.add_argument("--repo", type=Path, default=Path("."), help="the repository (for the scratch hashes)")
    args = parser.parse_args(argv)
    if not (args.html / "regressions.json").is_file():
        print(f"asv_flags: no regressions.json in {args.html}: run make asv-publish first", file=sys.stderr)
        return 2
    kinds = _scratch_commits(args.repo)
    rows = flags(args.html)
    lines = ["| benchmark | machine | branch | commit | scratch kind | before | after | held |", "| --- " * 8 + "|"]
    for r in sorted(rows, key=lambda r: (r["machine"], r["branch"], r["commit"], r["benchmark"])):
        held = any(h in str(r["benchmark"]) for h in HELD)
        lines.append(
            f"| `{r['benchmark']}` | {r['machine']} | {r['branch']} | {str(r['commit'])[:10]} | "
            f"{kinds.get(str(r['commit']), '-')} | {r['before']:.4g} | {r['after']:.4g} | {'yes' if held else 'no'} |"
        )
    injected = {h for h, k in kinds.items() if k != "noop"}
    flagged = {
        str(r["commit"])
        for r in rows
        # A commit of the range lies on the scratch branch only (asv leaves the branch out of a
        # graph's parameters when only one branch has results).
        if str(r["commit"]) in kinds and any(h in str(r["benchmark"]) for h in HELD)
    }
    ok = flagged == injected
    verdict = (
        f"Held metrics on {SCRATCH_BRANCH}: flagged {len(flagged & injected)} of the {len(injected)} injected "
        f"commits and {len(flagged - injected)} other commit(s) of the range: "
        + ("the verdict holds." if ok else "the verdict does NOT hold.")
    )
    text = "\n".join([verdict, "", *lines]) + "\n"
    print(text)
    if args.out:
        args.out.write_text(
            f"# What asv flagged\n\n`{' '.join(['python bench/asv_flags.py', *(argv or sys.argv[1:])])}`\n\n" + text
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
