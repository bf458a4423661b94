"""Where the time goes: eager stage timings and FLOPs of the static and the torchvision model (``run --profile``).

The stages are those of :mod:`mrcnn_bench.running.stages`, marked by forward hooks on the modules
both models have by the same names. Eager CPU ops run synchronously, so timing a module's forward
with hooks is exact; a stage called several times per call is summed. The same hooks read exact
counters in a separate counted call (:mod:`mrcnn_bench.running.work_counters`: FLOPs, aten operators,
bytes written), so each stage's FLOPs divide its time into GFLOP/s, a fraction of the machine's
ceiling, and its operators and bytes say how much else it does.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mrcnn_bench.base import timing
from mrcnn_bench.running.cases import CASES, Row
from mrcnn_bench.running.context import Context
from mrcnn_bench.running.pipelines import Pipeline
from mrcnn_bench.running.stages import STAGE_KEYS, STAGES, by_stage, metered
from mrcnn_bench.running.work_counters import as_dict, count_stage_work

Runs = dict[str, tuple[torch.nn.Module, Callable[[], Any]]]  # name -> (model, one call)


def stage_times(
    runs: Runs, reps: int = 3, clock: Callable[[], float] = timing.clock
) -> dict[str, dict[str, float]]:
    """Median seconds per stage of :data:`STAGES`, per run, over ``reps`` interleaved calls (after one
    untimed call of each)."""
    per_rep: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    sums: dict[str, float] = {}
    with contextlib.ExitStack() as stack, torch.no_grad():
        for model, _ in runs.values():
            stack.enter_context(metered(model, clock, sums))
        for _, call in runs.values():
            call()
        for _, names in timing.schedule(list(runs), "fixed", reps):
            for name in names:
                call = runs[name][1]
                sums.clear()
                t0 = clock()
                call()
                sums["total"] = clock() - t0
                per_rep[name].append(by_stage(sums))
    return {run: {label: statistics.median(r[label] for r in reps_) for label, *_ in STAGES}
            for run, reps_ in per_rep.items()}


def stage_work(runs: Runs) -> dict[str, dict[str, dict[str, int]]]:
    """Run -> stage key of :data:`STAGE_KEYS` -> counter -> count, from one counted call of each
    (:func:`mrcnn_bench.running.work_counters.count_stage_work`)."""
    return {name: as_dict(count_stage_work(model, call)) for name, (model, call) in runs.items()}


def flops_by_label(work: dict[str, dict[str, dict[str, int]]]) -> dict[str, dict[str, float]]:
    """Run -> stage label of :data:`STAGES` -> FLOPs (2 per multiply-add; NMS and RoIAlign count
    none), from :func:`stage_work`: the run file's ``stage_flops``."""
    return {name: {label: float(stages[key]["flops"]) for label, key in STAGE_KEYS.items()}
            for name, stages in work.items()}


@dataclass(frozen=True)
class StageProfile:
    """``run --profile``'s figures, per implementation (``static``, ``torchvision``): the run file's
    ``stages``, ``stage_flops`` and ``stage_work``."""

    seconds: dict[str, dict[str, float]]  # implementation -> stage label -> median seconds (stage_times)
    flops: dict[str, dict[str, float]]  # implementation -> stage label -> FLOPs (flops_by_label)
    work: dict[str, dict[str, dict[str, int]]]  # implementation -> stage key -> counter -> count (stage_work)


def stage_profile(ctx: Context, reps: int = 3) -> StageProfile:
    """Seconds and exact work per stage of static/eager and torchvision/eager on the run's first call."""
    runs: Runs = {}
    for impl in ("static", "torchvision"):
        pipeline = Pipeline(Row(CASES[f"{impl}/eager"]), ctx)
        pipeline.setup()
        runs[impl] = (pipeline.model, lambda p=pipeline: p.call(0))
    seconds = stage_times(runs, reps)
    work = stage_work(runs)
    return StageProfile(seconds, flops_by_label(work), work)
