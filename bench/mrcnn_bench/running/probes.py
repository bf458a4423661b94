"""Probes of the machine and of the work: peak kernel rates, FLOPs per call, load and memory.

None of them is timed with the rows: peaks are measured before and after the rounds, FLOPs on the
eager CPU model after them, the machine state between rounds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from mrcnn_bench.running import backends
from mrcnn_bench.running.cases import Row
from mrcnn_bench.running.context import Context
from mrcnn_bench.running.pipelines import Pipeline, inference_staged

# The longest one probe call should take. A kernel with no fast path on this CPU (a bf16 matmul
# without AVX-512 BF16 or AMX falls back to a loop orders of magnitude slower) would hold the run
# for minutes at its full size; it is timed on a smaller problem instead, which tells the same thing:
# this kernel is slow here.
PROBE_CALL_S = 0.5
# How many times a probe may halve its problem's sides (3: a matmul down to 256^3).
HALVINGS = 3

# (the call, its FLOPs) of a kernel with its sides halved k times
Kernel = Callable[[int], tuple[Callable[[], Any], float]]


def _best_rate(fn: Callable[[], Any], flops: float, reps: int) -> float:
    """GFLOP/s of the fastest of ``reps`` calls of ``fn`` (after one untimed call)."""
    fn()
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return flops / best / 1e9


def _largest_within(kernel: Kernel) -> tuple[Callable[[], Any], float]:
    """The kernel at the largest size whose one call should take at most :data:`PROBE_CALL_S`,
    predicted from one timed call of the smallest size (after an untimed one)."""
    small, small_flops = kernel(HALVINGS)
    small()
    t0 = time.perf_counter()
    small()
    flops_per_s = small_flops / max(time.perf_counter() - t0, 1e-9)
    for k in range(HALVINGS):
        fn, flops = kernel(k)
        if flops / flops_per_s <= PROBE_CALL_S:
            return fn, flops
    return small, small_flops


def _matmul(dtype: torch.dtype) -> Kernel:
    def at(k: int) -> tuple[Callable[[], Any], float]:
        n = 2048 >> k
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        return (lambda: a @ b), 2.0 * n**3
    return at


def _conv3x3(dtype: torch.dtype) -> Kernel:
    def at(k: int) -> tuple[Callable[[], Any], float]:
        h, w = 100 >> k, 136 >> k
        x = torch.randn(1, 256, h, w, dtype=dtype).to(memory_format=torch.channels_last)
        wt = torch.randn(256, 256, 3, 3, dtype=dtype).to(memory_format=torch.channels_last)
        return (lambda: F.conv2d(x, wt, padding=1)), 2.0 * 256 * 256 * 9 * h * w
    return at


def measure_peaks(reps: int = 5) -> dict[str, float]:
    """GFLOP/s of a 2048^3 matmul and a channels-last 3x3 conv [1,256,100,136] 256->256, fp32 and bf16.

    These are the dense kernels that dominate Mask R-CNN; their best-of-``reps`` rates stand in for
    the machine's peak (2 FLOP per multiply-add, as FlopCounterMode counts). A kernel too slow here
    for its full size within :data:`PROBE_CALL_S` a call is timed with its sides halved (up to
    :data:`HALVINGS` times), so the probe costs seconds on any CPU.
    """
    out = {}
    with torch.no_grad():
        for dtype, tag in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            for name, kernel in (("matmul", _matmul(dtype)), ("conv3x3", _conv3x3(dtype))):
                out[f"{name}_{tag}"] = _best_rate(*_largest_within(kernel), reps)
    return out


def count_flops(fn: Callable[[], Any]) -> float:
    """FLOPs (2 per multiply-add) that ``FlopCounterMode`` sees in one call of ``fn``."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


def auto_staged(row: Row, ctx: Context) -> bool | None:
    """For a static inference row whose config leaves ``mask_detection_buckets`` at "auto": whether
    the row runs the mask branch staged (:func:`mrcnn_bench.running.pipelines.inference_staged`); None for
    every other row."""
    if row.case.interface != "static" or row.case.phase != "inference":
        return None
    cfg = ctx.config(row.variant, row.case.overrides)
    # getattr: commits the history measures may predate the field (their rows run the single graph).
    if getattr(cfg, "mask_detection_buckets", ()) != "auto":
        return None
    return inference_staged(cfg, row.case, torch.device(row.case.backend))


def eager_stand_in(row: Row, ctx: Context) -> Pipeline:
    """The eager fp32 CPU pipeline that does ``row``'s work (same config, same inputs), not set up
    yet: where the row's work is counted (FLOPs here, :mod:`mrcnn_bench.running.work_counters`)."""
    case = dataclasses.replace(row.case, backend="cpu", compiler="eager", precision="fp32", bounded=False)
    pipeline = Pipeline(Row(case, row.variant), ctx)
    if auto_staged(row, ctx) is False:
        # The eager CPU stand-in, which "auto" stages, does the work of the row's single graph.
        pipeline.cfg = pipeline.cfg.replace(mask_detection_buckets=())
    return pipeline


def case_flops(row: Row, ctx: Context) -> float:
    """FLOPs of one call of ``row`` (eager, CPU, same inputs): the work its GFLOP/s divides."""
    pipeline = eager_stand_in(row, ctx)
    pipeline.setup()
    return count_flops(lambda: pipeline.call(0))


def machine_state(pids: list[int] | None = None) -> dict[str, float]:
    """What else was using the machine: load average, available memory, resident sizes (GB), and the
    cumulative CPU seconds of the whole machine and of this run's own processes (``cpu_busy_s``,
    ``own_cpu_s``, ``steal_s``, at ``wall_s``), from which :func:`mrcnn_bench.reports.run_notes.other_load` tells
    how many cores other processes used between two states. The 1-minute load average alone counts
    the run's own threads."""
    state: dict[str, float] = {"loadavg_1m": os.getloadavg()[0], "wall_s": time.monotonic()}
    if (available := backends.mem_available_gb()) == available:  # absent (NaN) where /proc has none
        state["mem_available_gb"] = available
    state["rss_gb"] = sum(backends.proc_status_gb("VmRSS", pid) for pid in [os.getpid(), *(pids or [])])
    with contextlib.suppress(OSError, ValueError, IndexError):
        # /proc/stat "cpu": user nice system idle iowait irq softirq steal ... in clock ticks, all CPUs.
        ticks = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        hz = os.sysconf("SC_CLK_TCK")
        state["cpu_busy_s"] = (sum(ticks[:3]) + sum(ticks[5:7])) / hz
        state["steal_s"] = (ticks[7] if len(ticks) > 7 else 0) / hz
        state["own_cpu_s"] = sum(_cpu_seconds(pid) for pid in [os.getpid(), *(pids or [])])
    return state


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (its threads included), in seconds; 0 for one that is gone."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0
