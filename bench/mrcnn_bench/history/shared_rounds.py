"""A commit's inference cases timed against one ruler in the same rounds, in one process, with stages.

``python -m mrcnn_bench.history.shared_rounds OUT.json --cases A,B,... [--budget-s S | --rounds N] [--probes]``
builds the ruler (torchvision eager, :mod:`mrcnn_bench.history.ruler`) and every case on the quick workload
with the ruler's images, times each case's first call (compilation included: its time to first
result), calls every distinct input once more so that no compilation can fall in a timed round, then
runs rounds of one ruler call and one call of each case, the order rotated from round to round
(:func:`mrcnn_bench.base.timing.schedule`, ``"rotate"``). A case's ratio in a round is its time over the
ruler's in that round: one ruler call serves every case of the round, which is what makes this
cheaper than a process and a ruler per case (:mod:`mrcnn_bench.history.interleaved`, still used for the
training step, whose ruler is a training step).

Stages: the eager cases (their model is the ruler's class or has its module names: ``backbone``,
``rpn``, ``roi_heads`` and the heads inside) are timed stage by stage with forward hooks
(:func:`mrcnn_bench.running.stages.metered`), and so is the ruler, in the same calls that are timed whole;
each stage's ratio is the case's stage time over the ruler's same stage in the same round. A
compiled case has no modules to hook: its figure is the whole call only.

With ``--probes`` the process also measures each case's peak memory over its calls after the rounds
and its FLOPs per call; a commit's first process does, the others leave them out (they do not
change from process to process, and each costs a pass over the images per case). The peak is the
process's resident peak over that case's calls, with every case's model resident: a figure to follow
across commits, not one case's footprint alone.

Output: a JSON object: ``"timing"``, case name -> :class:`mrcnn_bench.history.interleaved.CaseRecord`;
``"compiles"``, case name -> the compile probe's record (with ``--compile-probe``, else empty).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mrcnn_bench.base import timing
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.history.commit import compiled
from mrcnn_bench.history.interleaved import (
    CaseRecord,
    case_record,
    check_request,
    memory_and_flops,
    rounds_for,
    ruler_context,
)
from mrcnn_bench.running.cases import CASES, QUICK_WORKLOAD, Case

# Seconds of timed rounds of one process run by hand; a commit's measurement passes its own
# (mrcnn_bench.history.commit.SHARED_BUDGET_S: why, and the rounds it buys, in results/asv/README.md).
DEFAULT_BUDGET_S = 20.0
MIN_ROUNDS, MAX_ROUNDS = 5, 200
RULER = "ruler"


def _stage_ratio(case: Sequence[float], ruler: Sequence[float]) -> float:
    """Median over rounds of case / ruler for one stage; NaN where the ruler's stage took no time."""
    ratios = [c / r for c, r in zip(case, ruler, strict=True) if r > 0]
    return statistics.median(ratios) if ratios else math.nan


def measure_shared(
    case_names: Sequence[str], rounds: int | None = None, threads: int | None = None,
    budget_s: float = DEFAULT_BUDGET_S, probes: bool = True, first_results: dict[str, float] | None = None,
) -> dict[str, CaseRecord]:
    """Time the inference cases ``case_names`` against one ruler in shared rounds (module docstring).

    ``first_results``: case -> seconds of a first call made before this (the compile probe's, cold),
    which is then that case's time to first result instead of its first call here (which finds what
    the probe compiled).
    """
    # Imported here: they import the commit's mrcnn, and `--help` should not wait for torch.
    import contextlib

    from mrcnn_bench.history.ruler import Ruler
    from mrcnn_bench.running.cases import Row
    from mrcnn_bench.running.pipelines import Pipeline
    from mrcnn_bench.running.stages import STAGE_KEYS, by_stage, metered

    check_request(case_names, rounds, phase="inference")
    threads, workload, ctx = ruler_context(threads, training=False)
    ruler = Ruler("inference")
    pipelines: dict[str, Pipeline] = {}
    first: dict[str, float] = {}
    for name in case_names:
        pipelines[name] = Pipeline(Row(CASES[name]), ctx)
        pipelines[name].setup()
        first[name], _ = timing.timed(pipelines[name].call, 0)
    calls: dict[str, Callable[[int], Any]] = {RULER: ruler.call, **{n: p.call for n, p in pipelines.items()}}
    warm = [sum(timing.timed(call, index)[0] for call in calls.values()) for index in range(1, workload.images + 1)]
    rounds = rounds or rounds_for(statistics.median(warm), budget_s, MIN_ROUNDS, MAX_ROUNDS)

    hooked = {RULER: ruler.model, **{n: p.model for n, p in pipelines.items() if staged(CASES[n])}}
    sums: dict[str, dict[str, float]] = {name: {} for name in hooked}
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    stages: dict[str, dict[str, list[float]]] = {name: {k: [] for k in STAGE_KEYS.values()} for name in hooked}
    load_before = os.getloadavg()[0]
    with contextlib.ExitStack() as stack:
        for name, model in hooked.items():
            stack.enter_context(metered(model, timing.clock, sums[name]))
        for _, name, s, _ in timing.timed_rounds(calls, "rotate", rounds, pass_round=True):
            seconds[name].append(s)
            if name in hooked:
                for label, value in by_stage({**sums[name], "total": s}).items():
                    stages[name][STAGE_KEYS[label]].append(value)
                sums[name].clear()
    load = (load_before, os.getloadavg()[0])

    records = {}
    for name, pipeline in pipelines.items():
        peak, flops = memory_and_flops(pipeline, workload.images, ctx, flops=True) if probes else (math.nan, None)
        own = stages.get(name, {})
        records[name] = case_record(
            name, CASES[name].phase, threads, workload.batch_size, seconds[name], seconds[RULER],
            (first_results or {}).get(name, first[name]), peak, flops, load, stage_s=own,
            ruler_stage_s=stages[RULER] if own else {},
            stage_ratio_median={k: _stage_ratio(v, stages[RULER][k]) for k, v in own.items()},
        )
    return records


