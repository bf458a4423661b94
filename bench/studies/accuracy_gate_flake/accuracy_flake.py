"""The accuracy gate's false-fail rate per host kind, and the smallest drop it catches, from seeds x kinds.

    python bench/studies/accuracy_gate_flake/accuracy_flake.py train [--seeds 0-9] [--isa AVX2] [--parallel 2]
        [--out out/acc10]
    python bench/studies/accuracy_gate_flake/accuracy_flake.py summary [--out out/acc10] [--extra DIR ...]
        [--stored-runs] [--results results/accuracy] [--baseline baselines/accuracy/ci.json]

``train`` runs ``mrcnn train --recipe ci --seed S --threads 1`` for each seed whose run folder has no
evaluation at the recipe's last step yet, ``--parallel`` at a time (one thread each, as the gate
trains), and records each run's host kind beside it (``host.json``: the CPU, and ``--isa``, a cap on
oneDNN's instruction set that makes this host run the kernels of a host without the wider ones).
Folders: ``OUT/ci-sS``, or ``OUT/ci~avx2-sS`` under ``--isa AVX2``. Rerun it after an interruption
and it starts only what is missing (a run cut short starts over: its folder is emptied).

``summary`` reads every finished run under ``--out`` (and the ``--extra`` folders: runs of other
hosts, each with its ``host.json``), with ``--stored-runs`` also the runs the baseline file holds
(those whose folders are gone: a folder of the same kind and seed wins), groups them by host kind,
and writes ``RESULTS/flake.md`` and ``RESULTS/flake.json``: per metric the tolerance of the baseline rule
(:func:`~mrcnn_bench.gates.accuracy_baseline.tolerance_across_kinds`) and of the committed baseline,
and per kind the gate's two error rates "fail when a CI run's AP < mean - tol":

- false fail: an unchanged model's CI run on kind k is one more draw from that kind's runs, whose
  mean m and sd s are estimated from its n runs, so ``(x - m) / (s * sqrt(1 + 1/n))`` follows
  Student's t with n - 1 degrees of freedom: P(fail) = t_cdf((threshold - m) / (s * sqrt(1 + 1/n))).
  Its upper 95% bound (:func:`~mrcnn_bench.gates.accuracy_baseline.false_fail_upper_bound`) takes the
  kind's true mean at its lower 97.5% bound and its true sd at its upper 97.5% bound (the chi-square
  interval) together, so the pair is covered at 95% or more;
- the smallest reliably caught drop: the drop d of the kind's true AP at which a CI run fails with
  probability 0.95: d = (m - threshold) + t_0.95 * s * sqrt(1 + 1/n).

Kinds measured on the same seeds are also compared seed by seed (paired t-test): a machine that
shifts the level, not only the trajectory, shows there. The normal model is checked per kind with
Shapiro-Wilk (reported; with 10 runs it can only reject gross departures).
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

from studies.training_runs import Job, parse_seeds, run_jobs

from mrcnn.recipes import get_recipe
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.gates.accuracy_baseline import (
    DEFAULT_FLOOR,
    DEFAULT_K_STD,
    FALSE_FAIL_BOUND,
    FALSE_FAIL_TARGET,
    GATED_METRICS,
    ISA_ENV,
    baseline_runs,
    default_baseline_path,
    false_fail_upper_bound,
    final_metrics,
    host_kind,
    host_record,
    load_baseline,
    read_host,
    run_name_seed,
    tolerance_across_kinds,
    write_host,
)

RECIPE = "ci"
ISAS = ("AVX2", "AVX512_CORE", "AVX", "SSE41")  # oneDNN's names for the caps a host kind may stand for
THREADS = 1  # as the gate trains (mrcnn-bench gate --accuracy-threads)


def folder_of(out: Path, seed: int, isa: str = "") -> Path:
    return out / f"{RECIPE}{'~' + isa.lower() if isa else ''}-s{seed}"


def finished(folder: Path) -> dict[str, float] | None:
    """The run's final metrics if it evaluated at the recipe's last step, else None."""
    try:
        metrics = final_metrics(folder)
    except (FileNotFoundError, ValueError):
        return None
    return metrics if metrics["step"] == get_recipe(RECIPE).train.steps else None


def cmd_train(args: argparse.Namespace) -> int:
    todo = [s for s in args.seeds if finished(folder_of(args.out, s, args.isa)) is None]
    print(f"seeds to train{' under ' + ISA_ENV + '=' + args.isa if args.isa else ''}: {todo}", flush=True)
    # The cap goes on the child's command line: oneDNN reads it once, at its first call.
    prefix = ("env", f"{ISA_ENV}={args.isa}") if args.isa else ()
    jobs, folders = [], {}
    for seed in todo:
        folder = folders[f"seed {seed}"] = folder_of(args.out, seed, args.isa)
        shutil.rmtree(folder, ignore_errors=True)  # a seed cut short starts over
        write_host(folder, host_record(threads=THREADS, isa=args.isa))
        argv = (*prefix, sys.executable, "-m", "mrcnn.cli", "train", "--recipe", RECIPE, "--seed", str(seed),
                "--out", str(folder), "--threads", str(THREADS), "--no-progress")
        jobs.append(Job(f"seed {seed}", argv, folder.with_suffix(".log")))

    def ended(job: Job, code: int) -> bool:
        folder = folders[job.label]
        if code == 0 and finished(folder):
            print(f"{job.label}: done {finished(folder)}", flush=True)
            return True
        print(f"{job.label}: exit {code} (see {job.log})", flush=True)
        return False

    return run_jobs(jobs, args.parallel, ended)


def collect(folders: list[Path]) -> dict[str, dict[int, dict[str, float]]]:
    """Host kind -> seed -> final metrics, of every finished run folder (``<name>-s<seed>`` with a host record).

    A run under one of the gate's faults (``NAME@FAULT-sS``, as the ci_recipe study names them) is
    no draw of the unchanged model, and a run that ended at another step than the recipe's is
    another schedule: both are left out.
    """
    kinds: dict[str, dict[int, dict[str, float]]] = {}
    for base in (f for f in folders if f.is_dir()):
        for folder in sorted(p for p in base.iterdir() if p.is_dir()):
            named = run_name_seed(folder)
            if named is None or "@" in named[0]:
                continue
            host, metrics = read_host(folder), finished(folder)
            if host is None or metrics is None:
                continue
            kinds.setdefault(host_kind(host), {})[named[1]] = metrics
    return kinds


def kind_rates(values: list[float], threshold: float) -> dict[str, float | list[float]]:
    """The false-fail rate of one kind's runs at ``threshold``, its upper 95% bound, and the caught drop."""
    n, m, s = len(values), statistics.fmean(values), statistics.stdev(values)
    scale = s * math.sqrt(1 + 1 / n)
    return {"runs": n, "mean": m, "std": s, "min": min(values), "max": max(values),
            "shapiro_p": float(stats.shapiro(values).pvalue) if n >= 3 else float("nan"),
            "false_fail": float(stats.t.cdf((threshold - m) / scale, n - 1)),
            "false_fail_upper95": false_fail_upper_bound(values, threshold),
            "caught_drop_95": (m - threshold) + float(stats.t.ppf(0.95, n - 1)) * scale}


