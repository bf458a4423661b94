"""A/A spread of the tracked figures: the same commit measured N times, as asv measures each commit.

    mrcnn-bench asv spread [--runs 3] [--out results/asv/aa]

Each run is :func:`mrcnn_bench.history.commit.measure_commit` on this checkout (the shared rounds with the
compile probes, the training step, the fixed-checkpoint AP; its wall time as ``measurement wall_s``),
written to ``OUT/run_K.json`` as soon as it ends; a run whose file exists is not measured again, so
the study resumes where it stopped. Each run also records its plan (how it was measured, on which
CPU); a folder holding runs of another plan (another method, process plan or host kind, or runs from
before plans were recorded) is refused, so that a study never pools two kinds of runs.
Then ``OUT/spread.csv`` and ``OUT/spread.md`` give, per figure, the values of every run and their
spread ``(max - min) / median``: the ratios to the ruler next to the raw seconds they cancel.
Run it on an otherwise idle machine, never beside another measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from mrcnn.flags import bounded
from mrcnn.progress import progress
from mrcnn_bench.base import timing
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.files import atomic_write, read_json
from mrcnn_bench.history.asv_machine import cpu_label
from mrcnn_bench.history.commit import COMPILED_FROM, COUNTERS, SHARED_PROCESSES, measure_commit

METHOD = "shared-rounds"  # how measure_commit times a commit; a run of another method is another study

# Per-case figures of the timing record: (column, record key).
FIGURES = (
    ("ratio", "ratio_median"),
    ("seconds", "seconds_median"),
    ("ruler_seconds", "ruler_seconds_median"),
    ("first_result_s", "first_result_s"),
    ("peak_memory_gb", "peak_memory_gb"),
    ("load", "loadavg_after"),
)


def rows_of(run: int, record: dict) -> list[dict]:
    """Long-format rows (run, figure, value) of one run's CommitRecord dict."""
    rows = []
    for case, part in record["timing"].items():
        if part["record"]:
            rows += [{"run": run, "figure": f"{case} {name}", "value": part["record"][key]} for name, key in FIGURES]
            rows += [{"run": run, "figure": f"{case} stage {k}", "value": v}
                     for k, v in part["record"].get("stage_ratio_median", {}).items()]
            stage_s = part["record"].get("stage_s", {})
            if stage_s.get("total"):  # do the stages' medians add up to the median call?
                parts = sum(statistics.median(v) for k, v in stage_s.items() if k != "total")
                rows.append({"run": run, "figure": f"{case} stage medians / call median",
                             "value": parts / statistics.median(stage_s["total"])})
    for case, part in record["compiles"].items():
        if part["record"]:
            rows += [
                {"run": run, "figure": f"{case} {k}", "value": v}
                for k, v in part["record"].items()
                if k in COUNTERS.values()
            ]
    if "wall_s" in record:
        rows.append({"run": run, "figure": "measurement wall_s", "value": record["wall_s"]})
    if record["accuracy"]["record"]:
        acc = record["accuracy"]["record"]
        rows += [
            {"run": run, "figure": "1 - box AP", "value": 1 - acc["box_ap"]},
            {"run": run, "figure": "1 - mask AP", "value": 1 - acc["mask_ap"]},
        ]
    return rows


def summarise(out: Path) -> pd.DataFrame:
    runs = sorted(out.glob("run_*.json"), key=lambda p: int(p.stem.removeprefix("run_")))  # run_10 after run_9
    rows = [r for k, path in enumerate(runs, 1) for r in rows_of(k, read_json(path, "an A/A run record", dict))]
    table = pd.DataFrame(rows).pivot(index="figure", columns="run", values="value")
    table.columns = [f"run {c}" for c in table.columns]
    values = table.to_numpy()
    table["median"] = table.median(axis=1)
    table["spread"] = (values.max(axis=1) - values.min(axis=1)) / table["median"]
    # The range grows with the number of runs; the coefficient of variation does not, so A/A studies
    # of different sizes compare on it.
    with np.errstate(invalid="ignore", divide="ignore"):  # counts that are 0 in every run: no cv, NaN
        table["cv"] = values.std(axis=1, ddof=1) / values.mean(axis=1) if values.shape[1] > 1 else np.nan
    table.to_csv(out / "spread.csv", float_format="%.6g")
    (out / "spread.md").write_text(
        f"# A/A spread over {len(runs)} runs of one commit (spread = (max - min) / median; cv = standard "
        "deviation / mean)\n\n"
        + table.to_markdown(floatfmt=".4g")
        + "\n"
    )
    return table


def this_plan(processes: int, compiled_from: int) -> dict[str, object]:
    """What a run of this study is: the method, its process plan, and the host kind it runs on."""
    return {"method": METHOD, "processes": processes, "compiled_from": compiled_from, "cpu": cpu_label(),
            "cores": os.cpu_count()}


def other_plans(out: Path, plan: dict[str, object]) -> list[str]:
    """The run files in ``out`` whose plan is not ``plan`` (runs without one predate plans)."""
    found = []
    for path in sorted(out.glob("run_*.json")):
        try:
            theirs = read_json(path, "an A/A run record", dict).get("plan")
        except (OSError, UsageError):
            theirs = "unreadable"
        if theirs != plan:
            found.append(f"{path.name}: {theirs or 'no plan recorded'}")
    return found


def build_parser(prog: str = "mrcnn-bench asv spread") -> argparse.ArgumentParser:
    """``mrcnn-bench asv spread``'s arguments."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=bounded(int, 2), default=3, help="runs of the same commit (default 3)")
    parser.add_argument("--out", type=Path, default=Path("results/asv/aa"), help="default results/asv/aa")
    parser.add_argument("--processes", type=bounded(int, 1), default=SHARED_PROCESSES,
                        help=f"shared-rounds processes per run, pooled (default: the suite's, {SHARED_PROCESSES})")
    parser.add_argument("--compiled-from", type=bounded(int, 0), default=COMPILED_FROM,
                        help="the first shared process that times inductor; 0 is the one that ran its compile "
                             f"probe (default: the suite's, {COMPILED_FROM})")
    return parser


def main(argv: list[str] | None = None, prog: str = "mrcnn-bench asv spread") -> int:
    args = build_parser(prog).parse_args(argv)
    plan = this_plan(args.processes, args.compiled_from)
    others = other_plans(args.out, plan)
    if others:
        print(f"{prog}: {args.out} holds runs of another plan ({', '.join(others)}; this one: {plan}): "
              "give a new --out", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for k in progress(range(1, args.runs + 1), desc="A/A runs", unit="run"):
        path = args.out / f"run_{k}.json"
        if not path.exists():
            with timing.Stopwatch() as wall:
                record = measure_commit(processes=args.processes, compiled_from=args.compiled_from).to_dict()
            atomic_write(path, json.dumps({**record, "wall_s": wall.seconds, "plan": plan}, indent=1))
    print(summarise(args.out).to_string())
    return 0

