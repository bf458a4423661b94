"""How often does ``mrcnn-bench steps`` find a 2, 3 or 5% step, and how often does it flag noise?

    python bench/studies/change_point_power/change_point_power.py [--aa results/asv/aa_pooled/spread.csv]
        [--histories 1000] [--commits 20] [--steps 0,0.02,0.03,0.05] [--seed 0] [--out results/change_points]

A simulation from measured noise: for each tracked ratio of an A/A study (one commit measured N
times: ``spread.csv`` of ``make asv-spread``), each history is ``--commits`` values drawn with
replacement from that ratio's N measured values, times ``1 + step`` from a commit drawn uniformly
among those at least 3 from either end. All histories go through the method of
:mod:`mrcnn_bench.changes.changepoints` with its fixed settings, unchanged. A step is found when a
regression change point lies within one commit of it; every other change point is a false one.
Power is given with its 95% Wilson interval, false change points per 100 commits with an exact
Poisson interval. Seeded: the same arguments give the same table.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np
from scipy import stats

from mrcnn_bench.changes import changepoints

MARGIN = 3  # a step starts at least this many commits from either end
NEAR = 1  # found: a regression change point within this many commits of the step


def aa_ratios(path: Path) -> dict[str, list[float]]:
    """case -> its measured ratios, from the ``<case> ratio`` rows of an A/A ``spread.csv``."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    runs = [k for k in rows[0] if k.startswith("run ")]
    return {r["figure"].removesuffix(" ratio"): [float(r[k]) for k in runs] for r in rows
            if r["figure"].endswith(" ratio")}  # fmt: skip


def poisson_ci(k: int, exposure: float) -> tuple[float, float]:
    """Exact 95% interval of a rate from ``k`` events in ``exposure`` units."""
    low = stats.chi2.ppf(0.025, 2 * k) / 2 if k else 0.0
    return low / exposure, stats.chi2.ppf(0.975, 2 * k + 2) / 2 / exposure


def simulate(values: list[float], step: float, histories: int, commits: int, rng: np.random.Generator) -> dict:
    """Power and false change points of the method on ``histories`` resampled histories."""
    at = rng.integers(MARGIN, commits - MARGIN + 1, size=histories)
    series = {}
    for h in range(histories):
        v = rng.choice(values, size=commits, replace=True)
        v[at[h]:] *= 1 + step
        series[f"h{h}"] = ([str(i) for i in range(commits)], [float(x) for x in v])
    points = changepoints.find(series)
    found, false = 0, 0
    by_history: dict[str, list] = {}
    for p in points:
        by_history.setdefault(p.metric, []).append(p)
    for h in range(histories):
        hits = [p for p in by_history.get(f"h{h}", []) if step and p.direction == "regression"
                and abs(p.index - at[h]) <= NEAR]  # fmt: skip
        found += bool(hits)
        false += len(by_history.get(f"h{h}", [])) - min(len(hits), 1)
    out = {"step": step, "histories": histories, "commits": commits, "false_change_points": false,
           "false_per_100_commits": 100 * false / (histories * commits),
           "false_per_100_ci95": [100 * x for x in poisson_ci(false, histories * commits)]}  # fmt: skip
    if step:
        ci = stats.binomtest(found, histories).proportion_ci(confidence_level=0.95, method="wilson")
        out.update(found=found, power=found / histories, power_ci95=[ci.low, ci.high])
    return out


def markdown(rows: list[dict], command: str, aa: Path) -> str:
    settings = ", ".join(f"{k} {v:g}" for k, v in changepoints.SETTINGS.items())
    lines = [f"# Change points found and false ones, by simulation from A/A noise\n\n`{command}`\n",
             f"Method: `mrcnn-bench steps` (Apache Otava, {settings}), unchanged. Noise: each history draws "
             f"its values with replacement from the A/A ratios of `{aa}`; a step multiplies the values from a "
             f"commit at least {MARGIN} from either end; found = a regression change point within {NEAR} commit "
             "of it. Intervals: 95%, Wilson for power, exact Poisson for the false rate.\n",
             "| case | A/A values | cv | step | histories | power | 95% CI | false per 100 commits | 95% CI |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        power = "-" if not r["step"] else f"{r['power']:.3f}"
        pci = "-" if not r["step"] else f"{r['power_ci95'][0]:.3f}-{r['power_ci95'][1]:.3f}"
        fci = r["false_per_100_ci95"]
        lines.append(f"| {r['case']} | {r['aa_values']} | {r['cv']:.4f} | {100 * r['step']:g}% | {r['histories']} | "
                     f"{power} | {pci} | {r['false_per_100_commits']:.3f} | {fci[0]:.3f}-{fci[1]:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aa", type=Path, default=Path("results/asv/aa_pooled/spread.csv"))
    parser.add_argument("--histories", type=int, default=1000)
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--steps", default="0,0.02,0.03,0.05")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/change_points"))
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    rows = []
    for case, values in aa_ratios(args.aa).items():
        cv = float(np.std(values, ddof=1) / np.mean(values))
        for step in (float(s) for s in args.steps.split(",")):
            row = {"case": case, "aa_values": len(values), "cv": cv,
                   **simulate(values, step, args.histories, args.commits, rng)}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    command = " ".join(["python bench/studies/change_point_power/change_point_power.py", *(argv or sys.argv[1:])])
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"power_{args.aa.parent.name}"
    (args.out / f"{stem}.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    (args.out / f"{stem}.md").write_text(markdown(rows, command, args.aa))
    print(markdown(rows, command, args.aa))
    return 0


if __name__ == "__main__":
    sys.exit(main())