def paired(kinds: dict[str, dict[int, dict[str, float]]], name: str) -> list[dict]:
    """Each pair of kinds with 3 or more seeds in common: the mean difference and a paired t-test's p."""
    rows, names = [], sorted(kinds)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            common = sorted(kinds[a].keys() & kinds[b].keys())
            if len(common) < 3:
                continue
            xa, xb = ([kinds[k][s][name] for s in common] for k in (a, b))
            diff = statistics.fmean(x - y for x, y in zip(xa, xb))
            rows.append({"a": a, "b": b, "seeds": len(common), "mean_diff": diff,
                         "p": float(stats.ttest_rel(xa, xb).pvalue)})
    return rows


def cmd_summary(args: argparse.Namespace) -> int:
    kinds = collect([args.out, *args.extra])
    baseline_path = args.baseline or default_baseline_path(RECIPE)
    if args.stored_runs:
        for run in baseline_runs(baseline_path, RECIPE):
            kinds.setdefault(run.kind, {}).setdefault(run.seed, run.metrics)
    total = sum(len(v) for v in kinds.values())
    if total < 3:
        print(f"only {total} finished runs with a host record in {args.out}: need 3 or more", file=sys.stderr)
        return 2
    committed = load_baseline(baseline_path, RECIPE)
    report: dict = {"recipe": RECIPE, "kinds": {k: sorted(v) for k, v in kinds.items()}, "per_metric": {}}
    lines = [f"# The accuracy gate's error rates per host kind ({RECIPE} recipe, {total} runs)", "",
             "`python bench/studies/accuracy_gate_flake/accuracy_flake.py summary`. A CI run on a kind is one more",
             "draw from that kind's runs: Student's t predictive with n - 1 degrees of freedom. The upper bound takes",
             "the kind's mean at its lower 97.5% bound and its sd at its upper 97.5% bound together. A kind with fewer",
             "than 3 runs has no rate.", "", "Runs per kind (seeds):", ""]
    lines += [f"- {kind}: {len(seeds)} ({', '.join(map(str, sorted(seeds)))})" for kind, seeds in sorted(kinds.items())]
    for name in GATED_METRICS:
        by_kind = {k: [v[s][name] for s in sorted(v)] for k, v in sorted(kinds.items())}
        everything = [x for vs in by_kind.values() for x in vs]
        mean = statistics.fmean(everything)
        rule = tolerance_across_kinds(by_kind, DEFAULT_K_STD, DEFAULT_FLOOR, FALSE_FAIL_TARGET)
        settings = {"rule over these runs": (mean, rule),
                    "committed baseline": (committed[name].mean, committed[name].tolerance)}
        entry: dict = {"mean": mean, "std": statistics.stdev(everything), "settings": {}, "paired": paired(kinds, name)}
        lines += ["", f"## {name}", "",
                  f"All {len(everything)} runs: mean {mean:.4f}, sd {entry['std']:.4f}. The rule's tolerance "
                  f"(max of {DEFAULT_FLOOR:g}, {DEFAULT_K_STD:g} sd of all runs, each kind's room for a "
                  f"{FALSE_FAIL_TARGET:.0%} false fail with an upper 95% bound of {FALSE_FAIL_BOUND:.0%}): "
                  f"{rule:.4f}.", "",
                  "| setting | threshold | kind | runs | mean | sd | min | max | Shapiro-Wilk p | false fail "
                  "| upper 95% | drop caught 95% |", "|" + " --- |" * 12]
        for label, (base_mean, tol) in settings.items():
            threshold = base_mean - tol
            per_kind = {}
            for kind, vs in by_kind.items():
                if len(vs) < 3:
                    lines.append(f"| {label} | {threshold:.4f} | {kind} | {len(vs)} | {statistics.fmean(vs):.4f} "
                                 f"| | {min(vs):.4f} | {max(vs):.4f} | | (too few runs) | | |")
                    per_kind[kind] = {"runs": len(vs), "values": vs}
                    continue
                r = per_kind[kind] = kind_rates(vs, threshold)
                lines.append(f"| {label} | {threshold:.4f} | {kind} | {r['runs']} | {r['mean']:.4f} | {r['std']:.4f} "
                             f"| {r['min']:.4f} | {r['max']:.4f} | {r['shapiro_p']:.2f} | {r['false_fail']:.2%} "
                             f"| {r['false_fail_upper95']:.2%} | {r['caught_drop_95']:.4f} |")
            entry["settings"][label] = {"mean": base_mean, "tolerance": tol, "threshold": threshold, "kinds": per_kind}
        if entry["paired"]:
            lines += ["", "Kinds on the same seeds (paired t-test, difference a - b):", ""]
            lines += [f"- {p['a']} - {p['b']}: {p['mean_diff']:+.4f} over {p['seeds']} seeds, p = {p['p']:.2f}"
                      for p in entry["paired"]]
        report["per_metric"][name] = entry
    args.results.mkdir(parents=True, exist_ok=True)
    atomic_write(args.results / "flake.json", json.dumps(report, indent=1) + "\n")
    atomic_write(args.results / "flake.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("train", "summary"))
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("0-9"), help="train: N, N-M or a list")
    parser.add_argument("--isa", choices=ISAS, default="", help=f"train: cap oneDNN ({ISA_ENV}); default none")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("out/acc10"))
    parser.add_argument("--extra", type=Path, nargs="*", default=[],
                        help="summary: more folders of finished runs (other hosts'), each run with its host.json")
    parser.add_argument("--stored-runs", action="store_true",
                        help="summary: also the runs the baseline file holds whose folders are not here")
    parser.add_argument("--results", type=Path, default=Path("results/accuracy"),
                        help="where flake.md and flake.json go (default: %(default)s, the evidence)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="the accuracy baseline read (default: baselines/accuracy/ci.json, as the gate)")
    args = parser.parse_args()
    return cmd_train(args) if args.what == "train" else cmd_summary(args)


if __name__ == "__main__":
    sys.exit(main())
