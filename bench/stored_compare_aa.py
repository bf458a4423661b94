"""Issue 14: the false-alarm rate of ``mrcnn-bench compare RUN_A.json RUN_B.json`` across separate runs.

    python bench/stored_compare_aa.py run [--pairs 72] [--rounds 25] [--out results/stored_compare_aa]
    python bench/stored_compare_aa.py summary [--out results/stored_compare_aa]

A trial is two separate ``mrcnn-bench run`` processes of the same code and settings (torchvision/eager
and static/eager, the tiny preset, three 240x320 images, ``--rounds`` rounds, each row in its own
worker as ``run`` does by default), one after the other, then the stored-run comparison of the
second against the first as ``compare A.json B.json`` makes it (:func:`mrcnn_bench.ab.compare_records`
with ``relative=True``: each round's static/eager time over the same round's torchvision/eager time,
the rule of the live gate on those ratios, Holm over the cases). Nothing differs between A and B, so
every "regression" is a false alarm. The run files go to ``out/stored_compare_aa/`` (not committed);
each finished trial is appended to ``OUT/trials.jsonl`` with the per-round times and the verdict, so
an interrupted study resumes at the next trial.

``summary`` writes ``OUT/summary.md``: the false-alarm rate with its two-sided 95% Clopper-Pearson
interval and the number of trials, and the spread of the stored ratio B/A between runs (what a drift
of one run's level against the other's does to the comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scipy import stats

from mrcnn_bench import ab, store
from mrcnn_bench.journal import read_lines

CASES = "torchvision/eager,static/eager"
WORKLOAD = ["--preset", "tiny", "--image-size", "240x320", "--images", "3"]
RUNS = Path("out/stored_compare_aa")


def one_run(name: str, rounds: int) -> store.RunDocument:
    path = RUNS / f"{name}.json"
    if not path.is_file():
        cmd = [sys.executable, "-m", "mrcnn_bench.cli", "run", *WORKLOAD, "--cases", CASES, "--rounds", str(rounds),
               "--peak-reps", "0", "--no-flops", "--no-plots", "--no-progress", "--out", str(RUNS), "--name", name]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{name}: exit {result.returncode}\n{result.stderr[-2000:]}")
    return store.load(path)


def cmd_run(args: argparse.Namespace) -> int:
    trials_path = args.out / "trials.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    done = len(read_lines(trials_path))
    for pair in range(done, args.pairs):
        t0, load = time.time(), os.getloadavg()[0]
        a, b = one_run(f"pair{pair:03d}_a", args.rounds), one_run(f"pair{pair:03d}_b", args.rounds)
        line = ab.compare_records(a.records, b.records, relative=True).set_index("case").loc["static/eager"]
        times = {f"{side}_{r.case}": r.times_s for side, doc in (("a", a), ("b", b)) for r in doc.records}
        low, high = (float(x) for x in line["ci95"].split("-"))
        trial = {"pair": pair, "ratio": float(line["ratio_b_over_a"]), "low": low, "high": high,
                 "p_value": float(line["p_value"]),
                 "regression": bool(line["regression"]), "verdict": line["verdict"], "rounds": args.rounds,
                 "seconds": time.time() - t0, "loadavg_before": load, "loadavg_after": os.getloadavg()[0], **times}
        with trials_path.open("a") as f:
            f.write(json.dumps(trial) + "\n")
            f.flush()
            os.fsync(f.fileno())
        print(f"pair {pair}: ratio {trial['ratio']:.3f} [{trial['low']:.3f}-{trial['high']:.3f}] "
              f"p={trial['p_value']:.3g} {'FALSE ALARM' if trial['regression'] else 'ok'}", flush=True)
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    trials = read_lines(args.out / "trials.jsonl")
    if not trials:
        print(f"no trials in {args.out}", file=sys.stderr)
        return 2
    n, alarms = len(trials), sum(t["regression"] for t in trials)
    ci = stats.binomtest(alarms, n).proportion_ci(confidence_level=0.95, method="exact")
    ratios = sorted(t["ratio"] for t in trials)
    q = statistics.quantiles(ratios, n=20) if n >= 2 else [ratios[0]] * 19
    text = [
        f"# Stored-run compare, A/A: {n} trials of {trials[0]['rounds']} rounds",
        "",
        "`python bench/stored_compare_aa.py run` then `summary`. A trial: two separate `mrcnn-bench run`s of the",
        "same code, compared as `mrcnn-bench compare A.json B.json` does (each round's static/eager time over",
        "the same round's torchvision/eager time; Wilcoxon on log ratio - log 1.05, Holm, alpha 0.01).",
        "",
        f"- false alarms: {alarms} of {n} = {alarms / n:.1%}, two-sided 95% Clopper-Pearson interval "
        f"[{ci.low:.1%}, {ci.high:.1%}]",
        f"- the stored ratio B/A between two runs of the same code: median {statistics.median(ratios):.3f}, "
        f"5th-95th percentile {q[0]:.3f}-{q[-1]:.3f}, range {ratios[0]:.3f}-{ratios[-1]:.3f}",
        f"- load average before the trials: median {statistics.median(t['loadavg_before'] for t in trials):.2f}",
    ]
    (args.out / "summary.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("run", "summary"))
    parser.add_argument("--pairs", type=int, default=72, help="trials (72: what a claimed rate <= 5%% needs)")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--out", type=Path, default=Path("results/stored_compare_aa"))
    args = parser.parse_args()
    return cmd_run(args) if args.what == "run" else cmd_summary(args)


if __name__ == "__main__":
    sys.exit(main())
