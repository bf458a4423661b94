"""One case timed against the ruler, round by round, in one process: what asv tracks across commits.

``python -m mrcnn_bench.history.interleaved CASE OUT.json [--budget-s S | --rounds N]`` builds the case
(the first call, compilation included, is its time to first result), calls every distinct input
once more with the ruler so that no compilation can fall in a timed round, then runs rounds of one
ruler call and one case call, alternating which goes first: as many rounds as fit in ``S`` seconds
at the pace of those warm-up calls (at least :data:`MIN_ROUNDS`, at most :data:`MAX_ROUNDS`), or
exactly ``N``. One call's time scatters by several percent on a shared machine whatever the load,
so a figure's precision comes from the number of rounds; a time budget gives short calls more.

The record holds every timed round, the median of the per-round ratios (case / ruler), the raw
medians, the peak memory of the case's own calls after warm-up, FLOPs per call and the load
average around the rounds.

Each case gets its own processes (:func:`mrcnn_bench.history.commit.measure_commit` starts several per
case and pools them with :func:`pool`), so no case's compiled code, caches or allocator state can
change another's numbers, and no one process's level decides a commit's figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mrcnn_bench.base import timing
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.files import atomic_write

# Why these: results/asv/README.md (A/A spread of the ratios over repeated runs of one commit).
DEFAULT_BUDGET_S = 40.0  # per case and commit, shared by its processes
MIN_ROUNDS, MAX_ROUNDS = 10, 200  # per process


@dataclass(frozen=True)
class CaseRecord:
    """What one case measured against the ruler. Seconds are per call (inference: one image;
    training: one step of ``images_per_call`` images)."""

    case: str
    phase: str
    rounds: int  # timed rounds: each figure below except the first result rests on this many samples
    threads: int
    images_per_call: int
    case_s: list[float]  # every timed round, in order: the figures below are computed from these
    ruler_s: list[float]
    ratio_median: float  # median over rounds of case seconds / ruler seconds (same round)
    ratio_q1: float
    ratio_q3: float
    seconds_median: float  # raw: drifts with the machine, kept for reference
    ruler_seconds_median: float
    first_result_s: float  # set-up excluded; the first call with its compilation
    peak_memory_gb: float  # over the case's calls after warm-up: peak RSS (CPU, XLA:CPU) or allocated (CUDA)
    flops: float | None  # per call, eager CPU model (FlopCounterMode); None for training
    loadavg_before: float
    loadavg_after: float
    processes: int = 1  # how many processes the rounds come from (pool)
    ratio_per_process: list[float] = field(default_factory=list)  # each process's median ratio
    # Eager cases timed with the ruler's stages (mrcnn_bench.history.shared_rounds): stage key -> seconds of
    # that stage in each timed round, the case's and the ruler's (same rounds as case_s and ruler_s),
    # and the median over rounds of their ratio (pooled: the median of the processes' medians).
    stage_s: dict[str, list[float]] = field(default_factory=dict)
    ruler_stage_s: dict[str, list[float]] = field(default_factory=dict)
    stage_ratio_median: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CaseRecord:
        """The record ``to_dict`` wrote (records from before pooling read as one process)."""
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


def pool(records: Sequence[CaseRecord]) -> CaseRecord:
    """Several processes' records of one case as one: the rounds of all of them, and as the figure
    the median of the processes' median ratios.

    A process draws a level of its own (where the allocator puts buffers, which cores its threads
    land on) that rounds within it cannot average away; the median over processes keeps one odd
    process from deciding a commit's figure. The first result is the first process's (the later
    ones may find compiled code in the inductor cache it filled).
    """
    if not records:
        raise ValueError("no records to pool")
    first, last = records[0], records[-1]
    if len({r.case for r in records}) != 1:
        raise ValueError(f"records of different cases: {sorted({r.case for r in records})}")
    case_s = [t for r in records for t in r.case_s]
    ruler_s = [t for r in records for t in r.ruler_s]
    per_process = [r.ratio_median for r in records]
    stage_keys = [k for k in first.stage_ratio_median if all(k in r.stage_ratio_median for r in records)]
    q1, _, q3 = quartiles([c / r for c, r in zip(case_s, ruler_s, strict=True)])
    return dataclasses.replace(
        first,
        rounds=len(case_s),
        case_s=case_s,
        ruler_s=ruler_s,
        ratio_median=statistics.median(per_process),
        ratio_q1=q1,
        ratio_q3=q3,
        seconds_median=statistics.median(r.seconds_median for r in records),
        ruler_seconds_median=statistics.median(r.ruler_seconds_median for r in records),
        peak_memory_gb=max((r.peak_memory_gb for r in records if math.isfinite(r.peak_memory_gb)), default=math.nan),
        flops=next((r.flops for r in records if r.flops is not None), None),
        loadavg_after=last.loadavg_after,
        processes=len(records),
        ratio_per_process=per_process,
        stage_s={k: [t for r in records for t in r.stage_s[k]] for k in stage_keys},
        ruler_stage_s={k: [t for r in records for t in r.ruler_stage_s[k]] for k in stage_keys},
        stage_ratio_median={k: statistics.median(r.stage_ratio_median[k] for r in records) for k in stage_keys},
    )


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        v = float(values[0])
        return v, v, v
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def interleave(
    case_call: Callable[[int], Any], ruler_call: Callable[[int], Any], rounds: int
) -> tuple[list[float], list[float]]:
    """``rounds`` rounds of one call each, ``call(round)``, the ruler first on even rounds and the case
    first on odd ones; returns (case seconds, ruler seconds)."""
    seconds: dict[str, list[float]] = {"case": [], "ruler": []}
    calls = {"ruler": ruler_call, "case": case_call}
    for _, name, s, _ in timing.timed_rounds(calls, "alternate", rounds, pass_round=True):
        seconds[name].append(s)
    return seconds["case"], seconds["ruler"]


def rounds_for(round_s: float, budget_s: float, least: int = MIN_ROUNDS, most: int = MAX_ROUNDS) -> int:
    """Rounds of ``round_s`` seconds (the ruler's call and the case's) that fit in ``budget_s``, from
    ``least`` to ``most``."""
    return max(least, min(most, math.ceil(budget_s / max(round_s, 1e-9))))


def check_request(case_names: Sequence[str], rounds: int | None, phase: str | None = None) -> None:
    """UsageError for fewer than 3 rounds, a case named twice or not at all, a case that does not
    exist or is not of ``phase``; NotImplementedError for a case this machine cannot run."""
    # Imported here: cases loads the user's case modules, and `--help` should not wait for them.
    from mrcnn_bench.running.cases import CASES

    if rounds is not None and rounds < 3:
        raise UsageError(f"rounds must be >= 3 (a median of fewer is not a figure), got {rounds}")
    if not case_names or len(set(case_names)) != len(case_names):
        raise UsageError(f"name each case once, at least one: {list(case_names)}")
    for name in case_names:
        if name not in CASES:
            raise UsageError(f"unknown case {name!r}; choose from {sorted(CASES)}")
        if phase is not None and CASES[name].phase != phase:
            raise UsageError(f"{name}: only {phase} cases share the ruler's rounds (time training with interleaved)")
        reason = CASES[name].skip_reason()
        if reason:
            raise NotImplementedError(f"{name}: {reason}")


def ruler_context(threads: int | None, training: bool) -> tuple[int, Any, Any]:
    """(threads, workload, context) of a measurement against the ruler: the quick workload at the
    ruler's image size, with the ruler's images, ``threads`` (default: every CPU this process may use)."""
    # Imported here: they import the commit's mrcnn, and `--help` should not wait for torch.
    import torch

    from mrcnn_bench.history.ruler import IMAGE_SIZE, ruler_images
    from mrcnn_bench.running.cases import QUICK_WORKLOAD
    from mrcnn_bench.running.context import ContextOptions, make_context

    threads = threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    workload = dataclasses.replace(QUICK_WORKLOAD, image_size=IMAGE_SIZE)
    ctx, _ = make_context(ContextOptions(workload, seed=0, threads=threads, need_training=training))
    # The ruler's images, not the commit's generator: every commit times the same pixels.
    ctx.images = ruler_images(workload.images)
    return threads, workload, ctx


def memory_and_flops(pipeline: Any, images: int, ctx: Any, flops: bool) -> tuple[float, float | None]:
    """(peak memory in GB of the case's own calls over ``images`` inputs, FLOPs per call or None).

    Run after the rounds, so that resetting the counters cannot perturb a timed call; the ruler is
    not called here."""
    # Imported here: they import the commit's mrcnn, and `--help` should not wait for torch.
    from mrcnn_bench.running import backends
    from mrcnn_bench.running.probes import case_flops

    dev = backends.device(pipeline.row.case.backend)
    backends.memory_reset(dev)
    for index in range(images):
        pipeline.call(index)
    return backends.memory_peak(dev), case_flops(pipeline.row, ctx) if flops else None


def case_record(name: str, phase: str, threads: int, images_per_call: int, case_s: list[float],
                ruler_s: list[float], first_s: float, peak: float, flops: float | None,
                load: tuple[float, float], **stages: Any) -> CaseRecord:
    """The record of one case timed against the ruler round by round (``case_s[i]`` beside ``ruler_s[i]``)."""
    ratios = [c / r for c, r in zip(case_s, ruler_s, strict=True)]
    q1, med, q3 = quartiles(ratios)
    return CaseRecord(
        case=name, phase=phase, rounds=len(case_s), threads=threads, images_per_call=images_per_call,
        case_s=case_s, ruler_s=ruler_s, ratio_median=med, ratio_q1=q1, ratio_q3=q3,
        seconds_median=statistics.median(case_s), ruler_seconds_median=statistics.median(ruler_s),
        first_result_s=first_s, peak_memory_gb=peak, flops=flops, loadavg_before=load[0],
        loadavg_after=load[1], ratio_per_process=[med], **stages,
    )  # fmt: skip


def measure(
    case_name: str, rounds: int | None = None, threads: int | None = None, budget_s: float = DEFAULT_BUDGET_S
) -> CaseRecord:
    """Build ``case_name`` on the quick workload, with the ruler's images, and time it against the
    ruler: ``rounds`` rounds, or as many as fit in ``budget_s`` (:func:`rounds_for`)."""
    # Imported here: they import the commit's mrcnn, and `--help` should not wait for torch.
    from mrcnn_bench.history.ruler import Ruler
    from mrcnn_bench.running.cases import CASES, TRAIN_BATCH, Row
    from mrcnn_bench.running.pipelines import Pipeline

    check_request([case_name], rounds)
    case = CASES[case_name]
    training = case.phase == "training"
    threads, workload, ctx = ruler_context(threads, training)
    ruler = Ruler(case.phase)
    pipeline = Pipeline(Row(case), ctx)
    pipeline.setup()
    first, _ = timing.timed(pipeline.call, 0)
    warm = []
    for index in range(1, workload.images + 1):  # every distinct input, so no compile lands in a round
        warm.append(timing.timed(pipeline.call, index)[0] + timing.timed(ruler.call, index)[0])
    rounds = rounds or rounds_for(statistics.median(warm), budget_s)
    load_before = os.getloadavg()[0]
    case_s, ruler_s = interleave(pipeline.call, ruler.call, rounds)
    load = (load_before, os.getloadavg()[0])
    peak, flops = memory_and_flops(pipeline, workload.images, ctx, flops=not training)
    return case_record(case_name, case.phase, threads, TRAIN_BATCH if training else workload.batch_size, case_s,
                       ruler_s, first, peak, flops, load)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mrcnn_bench.history.interleaved", description=__doc__.split("\n")[0])
    parser.add_argument("case", help="a case name, e.g. static/eager")
    parser.add_argument("out", type=Path, help="the record is written here as JSON")
    how_many = parser.add_mutually_exclusive_group()
    how_many.add_argument(
        "--budget-s",
        type=float,
        default=DEFAULT_BUDGET_S,
        help=f"seconds of timed rounds, {MIN_ROUNDS} to {MAX_ROUNDS} rounds (default {DEFAULT_BUDGET_S:g})",
    )
    how_many.add_argument("--rounds", type=int, default=None, help="exactly this many timed rounds")
    parser.add_argument(
        "--threads", type=int, default=None, help="intra-op threads (default: the CPUs this process may use)"
    )
    args = parser.parse_args(argv)
    try:
        record = measure(args.case, args.rounds, args.threads, args.budget_s)
    except (ValueError, NotImplementedError) as e:
        print(f"mrcnn_bench.history.interleaved: {e}", file=sys.stderr)
        return 2
    atomic_write(args.out, json.dumps(record.to_dict(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
