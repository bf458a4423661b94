"""The accuracy gate's false-fail rate and the smallest drop it catches, from 10+ seeds.

    python bench/studies/accuracy_gate_flake/accuracy_flake.py train [--seeds 0-9] [--parallel 2] [--out out/acc10]
    python bench/studies/accuracy_gate_flake/accuracy_flake.py summary [--seeds 0-9] [--out out/acc10]
        [--results results/accuracy] [--baseline baselines/accuracy/ci.json]

``train`` runs ``mrcnn train --recipe ci --seed S --threads 1`` for each seed whose run folder has
no evaluation at the recipe's last step yet, ``--parallel`` at a time (one thread each, as the committed baseline's
seeds were trained); rerun it after an interruption and it starts only what is missing (a seed cut
short starts over: its folder is emptied).

``summary`` reads each seed's final COCO box and mask AP and the gate's baseline (the tolerance rule's
current values, from ``--baseline``) and writes ``RESULTS/flake.md`` and
``RESULTS/flake.json``: per metric the mean and sample std over the seeds, and for a tolerance
``tol`` the two error rates of the gate "fail when a CI run's AP < mean - tol":

- false fail: an unchanged model's CI run is one more draw from the seeds' distribution, and the
  baseline's mean is itself estimated from n seeds, so ``(x - mean) / (s * sqrt(1 + 1/n))`` follows
  Student's t with n - 1 degrees of freedom: P(fail) = t_cdf(-tol / (s * sqrt(1 + 1/n)));
- the smallest reliably caught drop: the drop d of the true AP at which a CI run fails with
  probability 0.95: d = tol + t_0.95 * s * sqrt(1 + 1/n).

It prints both for the current rule (max(3 std, 0.04)) and for the tolerance that holds the false
fail at 1% (tol = t_0.99 * s * sqrt(1 + 1/n)), per metric. The normal model is checked with a
Shapiro-Wilk test on the seeds (reported; with 10 seeds it can only reject gross departures).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
from pathlib import Path

from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the studies' shared modules (studies.*)

from studies.training_runs import Job, run_jobs

from mrcnn.recipes import get_recipe
from mrcnn_bench.gates.accuracy_baseline import (
    DEFAULT_FLOOR,
    DEFAULT_K_STD,
    GATED_METRICS,
    default_baseline_path,
    final_metrics,
    load_baseline,
)

RECIPE = "ci"
FALSE_FAIL_TARGET = 0.01


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        seeds.extend(range(int(lo), int(hi or lo) + 1))
    return seeds


def finished(folder: Path) -> dict[str, float] | None:
    """The run's final metrics if it evaluated at the recipe's last step, else None."""
    try:
        metrics = final_metrics(folder)
    except (FileNotFoundError, ValueError):
        return None
    return metrics if metrics["step"] == get_recipe(RECIPE).train.steps else None


def cmd_train(args: argparse.Namespace) -> int:
    todo = [s for s in args.seeds if finished(args.out / f"ci-s{s}") is None]
    print(f"seeds to train: {todo}", flush=True)
    jobs, folders = [], {}
    for seed in todo:
        folder = folders[f"seed {seed}"] = args.out / f"ci-s{seed}"
        shutil.rmtree(folder, ignore_errors=True)  # a seed cut short starts over
        folder.mkdir(parents=True)
        argv = (sys.executable, "-m", "mrcnn.cli", "train", "--recipe", RECIPE, "--seed", str(seed),
                "--out", str(folder), "--threads", "1", "--no-progress")
        jobs.append(Job(f"seed {seed}", argv, args.out / f"ci-s{seed}.log"))

    def ended(job: Job, code: int) -> bool:
        folder = folders[job.label]
        if code == 0 and finished(folder):
            print(f"{job.label}: done {finished(folder)}", flush=True)
            return True
        print(f"{job.label}: exit {code} (see {job.log})", flush=True)
        return False

    return run_jobs(jobs, args.parallel, ended)


def error_rates(values: list[float], tol: float) -> dict[str, float]:
    """The false-fail rate and the drop caught 95% of the time at tolerance ``tol``, with the false
    fail's 95% interval from the sd's: the true sd lies in s * sqrt((n - 1) / chi2) for chi2 the
    0.975 and 0.025 quantiles with n - 1 degrees of freedom, and the rate (normal model, mean known
    to s / sqrt(n)) is monotone in it."""
    n, s = len(values), statistics.stdev(values)
    scale = s * math.sqrt(1 + 1 / n)
    sd_lo, sd_hi = (s * math.sqrt((n - 1) / float(stats.chi2.ppf(q, n - 1))) for q in (0.975, 0.025))
    return {"tolerance": tol, "false_fail": float(stats.t.cdf(-tol / scale, n - 1)),
            "false_fail_ci95": [float(stats.norm.cdf(-tol / (sd * math.sqrt(1 + 1 / n)))) for sd in (sd_lo, sd_hi)],
            "caught_drop_95": tol + float(stats.t.ppf(0.95, n - 1)) * scale}


def cmd_summary(args: argparse.Namespace) -> int:
    runs = {s: finished(args.out / f"ci-s{s}") for s in args.seeds}
    have = {s: m for s, m in runs.items() if m is not None}
    if len(have) < 3:
        print(f"only {len(have)} finished seeds in {args.out}: need 3 or more", file=sys.stderr)
        return 2
    baseline = load_baseline(args.baseline or default_baseline_path(RECIPE), RECIPE)
    report: dict[str, dict] = {"seeds": sorted(have), "per_metric": {}}
    lines = [f"# The accuracy gate's error rates ({RECIPE} recipe, {len(have)} seeds: {sorted(have)})", "",
             "Model: a CI run of an unchanged model is one more draw from the seeds' distribution; the gate",
             "fails when it is below mean - tol. Student's t predictive with n - 1 degrees of freedom",
             "(the mean and std are themselves estimated from the n seeds). "
        "`python bench/studies/accuracy_gate_flake/accuracy_flake.py summary`.",
             "The false fail's 95% interval comes from the chi-square interval of the seeds' sd.",
             "", "| metric | mean | std | min | max | Shapiro-Wilk p | rule | tolerance | false fail "
             "| its 95% CI | drop caught 95% |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in GATED_METRICS:
        values = [float(have[s][name]) for s in sorted(have)]
        n, mean, std = len(values), statistics.fmean(values), statistics.stdev(values)
        current = error_rates(values, max(DEFAULT_K_STD * std, DEFAULT_FLOOR))
        committed = error_rates(values, baseline[name].tolerance)
        target = error_rates(values, float(stats.t.ppf(1 - FALSE_FAIL_TARGET, n - 1)) * std * math.sqrt(1 + 1 / n))
        shapiro = float(stats.shapiro(values).pvalue)
        report["per_metric"][name] = {"values": dict(zip(map(str, sorted(have)), values)), "mean": mean, "std": std,
                                      "shapiro_p": shapiro, "rule_max_3std_floor": current,
                                      "committed_tolerance": committed, "false_fail_1pct": target}
        for label, r in ((f"committed ({baseline[name].tolerance:.4f})", committed),
                         (f"max(3 std, {DEFAULT_FLOOR:g}) over these seeds", current),
                         ("false fail held at 1%", target)):
            lines.append(f"| {name} | {mean:.4f} | {std:.4f} | {min(values):.4f} | {max(values):.4f} | {shapiro:.2f} "
                         f"| {label} | {r['tolerance']:.4f} | {r['false_fail']:.2%} "
                         f"| {r['false_fail_ci95'][0]:.2%} to {r['false_fail_ci95'][1]:.2%} "
                         f"| {r['caught_drop_95']:.4f} |")
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "flake.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.results / "flake.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("train", "summary"))
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("0-9"))
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("out/acc10"))
    parser.add_argument("--results", type=Path, default=Path("results/accuracy"),
                        help="where flake.md and flake.json go (default: %(default)s, the evidence)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="the accuracy baseline read (default: baselines/accuracy/ci.json, as the gate)")
    args = parser.parse_args()
    return cmd_train(args) if args.what == "train" else cmd_summary(args)


if __name__ == "__main__":
    sys.exit(main())
