"""Do the exact work counters find every change of work on the work range, at its commit and stage, and nothing else?

    PYTHONPATH=bench python bench/studies/work_counter_teeth/counters_on_range.py run [--out DIR]
    PYTHONPATH=bench python bench/studies/work_counter_teeth/counters_on_range.py summary [--out DIR]

``run`` builds the work range (``mrcnn-bench asv scratch --range work``: branch ``asv-work``, 12
commits on main's 70c91c7 with fixed authors and dates), checks each commit and the base out in a
throwaway worktree and counts static/eager's work per stage there with this checkout's harness
(``python -m mrcnn_bench.history.stage_work``, what asv's ``StageWork`` records), one JSON file per
commit under ``DIR/counts/`` (resumable: a commit with its file is not counted again).

``summary`` makes one series per counter and stage, runs the change-point rule for exact series on
them (:func:`mrcnn_bench.changes.changepoints.find`, every series exact: each change between
consecutive commits is a step) and writes ``DIR/teeth.md``: per commit, its kind and designed
stage, the steps found at it, and whether that is what was designed (a work commit found in its
stage; a no-op commit found nowhere).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/

from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.changes import changepoints
from mrcnn_bench.history.scratch_commits import WORK
from mrcnn_bench.history.scratch_range import expected

REPO = Path(__file__).resolve().parents[3]
CASE = "static/eager"


def line(repo: Path) -> list[dict[str, str]]:
    """The base and the range's commits, oldest first: hash, kind, subject, designed stage."""
    return [{"hash": WORK.base, "kind": "base", "subject": "the base (main's 70c91c7)"}, *expected(repo, WORK)]


def count(repo: Path, commit: str) -> dict:
    """static/eager's work per stage at ``commit``, counted in a worktree of it by this checkout's harness."""
    with tempfile.TemporaryDirectory(prefix="mrcnn-work-") as tmp:
        tree, out = Path(tmp) / "tree", Path(tmp) / "work.json"
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "-q", str(tree), commit], check=True)
        try:
            start = time.monotonic()
            env = {**os.environ, "PYTHONPATH": str(repo / "bench"), "PJRT_DEVICE": "CPU"}
            done = subprocess.run([sys.executable, "-m", "mrcnn_bench.history.stage_work", str(out), "--cases", CASE],
                                  cwd=tree, env=env, capture_output=True, text=True, timeout=900, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"{commit[:10]}: stage_work exited {done.returncode}:\n{done.stderr[-2000:]}")
            return {"commit": commit, "seconds": time.monotonic() - start, **json.loads(out.read_text())}
        finally:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], check=False)


def run(out: Path) -> None:
    built = subprocess.run([sys.executable, "-m", "mrcnn_bench", "asv", "scratch", "--range", "work"], cwd=REPO,
                           capture_output=True, text=True, check=False)
    if built.returncode != 0:
        raise SystemExit(f"building the range failed:\n{built.stderr}")
    folder = out / "counts"
    folder.mkdir(parents=True, exist_ok=True)
    commits = line(REPO)
    for k, c in enumerate(commits):
        path = folder / f"{k:02d}-{c['hash'][:10]}.json"
        if path.exists():
            continue
        result = count(REPO, c["hash"])
        atomic_write(path, json.dumps({**result, "kind": c["kind"], "subject": c["subject"],
                                       "stage": c.get("stage", "")}, indent=1) + "\n")
        print(f"{k + 1}/{len(commits)} {c['hash'][:10]} {c['kind']}: {result['seconds']:.0f} s", flush=True)


def summary(out: Path) -> str:
    records = [json.loads(p.read_text()) for p in sorted((out / "counts").glob("*.json"))]
    series: dict[str, tuple[list[str], list[float]]] = {}
    for r in records:
        for stage, counters in r["work"][CASE].items():
            for counter, value in counters.items():
                commits, values = series.setdefault(f"{counter}({stage})", ([], []))
                commits.append(r["commit"][:10])
                values.append(float(value))
    points = changepoints.find(series, exact=set(series))
    rows, met = [], []
    for r in records:
        at = [p for p in points if p.commit == r["commit"][:10]]
        stages = sorted({p.metric.partition("(")[2].rstrip(")") for p in at})
        if r["kind"] == "base":
            verdict = "-"
        elif r["kind"] == "noop":
            verdict = "as designed (nothing)" if not at else "FALSE STEP"
        else:
            verdict = "found in its stage" if r["stage"] in stages else "MISSED"
        met.append(verdict)
        found = "; ".join(f"{p.metric} {'from 0' if p.change_pct is None else f'{p.change_pct:+.2f}%'}" for p in at)
        rows.append(f"| {r['commit'][:10]} | {r['kind']} | {r['stage'] or '-'} | {r['subject']} | {found or 'none'} | "
                    f"{verdict} |")
    work = sum(1 for r in records if r["kind"] == "work")
    noop = sum(1 for r in records if r["kind"] == "noop")
    seconds = sorted(r["seconds"] for r in records)
    head = [
        "# Exact work counters on the work range: every change of work found, at its commit and stage",
        "",
        "`PYTHONPATH=bench python bench/studies/work_counter_teeth/counters_on_range.py run`, then `summary`:",
        f"static/eager's FLOPs, operators and bytes written per stage at each of {len(records)} commits (the base",
        "and the range `mrcnn-bench asv scratch --range work` builds), each counted by this checkout's harness in",
        "a worktree of the commit; steps by the exact rule (any change between consecutive commits).",
        "",
        f"Work commits found in their stage: {met.count('found in its stage')} of {work}. "
        f"No-op commits with a step: {met.count('FALSE STEP')} of {noop}. "
        f"Seconds per commit (median): {seconds[len(seconds) // 2]:.0f}.",
        "",
        "| commit | kind | designed stage | subject | steps found there (counter(stage) change) | verdict |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    return "\n".join(head + rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("run", "summary"))
    parser.add_argument("--out", type=Path, default=REPO / "results" / "work_counter_teeth")
    args = parser.parse_args()
    if args.what == "run":
        run(args.out)
    text = summary(args.out)
    atomic_write(args.out / "teeth.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
