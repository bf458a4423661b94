"""Does the live compare in process pairs meet its goals? A/A false alarms, and injected slowdowns caught.

    PYTHONPATH=bench python bench/studies/compare_pairs/teeth.py run --kind aa --trials 72 [--case static/eager]
    PYTHONPATH=bench python bench/studies/compare_pairs/teeth.py run --kind slow03 --trials 30
    PYTHONPATH=bench python bench/studies/compare_pairs/teeth.py summary

Each trial is one ``mrcnn-bench compare HEAD HEAD`` with the defaults (pairs, rounds, threshold and
alpha fixed in ``mrcnn_bench.base.defaults`` before the study), B with ``--inject-slowdown F`` for
the ``slowNN`` kinds (F = NN / 100, nominal: the injection's measured size is reported beside its
rate). Trials append to ``OUT/<host>/trials.jsonl`` (resumable: ``run`` adds trials until the kind
has ``--trials``), one line per compare with its verdict, ratio, interval, measured noise and
seconds; ``summary`` writes ``OUT/<host>/teeth.md``: per kind, flagged / trials with the two-sided
95% Clopper-Pearson interval, and the mean measured ratio with its t-interval across trials.
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

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/

from mrcnn_bench.base import defaults
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.gates.stats import mean_ratio_ci
from mrcnn_bench.history.asv_machine import cpu_label, slug

REPO = Path(__file__).resolve().parents[3]
KINDS = {"aa": 0.0, "slow02": 0.02, "slow03": 0.03, "slow05": 0.05}
GOALS = {"aa": "at most 1% flagged", "slow02": "(no goal)", "slow03": "at least 80% flagged",
         "slow05": "at least 95% flagged"}


def trials_file(out: Path) -> Path:
    return out / slug(cpu_label()) / "trials.jsonl"


def read_trials(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def one_trial(kind: str, case: str) -> dict:
    """One compare of this checkout against itself; its line of the table and what it cost."""
    with tempfile.TemporaryDirectory(prefix="mrcnn-teeth-") as tmp:
        out = Path(tmp) / "cmp.json"
        args = [sys.executable, "-m", "mrcnn_bench", "compare", "HEAD", "HEAD", "--cases", case, "--no-progress",
                "--out", str(out)]
        if KINDS[kind]:
            args += ["--inject-slowdown", str(KINDS[kind])]
        start, load = time.monotonic(), os.getloadavg()[0]
        proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=False)
        seconds = time.monotonic() - start
        if proc.returncode not in (0, 1) or not out.is_file():
            raise RuntimeError(f"compare exited {proc.returncode} (its --out written: {out.is_file()}):\n"
                               f"{proc.stderr[-3000:]}")
        (line,) = json.loads(out.read_text())["comparison"]
    return {"kind": kind, "case": case, "flagged": bool(line["regression"]), "ratio": line["ratio_b_over_a"],
            "ci95": line["ci95"], "p_value": line["p_value"], "process_sd": line["process_sd"],
            "round_sd": line["round_sd"], "pairs": line["pairs"], "rounds": line["n"], "seconds": seconds,
            "loadavg_before": load, "threshold": defaults.PAIR_THRESHOLD, "alpha": defaults.ALPHA}


def run(out: Path, kind: str, trials: int, case: str) -> None:
    path = trials_file(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    done = sum(1 for t in read_trials(path) if t["kind"] == kind and t["case"] == case)
    for i in range(done, trials):
        trial = one_trial(kind, case)
        with path.open("a") as f:
            f.write(json.dumps(trial) + "\n")
        print(f"{kind} {i + 1}/{trials}: ratio {trial['ratio']:.4f} [{trial['ci95']}] flagged {trial['flagged']} "
              f"({trial['seconds']:.0f} s)", flush=True)


def summary(out: Path) -> int:
    path = trials_file(out)
    trials = read_trials(path)
    if not trials:
        print(f"no trials in {path}", file=sys.stderr)
        return 2
    lines = [f"# Live compare in process pairs: A/A false alarms and injected slowdowns caught ({path.parent.name})",
             "", f"`PYTHONPATH=bench python bench/studies/compare_pairs/teeth.py run --kind KIND --trials N`, then "
             "`summary`. Each trial: `mrcnn-bench compare HEAD HEAD` with the defaults "
             f"({defaults.COMPARE_PAIRS} pairs x {defaults.COMPARE_ROUNDS} rounds, threshold "
             f"{defaults.PAIR_THRESHOLD:.0%}, alpha {defaults.ALPHA}), B with the injected slowdown.", "",
             "| case | kind | goal | flagged | 95% CI | measured ratio B/A (95% CI) | median minutes | "
             "median process sd | median round sd |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for case in dict.fromkeys(t["case"] for t in trials):
        for kind in KINDS:
            rows = [t for t in trials if t["kind"] == kind and t["case"] == case]
            if not rows:
                continue
            k, n = sum(t["flagged"] for t in rows), len(rows)
            interval = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")  # Clopper-Pearson
            low, high = interval.low, interval.high
            logs = np.log([t["ratio"] for t in rows])
            if n > 1:
                ratio, ratio_low, ratio_high = mean_ratio_ci(logs)
                measured = f"{ratio:.4f} ({ratio_low:.4f}-{ratio_high:.4f})"
            else:
                measured = f"{np.exp(logs.mean()):.4f}"
            lines.append(f"| {case} | {kind} | {GOALS[kind]} | {k}/{n} = {k / n:.1%} | {low:.1%}-{high:.1%} | "
                         f"{measured} | {np.median([t['seconds'] for t in rows]) / 60:.1f} | "
                         f"{np.median([t['process_sd'] for t in rows]):.4f} | "
                         f"{np.median([t['round_sd'] for t in rows]):.4f} |")
    text = "\n".join(lines) + "\n"
    atomic_write(path.parent / "teeth.md", text)
    print(text)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("run", "summary"))
    parser.add_argument("--kind", choices=tuple(KINDS), default="aa")
    parser.add_argument("--trials", type=int, default=72, help="total for the kind and case (default: %(default)s)")
    parser.add_argument("--case", default=defaults.COMPARE_CASES, help="(default: %(default)s)")
    parser.add_argument("--out", type=Path, default=REPO / "results/compare_pairs")
    args = parser.parse_args()
    if args.what == "run":
        run(args.out, args.kind, args.trials, args.case)
    return summary(args.out)


if __name__ == "__main__":
    sys.exit(main())
