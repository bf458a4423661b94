"""How often does CI's latency check cry wolf, and how often does it catch a 10% slowdown? And what does it cost?

    PYTHONPATH=bench python bench/studies/latency_check/trials.py calibrate --fraction 0.1 --runs 3   (and at 0.05)
    PYTHONPATH=bench python bench/studies/latency_check/trials.py run --trials 20     (each kind, alternating)
    PYTHONPATH=bench python bench/studies/latency_check/trials.py summary

Each trial is one ``mrcnn-bench latency-check --against HEAD --cases static/eager`` with the check's
defaults: ``aa`` on the unchanged commit, ``slow10`` with ``--inject-slowdown F`` on the working
tree's side. ``--inject-slowdown`` sizes its extra work from an assumed share of the call
(:data:`mrcnn_bench.running.slowdown.PASS_SHARE`), so its nominal fraction is not the slowdown the
check sees: ``calibrate`` runs checks at a fraction (``OUT/<host>/calibration.jsonl``, resumable)
and fixes F, the fraction the check measures as 10% on the line through every check so far
(:func:`studies.slowdown_calibration.calibrated_fraction`), in ``calibration.json`` before any
slow10 trial; ``run`` refuses to start without it. Run it from a checkout nobody edits (a ``git
worktree`` of the commit under study): the check compares that checkout with its own HEAD. The kinds
alternate, so that a stop leaves them balanced; trials append to ``OUT/<host>/trials.jsonl``
(resumable: ``run`` adds trials until each kind has ``--trials``); ``summary`` writes
``OUT/<host>/summary.md``: the calibration, and per kind the goal, flagged / trials with its
two-sided 95% Clopper-Pearson interval, the exit codes, the mean measured ratio with its t-interval
across trials, and the check's minutes (median and largest).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/

from studies.compare_pairs.teeth import (  # one trials and one calibration file per host, one line per trial
    calibration_file,
    read_calibration,
    read_trials,
    trials_file,
)
from studies.slowdown_calibration import calibrated_fraction, current_checks, injection_of, require_current

from mrcnn_bench.base import defaults
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.gates.stats import mean_ratio_ci
from mrcnn_bench.running.slowdown import INJECTION

REPO = Path(__file__).resolve().parents[3]
TARGET = 0.10  # the slowdown slow10 trials inject, as the check measures it
KINDS = ("aa", "slow10")
GOALS = {"aa": "at most 1 of 20 flagged", "slow10": "at least 18 of 20 flagged"}
CASE = "static/eager"


def one_trial(kind: str, fraction: float) -> dict:
    """One latency check of this checkout against its HEAD, B slowed by ``--inject-slowdown fraction``
    (none at 0); what it decided and what it cost."""
    with tempfile.TemporaryDirectory(prefix="mrcnn-check-trial-") as tmp:
        args = [sys.executable, "-m", "mrcnn_bench", "latency-check", "--against", "HEAD", "--cases", CASE,
                "--no-progress", "--out", tmp]
        if fraction:
            args += ["--inject-slowdown", str(fraction)]
        start = time.monotonic()
        proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=False)
        seconds = time.monotonic() - start
        check = Path(tmp) / "check.json"
        if proc.returncode not in (0, 1, 2) or not check.is_file():
            raise RuntimeError(f"latency-check exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        doc = json.loads(check.read_text())
    (line,) = doc["comparison"]
    return {"kind": kind, "case": CASE, "injected": fraction, "injection": INJECTION, "exit": proc.returncode,
            "flagged": bool(line["regression"]), "ratio": line["ratio_b_over_a"], "ci95": line["ci95"],
            "p_value": line["p_value"], "process_sd": line["process_sd"], "round_sd": line["round_sd"],
            "pairs": doc["pairs"], "rounds": doc["rounds"], "seconds": seconds, "head": doc["head"]}


def calibrate(out: Path, fraction: float, runs: int) -> None:
    """Checks at ``--inject-slowdown fraction`` until there are ``runs`` at it; then fixes F, from every
    check so far, in ``calibration.json``."""
    path = calibration_file(out).with_suffix(".jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    if any(t["kind"] == "slow10" for t in read_trials(trials_file(out))):
        raise SystemExit("slow10 trials exist: the calibration they were run with stays as it is")
    while sum(f == fraction for f, _ in current_checks(read_trials(path))) < runs:
        check = one_trial("calibration", fraction)
        with path.open("a") as f:
            f.write(json.dumps(check) + "\n")
        print(f"calibration at {fraction}: ratio {check['ratio']:.4f} [{check['ci95']}] ({check['seconds']:.0f} s)",
              flush=True)
    checks = current_checks(read_trials(path))
    doc = {"target": TARGET, "injection": INJECTION, "checks": [{"injected": f, "ratio": r} for f, r in checks],
           "fraction": calibrated_fraction(checks, TARGET)}
    atomic_write(calibration_file(out), json.dumps(doc, indent=1) + "\n")
    print(f"--inject-slowdown {doc['fraction']} for a measured {TARGET:.0%} (from {len(checks)} checks)")


def run(out: Path, trials: int) -> None:
    calibration = read_calibration(out)
    if not calibration:
        raise SystemExit(f"no {calibration_file(out)}: run `calibrate` first")
    require_current(calibration, str(calibration_file(out)))
    path = trials_file(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        done = Counter(t["kind"] for t in read_trials(path))
        kind = min(KINDS, key=lambda k: (done[k], KINDS.index(k)))
        if done[kind] >= trials:
            return
        trial = one_trial(kind, calibration["fraction"] if kind == "slow10" else 0.0)
        with path.open("a") as f:
            f.write(json.dumps(trial) + "\n")
        print(f"{kind} {done[kind] + 1}/{trials}: exit {trial['exit']}, ratio {trial['ratio']:.4f} "
              f"[{trial['ci95']}] ({trial['seconds']:.0f} s)", flush=True)


def summary(out: Path) -> int:
    path = trials_file(out)
    trials = read_trials(path)
    if not trials:
        print(f"no trials in {path}", file=sys.stderr)
        return 2
    calibration = read_calibration(out)
    lines = [f"# CI's latency check: false alarms, a 10% slowdown caught, and its cost ({path.parent.name})", "",
             "`PYTHONPATH=bench python bench/studies/latency_check/trials.py calibrate`, `run --trials N`, then "
             f"`summary`. Each trial: `mrcnn-bench latency-check --against HEAD --cases {CASE}` with the defaults "
             f"({defaults.CHECK_PAIRS} pairs x {defaults.CHECK_ROUNDS} rounds, threshold "
             f"{defaults.PAIR_THRESHOLD:.0%}, alpha {defaults.ALPHA}); slow10 with "
             f"`--inject-slowdown {calibration.get('fraction', 'F')}`.", ""]
    if calibration:
        by_fraction: dict[float, list[str]] = {}
        for check in calibration["checks"]:
            by_fraction.setdefault(check["injected"], []).append(f"{check['ratio']:.4f}")
        measured = "; ".join(f"at {f}: {', '.join(r)}" for f, r in sorted(by_fraction.items()))
        lines += [f"Calibration ({injection_of(calibration)} injection): {len(calibration['checks'])} checks with "
                  f"`--inject-slowdown` measured B/A {measured}; "
                  f"the line fitted through them gives {calibration['fraction']} for a measured "
                  f"{calibration['target']:.0%} (the slow10 trials' own mean ratio is in the table).", ""]
    lines += ["| kind | goal | flagged | 95% CI | exit codes | measured ratio B/A (95% CI) "
              "| minutes: median, largest |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for kind in KINDS:
        rows = [t for t in trials if t["kind"] == kind]
        if not rows:
            continue
        k, n = sum(t["flagged"] for t in rows), len(rows)
        interval = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")  # Clopper-Pearson
        codes = ", ".join(f"{code}: {count}" for code, count in sorted(Counter(t["exit"] for t in rows).items()))
        logs = np.log([t["ratio"] for t in rows])
        ratio = f"{np.exp(logs.mean()):.4f}"
        if n > 1:
            mean, low, high = mean_ratio_ci(logs)
            ratio = f"{mean:.4f} ({low:.4f}-{high:.4f})"
        minutes = np.array([t["seconds"] for t in rows]) / 60
        lines.append(f"| {kind} | {GOALS[kind]} | {k}/{n} | {interval.low:.1%}-{interval.high:.1%} | {codes} | "
                     f"{ratio} | {np.median(minutes):.1f}, {minutes.max():.1f} |")
    text = "\n".join(lines) + "\n"
    atomic_write(path.parent / "summary.md", text)
    print(text)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("calibrate", "run", "summary"))
    parser.add_argument("--fraction", type=float, default=TARGET,
                        help="calibrate: the --inject-slowdown of its checks (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="calibrate: checks at --fraction (default: %(default)s)")
    parser.add_argument("--trials", type=int, default=20, help="for each kind (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=REPO / "results/latency_check")
    args = parser.parse_args()
    if args.what == "calibrate":
        calibrate(args.out, args.fraction, args.runs)
        if not read_trials(trials_file(args.out)):  # nothing to summarize yet: calibrate did its job
            return 0
    if args.what == "run":
        run(args.out, args.trials)
    return summary(args.out)


if __name__ == "__main__":
    sys.exit(main())
