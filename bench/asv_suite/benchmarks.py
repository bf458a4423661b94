"""asv benchmarks: thin wrappers over the quick cases of :mod:`mrcnn_bench.cases`.

asv runs each benchmark in a fresh process and calls ``setup`` there, so every number below is
from a process that built its case from scratch.

asv assumes lower is better. Every metric here is therefore stated in its lower-is-better form:
seconds per call, seconds per training image (not images/s), compilations, GB, and
``1 - AP`` (not AP), each with its unit saying so.
"""

from __future__ import annotations

import os
import time

from mrcnn_bench.cases import CASES, QUICK, QUICK_WORKLOAD, TRAIN_BATCH, Row
from mrcnn_bench.compile_probe import measure_case
from mrcnn_bench.context import ContextOptions, make_context
from mrcnn_bench.pipelines import Pipeline

INFERENCE = [n for n in QUICK if CASES[n].phase == "inference"]
TRAINING = [n for n in QUICK if CASES[n].phase == "training"]
COMPILED = [n for n in INFERENCE if CASES[n].backend == "xla" or CASES[n].compiler == "inductor"]


def build(name: str) -> tuple[Pipeline, float]:
    """The case built and called once; returns it and its first call's seconds (compilation included)."""
    case = CASES[name]
    reason = case.skip_reason()
    if reason:
        raise NotImplementedError(reason)  # asv reports the benchmark as skipped
    ctx, _ = make_context(ContextOptions(QUICK_WORKLOAD, seed=0, threads=len(os.sched_getaffinity(0)),
                                         need_training=case.phase == "training"))
    pipeline = Pipeline(Row(case), ctx)
    pipeline.setup()
    t0 = time.perf_counter()
    pipeline.call(0)
    return pipeline, time.perf_counter() - t0


class Inference:
    """Per-call latency of the quick inference cases (tiny preset, 240x320, batch 1)."""

    params = INFERENCE
    param_names = ("case",)
    number = 1
    repeat = (3, 7, 60.0)
    processes = 1  # one fresh process per benchmark and case; across commits, asv find re-measures
    warmup_time = 0
    timeout = 900

    def setup(self, case: str) -> None:
        self.pipeline, self.first_s = build(case)

    def time_call(self, case: str) -> None:
        self.pipeline.call(1)

    def peakmem_call(self, case: str) -> None:
        self.pipeline.call(1)

    def track_first_result(self, case: str) -> float:
        return self.first_s

    track_first_result.unit = "seconds (first call, compilation included)"


class Compiles:
    """Compilations after one call on each of seven image sizes in two canvas buckets (exact)."""

    params = COMPILED
    param_names = ("case",)
    processes = 1  # the count is exact: one process is enough
    timeout = 900

    def setup(self, case: str) -> None:
        reason = CASES[case].skip_reason()
        if reason:
            raise NotImplementedError(reason)

    def track_compilations(self, case: str) -> float:
        counts = measure_case(case, QUICK_WORKLOAD.preset)
        return float(counts.get("uncached_compile", counts.get("unique_graphs", 0)))

    track_compilations.unit = "compilations"
    # asv versions a benchmark by its code's hash; only an import moved (gate -> compile_probe), the
    # measurement is the same, so the recorded history (results/asv) stays this benchmark's.
    track_compilations.version = "8c03746b526141e3d4cb280a11d26ef35d6ac8b35543a6a3620bca44d352c804"


class Training:
    """Training step time at batch TRAIN_BATCH (tiny preset)."""

    params = TRAINING
    param_names = ("case",)
    number = 1
    repeat = (3, 5, 60.0)
    processes = 1
    warmup_time = 0
    timeout = 900

    def setup(self, case: str) -> None:
        self.pipeline, _ = build(case)

    def time_step(self, case: str) -> None:
        self.pipeline.call(1)

    def track_seconds_per_image(self, case: str) -> float:
        t0 = time.perf_counter()
        self.pipeline.call(1)
        return (time.perf_counter() - t0) / TRAIN_BATCH

    track_seconds_per_image.unit = "seconds per training image (1 / throughput)"