def staged(case: Case) -> bool:
    """Whether a case is timed stage by stage: eager CPU/CUDA models run their stage modules'
    ``forward``; compiled ones do not."""
    return case.compiler == "eager" and case.backend != "xla"


def _names(text: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']: a comma list of case names."""
    return [n.strip() for n in text.split(",") if n.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mrcnn_bench.history.shared_rounds", description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="the records are written here as JSON (case -> record)")
    parser.add_argument("--cases", required=True, help="comma-separated inference cases, e.g. static/eager,static/xla")
    how_many = parser.add_mutually_exclusive_group()
    how_many.add_argument(
        "--budget-s", type=float, default=DEFAULT_BUDGET_S,
        help=f"seconds of timed rounds, {MIN_ROUNDS} to {MAX_ROUNDS} rounds (default {DEFAULT_BUDGET_S:g})",
    )
    how_many.add_argument("--rounds", type=int, default=None, help="exactly this many timed rounds")
    parser.add_argument(
        "--threads", type=int, default=None, help="intra-op threads (default: the CPUs this process may use)"
    )
    parser.add_argument("--probes", action="store_true", help="also peak memory and FLOPs per case (after the rounds)")
    parser.add_argument(
        "--probe-cases", default=None,
        help="with --compile-probe: the compiled cases to probe, timed here or not (default: those of --cases)",
    )
    parser.add_argument(
        "--compile-probe", action="store_true",
        help="first, before any case is built, the compile probe of each compiled case (its counters, and "
             "its first call as the case's time to first result)",
    )
    args = parser.parse_args(argv)
    names = _names(args.cases)
    try:
        probe_names = names if args.probe_cases is None else _names(args.probe_cases)
        compiles = compile_probes(probe_names) if args.compile_probe else {}
        first = {n: r["first_call_s"] for n, r in compiles.items() if r.get("first_call_s") is not None and n in names}
        records = measure_shared(names, args.rounds, args.threads, args.budget_s, args.probes, first)
    except (ValueError, NotImplementedError) as e:
        print(f"mrcnn_bench.history.shared_rounds: {e}", file=sys.stderr)
        return 2
    from mrcnn_bench.gates.compile_probe import jsonable  # compile_probe loads torch: --help should not wait for it

    out = {"timing": {n: r.to_dict() for n, r in records.items()}, "compiles": compiles}
    atomic_write(args.out, json.dumps(out, indent=1, default=jsonable))
    return 0


def compile_probes(case_names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """:func:`mrcnn_bench.gates.compile_probe.measure_case` of each compiled case among ``case_names``, in
    this process and before anything else is built: each backend's counters are then the probe's own
    (XLA's count process-wide; only the XLA case uses XLA here, only the inductor case dynamo), and
    the first call of each size is cold, so the counts are those of a fresh process."""
    from mrcnn_bench.gates.compile_probe import measure_case  # loads torch and the commit's mrcnn: not for --help

    probed = [n for n in case_names if n in CASES and CASES[n].skip_reason() is None and compiled(n)]
    return {n: measure_case(n, QUICK_WORKLOAD.preset) for n in probed}


if __name__ == "__main__":
    sys.exit(main())
