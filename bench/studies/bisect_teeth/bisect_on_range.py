"""Does ``mrcnn-bench bisect`` find each injected commit of the steps range, and step around one that cannot run?

    PYTHONPATH=bench python bench/studies/bisect_teeth/bisect_on_range.py run [--out DIR] [--only NAME]
    PYTHONPATH=bench python bench/studies/bisect_teeth/bisect_on_range.py summary [--out DIR]

``run`` builds the steps range (``mrcnn-bench asv scratch --range steps``: branch ``asv-steps``, 29
commits on main's 70c91c7, a 3% slowdown in the backbone at commit 12 and a 5% one in the mask head
at commit 24, the rest no-ops) and a copy of it, branch ``asv-steps-skip``, with two commits
inserted after commit 14: one whose ``mrcnn`` cannot be imported, then one that restores it (the
rest of the range re-parented, trees unchanged). Then three bisects, each ``mrcnn-bench bisect GOOD
BAD --cases static/eager`` with the defaults, from the range's ends:

- ``first``: the base to the tip; the first slow commit is 12;
- ``second``: commit 12 to the tip, so that the first slower than GOOD is 24;
- ``skip``: the base to the tip of ``asv-steps-skip``; 12's copy, the broken commit (the first the
  search measures after BAD) skipped and named.

Each bisect's record (``bisect --out``) goes to ``DIR/<name>.json`` with its exit status and wall
time (resumable: a bisect with its file is not run again). Run it from a checkout nobody edits (a
``git worktree`` of the commit under study), on an idle machine: each bisect measures about log2 of
its commits, each a live compare in process pairs. ``summary`` writes ``DIR/teeth.md``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/

from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.history.scratch_commits import STEPS, Append, Replace, ScratchCommit, ScratchRange
from mrcnn_bench.history.scratch_range import create

REPO = Path(__file__).resolve().parents[3]
CASE = "static/eager"
SKIP_BRANCH = "asv-steps-skip"
# The broken commit follows commit 14: in the copy's 31 commits it is the one the search measures
# first after BAD (the nearest the middle), so the skip is met whichever way the verdicts go.
SKIP_AFTER = 14
BROKEN = "mrcnn/__init__.py"
BROKEN_LINE = 'raise ImportError("this commit cannot be imported, on purpose: the bisect must skip it")\n'
# Built like every scratch range (fixed authors and dates, objects written without a worktree); the
# repair removes the line again, so every later commit has the steps range's tree.
SKIP = ScratchRange(SKIP_BRANCH, STEPS.base, (
    *STEPS.commits[:SKIP_AFTER],
    ScratchCommit("broken", "mrcnn cannot be imported (the bisect must skip this commit)",
                  (Append(BROKEN, BROKEN_LINE),)),
    ScratchCommit("noop", "mrcnn imports again", (Replace(BROKEN, BROKEN_LINE, ""),)),
    *STEPS.commits[SKIP_AFTER:],
), "steps-skip", STEPS.hour, with_base=True)


def bisects(steps: list[dict[str, str]], skip: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    """Each bisect: GOOD, BAD and the commit it should name (and, for ``skip``, the broken one)."""
    slow = [c["hash"] for c in steps if c["kind"] == "slowdown"]
    slow_skip = [c["hash"] for c in skip if c["kind"] == "slowdown"]
    broken = next(c["hash"] for c in skip if c["kind"] == "broken")
    return {"first": {"good": STEPS.base, "bad": steps[-1]["hash"], "expected": slow[0]},
            "second": {"good": slow[0], "bad": steps[-1]["hash"], "expected": slow[1]},
            "skip": {"good": STEPS.base, "bad": skip[-1]["hash"], "expected": slow_skip[0], "broken": broken}}


def run(out: Path, only: str | None) -> None:
    plan = bisects(create(REPO, STEPS), create(REPO, SKIP))
    out.mkdir(parents=True, exist_ok=True)
    for name, spec in plan.items():
        path = out / f"{name}.json"
        if path.exists() or (only and name != only):
            continue
        with tempfile.TemporaryDirectory(prefix="bisect-teeth-") as tmp:
            record = Path(tmp) / "bisect.json"
            start = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "mrcnn_bench", "bisect", spec["good"], spec["bad"],
                                   "--cases", CASE, "--no-progress", "--out", str(record)],
                                  cwd=REPO, capture_output=True, text=True, check=False)
            seconds = time.monotonic() - start
            if not record.is_file():
                raise SystemExit(f"{name}: bisect exited {done.returncode} and wrote no record:\n{done.stderr[-3000:]}")
            doc = {"name": name, **spec, "exit": done.returncode, "seconds": seconds,
                   "printed": done.stdout.strip().splitlines()[-1:], "bisect": json.loads(record.read_text())}
        atomic_write(path, json.dumps(doc, indent=1) + "\n")
        print(f"{name}: exit {done.returncode}, {seconds / 60:.1f} min: {' '.join(doc['printed'])}", flush=True)


def summary(out: Path) -> int:
    """Write ``DIR/teeth.md`` from the bisects' records and print it."""
    rows = []
    for path in sorted(out.glob("*.json")):
        doc = json.loads(path.read_text())
        b = doc["bisect"]
        found = b["first_bad"] or ("one of " + ", ".join(c[:10] for c in b["candidates"]) if b["candidates"] else "-")
        verdict = "found" if b["first_bad"] == doc["expected"] else "MISSED"
        if "broken" in doc:
            if doc["broken"] in b["skipped"]:
                verdict += "; the broken commit skipped and named"
            elif any(c["commit"] == doc["broken"] for c in b["compares"]):
                verdict += "; the broken commit measured and NOT skipped"
            else:
                verdict += "; the search never met the broken commit"
        measured = ", ".join(f"{c['commit'][:10]} {c['verdict']}" for c in b["compares"])
        rows.append(f"| {doc['name']} | {doc['good'][:10]}..{doc['bad'][:10]} | {len(b['commits'])} | "
                    f"{doc['expected'][:10]} | {found[:10] if b['first_bad'] else found} | {doc['exit']} | "
                    f"{len(b['compares'])}: {measured} | {doc['seconds'] / 60:.1f} | {verdict} |")
    head = ["# bisect on the steps range: each injected commit found from the range's ends",
            "", "`PYTHONPATH=bench python bench/studies/bisect_teeth/bisect_on_range.py run`, then `summary`: "
            f"`mrcnn-bench bisect GOOD BAD --cases {CASE}` with the defaults, every verdict a live compare of "
            "GOOD against one commit in process pairs (True: slower, False: not, None: could not tell).", "",
            "| bisect | GOOD..BAD | commits | expected | named | exit | compares (commit verdict) | minutes | "
            "verdict |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    text = "\n".join(head + rows) + "\n"
    atomic_write(out / "teeth.md", text)
    print(text)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("run", "summary"))
    parser.add_argument("--only", choices=("first", "second", "skip"), default=None, help="run: this bisect only")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "bisect_teeth")
    args = parser.parse_args()
    if args.what == "run":
        run(args.out, args.only)
    return summary(args.out)


if __name__ == "__main__":
    sys.exit(main())
