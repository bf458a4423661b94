"""Does the live compare in process pairs meet its goals? A/A false alarms, and injected slowdowns caught.

    PYTHONPATH=bench python bench/studies/compare_pairs/teeth.py run --kind aa --trials 72 [--case static/eager]
    PYTHONPATH=bench python bench/studies/compare_pairs/teeth.py calibrate --fraction 0.03 --runs 3
    PYTHONPATH=bench python bench/studies/compare_pairs/teeth.py run --kind slow03 --trials 30
    PYTHONPATH=bench python bench/studies/compare_pairs/teeth.py summary

Each trial is one ``mrcnn-bench compare HEAD HEAD`` with the defaults (pairs, rounds, threshold and
alpha fixed in ``mrcnn_bench.base.defaults`` before the study), B with ``--inject-slowdown F`` for
the ``slowNN`` kinds. ``slowNN`` is the slowdown as the compare measures it (NN / 100), not the
fraction asked for, which the hook sizes from an assumed share of the call: ``calibrate`` runs
compares at a fraction (``OUT/<host>/calibration.jsonl``, resumable) and fixes, per case, each kind's
F on the line through every check so far
(:func:`studies.slowdown_calibration.calibrated_fraction`) in ``calibration.json``; ``run`` refuses a
``slowNN`` kind without it, and a case's calibration stays as it is once its slowed trials exist.
Run it from a checkout nobody edits (a ``git worktree`` of the commit under study). Trials append
to ``OUT/<host>/trials.jsonl`` (resumable: ``run`` adds trials until the kind has ``--trials``), one
line per compare with its verdict, ratio, interval, measured noise and seconds; ``summary`` writes
``OUT/<host>/teeth.md``: the calibration, and per kind flagged / trials with the two-sided 95%
Clopper-Pearson interval, and the mean measured ratio with its t-interval across trials (the
measured size of each injection, to hold against its nominal one).
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

from studies.slowdown_calibration import calibrated_fraction, current_checks, injection_of, require_current

from mrcnn_bench.base import defaults
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.gates.stats import mean_ratio_ci
from mrcnn_bench.history.asv_machine import cpu_label, slug
from mrcnn_bench.running.slowdown import INJECTION

REPO = Path(__file__).resolve().parents[3]
KINDS = {"aa": 0.0, "slow02": 0.02, "slow03": 0.03, "slow05": 0.05}  # the slowdown as the compare measures it
GOALS = {"aa": "at most 1% flagged", "slow02": "(no goal)", "slow03": "at least 80% flagged",
         "slow05": "at least 95% flagged"}


def trials_file(out: Path) -> Path:
    return out / slug(cpu_label()) / "trials.jsonl"


def read_trials(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def one_trial(kind: str, case: str, fraction: float = 0.0) -> dict:
    """One compare of this checkout against itself, B with ``--inject-slowdown fraction``; its line
    of the table and what it cost."""
    with tempfile.TemporaryDirectory(prefix="mrcnn-teeth-") as tmp:
        out = Path(tmp) / "cmp.json"
        args = [sys.executable, "-m", "mrcnn_bench", "compare", "HEAD", "HEAD", "--cases", case, "--no-progress",
                "--out", str(out)]
        if fraction:
            args += ["--inject-slowdown", str(fraction)]
        start, load = time.monotonic(), os.getloadavg()[0]
        proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=False)
        seconds = time.monotonic() - start
        if proc.returncode not in (0, 1) or not out.is_file():
            raise RuntimeError(f"compare exited {proc.returncode} (its --out written: {out.is_file()}):\n"
                               f"{proc.stderr[-3000:]}")
        (line,) = json.loads(out.read_text())["comparison"]
    return {"kind": kind, "case": case, "injected": fraction, "injection": INJECTION,
            "flagged": bool(line["regression"]), "ratio": line["ratio_b_over_a"], "ci95": line["ci95"],
            "p_value": line["p_value"], "process_sd": line["process_sd"],
            "round_sd": line["round_sd"], "pairs": line["pairs"], "rounds": line["n"], "seconds": seconds,
            "loadavg_before": load, "threshold": defaults.PAIR_THRESHOLD, "alpha": defaults.ALPHA}


def calibration_file(out: Path) -> Path:
    """``OUT/<host>/calibration.json``: the fractions fixed and the checks they came from (``.jsonl``)."""
    return trials_file(out).with_name("calibration.json")


def read_calibration(out: Path) -> dict:
    """:func:`calibration_file`'s content; empty before any calibration."""
    path = calibration_file(out)
    return json.loads(path.read_text()) if path.is_file() else {}


