"""The quick cases under pytest-benchmark: explicit rounds, non-time metrics in ``extra_info``.

    pytest bench/pytest_suite --benchmark-only --benchmark-json out/bench.json
    pytest bench/pytest_suite --benchmark-only --quick-rounds 30 --benchmark-storage file://./results/pytest-benchmark \
        --benchmark-compare --benchmark-compare-fail median:25%
"""

from __future__ import annotations

import os

import pytest
import torch

from mrcnn_bench.base import timing
from mrcnn_bench.running import backends
from mrcnn_bench.running.cases import CASES, QUICK, QUICK_WORKLOAD, Row
from mrcnn_bench.running.context import ContextOptions, make_context
from mrcnn_bench.running.pipelines import Pipeline
from mrcnn_bench.running.probes import count_flops

TIMED_INDEX = 1  # the call every round times; it is also the warm-up call, so its compile is never timed
COMPILE_COUNTERS = ("uncached_compile", "unique_graphs", "graph_breaks", "recompiles")  # XLA's, dynamo's


@pytest.fixture(scope="module")
def context():
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    ctx, _ = make_context(ContextOptions(QUICK_WORKLOAD, seed=0, threads=torch.get_num_threads(), need_training=True))
    return ctx


@pytest.mark.parametrize("name", QUICK)
def test_case(benchmark, context, name, request):
    case = CASES[name]
    reason = case.skip_reason()
    if reason:
        pytest.skip(reason)
    pipeline = Pipeline(Row(case), context)
    start = pipeline.counters()
    pipeline.setup()
    first, _ = timing.timed(pipeline.call, TIMED_INDEX)
    warm = pipeline.counters()
    before = backends.memory_reset(pipeline.device)
    rounds = request.config.getoption("--quick-rounds")
    benchmark.pedantic(pipeline.call, args=(TIMED_INDEX,), rounds=rounds, iterations=1, warmup_rounds=0)
    end = pipeline.counters()
    info = benchmark.extra_info
    info.update(case=name, workload=QUICK_WORKLOAD.label, first_result_s=first, phase=case.phase,
                peak_mem_gb=backends.memory_peak(pipeline.device), rss_before_gb=before)
    info.update({f"{k}_warmup": warm[k] - start.get(k, 0) for k in warm})
    info.update({f"{k}_rounds": end[k] - warm.get(k, 0) for k in end})
    if case.backend == "cpu" and case.compiler == "eager":
        info["flops"] = count_flops(lambda: pipeline.call(2))
    # A compiled case must not compile again once warm: the benchmark is void if it did. Every
    # compiled case reports counters (else this check would pass on nothing); eager ones have none.
    compiled = [k for k in COMPILE_COUNTERS if k in warm]
    assert bool(compiled) == (case.backend == "xla" or case.compiler != "eager"), (name, warm)
    for k in compiled:
        assert end[k] == warm[k], (k, warm, end)