def calibrate(out: Path, case: str, fraction: float, runs: int) -> None:
    """Compares at ``--inject-slowdown fraction`` until there are ``runs`` at it for ``case``; then fixes
    each slowed kind's F, from every check of the case so far, in ``calibration.json``."""
    if any(t["case"] == case and KINDS[t["kind"]] for t in read_trials(trials_file(out))):
        raise SystemExit(f"slowed trials of {case} exist: the calibration they were run with stays as it is")
    path = calibration_file(out).with_suffix(".jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    while sum(f == fraction for f, _ in current_checks(c for c in read_trials(path) if c["case"] == case)) < runs:
        check = one_trial("calibration", case, fraction)
        with path.open("a") as f:
            f.write(json.dumps(check) + "\n")
        print(f"calibration of {case} at {fraction}: ratio {check['ratio']:.4f} [{check['ci95']}] "
              f"({check['seconds']:.0f} s)", flush=True)
    checks = current_checks(c for c in read_trials(path) if c["case"] == case)
    fractions = {}
    for kind, target in KINDS.items():
        if target:
            try:
                fractions[kind] = calibrated_fraction(checks, target)
            except ValueError as e:  # e.g. a line whose intercept lies above the target: calibrate nearer it
                print(f"{kind}: {e}", file=sys.stderr)
    doc = read_calibration(out) | {case: {"injection": INJECTION, "fractions": fractions,
                                      "checks": [{"injected": f, "ratio": r} for f, r in checks]}}
    atomic_write(calibration_file(out), json.dumps(doc, indent=1) + "\n")
    print(f"{case}: " + ", ".join(f"{kind} --inject-slowdown {f}" for kind, f in fractions.items())
          + f" (from {len(checks)} checks)")


def run(out: Path, kind: str, trials: int, case: str) -> None:
    fraction = 0.0
    if KINDS[kind]:
        calibration = read_calibration(out).get(case)
        if calibration is None:
            raise SystemExit(f"no calibration of {case} in {calibration_file(out)}: run `calibrate` first")
        require_current(calibration, f"{case} in {calibration_file(out)}")
        if kind not in calibration["fractions"]:
            raise SystemExit(f"the calibration of {case} gives no fraction for {kind}: calibrate at a smaller one")
        fraction = calibration["fractions"][kind]
    path = trials_file(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    done = sum(1 for t in read_trials(path) if t["kind"] == kind and t["case"] == case)
    for i in range(done, trials):
        trial = one_trial(kind, case, fraction)
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
             f"{defaults.PAIR_THRESHOLD:.0%}, alpha {defaults.ALPHA}), B with the injected slowdown.", ""]
    for case, calibration in read_calibration(out).items():
        measured = ", ".join(f"{c['ratio']:.4f} at {c['injected']}" for c in calibration["checks"])
        chosen = (", ".join(f"{kind} {f}" for kind, f in calibration["fractions"].items())
                  or "none (the line's intercept, the hook's fixed cost, lies above every kind's slowdown)")
        lines += [f"Calibration of {case} ({injection_of(calibration)} injection): "
                  f"{len(calibration['checks'])} compares with `--inject-slowdown` read B/A {measured}; "
                  f"the fraction each kind injects: {chosen}.", ""]
    lines += [
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
    parser.add_argument("what", choices=("calibrate", "run", "summary"))
    parser.add_argument("--kind", choices=tuple(KINDS), default="aa")
    parser.add_argument("--trials", type=int, default=72, help="total for the kind and case (default: %(default)s)")
    parser.add_argument("--case", default=defaults.COMPARE_CASES, help="(default: %(default)s)")
    parser.add_argument("--fraction", type=float, default=0.03,
                        help="calibrate: the --inject-slowdown of its compares (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="calibrate: compares at --fraction (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=REPO / "results/compare_pairs")
    args = parser.parse_args()
    if args.what == "calibrate":
        calibrate(args.out, args.case, args.fraction, args.runs)
        if not read_trials(trials_file(args.out)):  # nothing to summarize yet: calibrate did its job
            return 0
    if args.what == "run":
        run(args.out, args.kind, args.trials, args.case)
    return summary(args.out)


if __name__ == "__main__":
    sys.exit(main())
