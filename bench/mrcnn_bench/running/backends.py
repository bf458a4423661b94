"""cpu / cuda / xla in one place: availability (with a reason), device, sync, compile counters.

Counters are the backends' own: dynamo's ``torch._dynamo.utils.counters`` (unique graphs, graph
breaks, recompiles) and torch_xla's metrics (``UncachedCompile``, ``CompileTime``, executed
fallback ops). They are process-wide and cumulative; callers take differences.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path
from typing import Literal, get_args

import torch

Backend = Literal["cpu", "xla", "cuda"]
BACKENDS: tuple[str, ...] = get_args(Backend)


def unavailable(backend: str) -> str | None:
    """Why ``backend`` cannot run on this machine, or None when it can."""
    if backend not in BACKENDS:
        return f"unknown backend {backend!r} (choose from {BACKENDS})"
    if backend == "cuda" and not torch.cuda.is_available():
        return "no CUDA device"
    if backend == "xla":
        if importlib.util.find_spec("torch_xla") is None:
            return "torch_xla is not installed"
        if not os.environ.get("PJRT_DEVICE"):
            return "PJRT_DEVICE is not set (PJRT_DEVICE=CPU for XLA on the CPU, TPU on a TPU VM)"
    return None


def device(backend: str) -> torch.device:
    if backend == "xla":
        import torch_xla  # optional dependency: only the xla backend needs it

        return torch_xla.device()
    return torch.device(backend)


def sync(dev: torch.device) -> None:
    """Wait for queued work. On XLA, ``sync()`` launches the graph; reading a result back waits for it."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "xla":
        import torch_xla  # optional dependency: only the xla backend needs it

        torch_xla.sync()


def dynamo_counters() -> dict[str, float]:
    """Dynamo's unique graphs, graph breaks, recompiles and compile seconds (process-wide)."""
    # Imported here: torch._dynamo adds about a second to the start of every command that never compiles.
    from torch._dynamo.utils import compilation_time_metrics, counters, guard_failures

    return {
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        # One entry per failed guard check that led to a new compilation of a frame.
        "recompiles": int(sum(len(reasons) for reasons in guard_failures.values())),
        # Wall time of every frame compilation (dynamo tracing + inductor), one entry per frame.
        "compile_s": float(sum(compilation_time_metrics.get("_compile.compile_inner", []))),
    }


def dynamo_reasons() -> dict[str, list[str]]:
    """Why dynamo broke graphs and recompiled, as it recorded it (reason strings, with frames)."""
    # Imported here: start-up time, as in dynamo_counters.
    from torch._dynamo.utils import counters, guard_failures

    recompiles = [f"{code.co_name} ({code.co_filename}:{code.co_firstlineno}): {reason}"
                  for code, reasons in guard_failures.items() for reason in reasons]
    return {"graph_breaks": sorted(counters["graph_break"]), "recompiles": recompiles}


def xla_counters() -> dict[str, float]:
    """torch_xla's UncachedCompile, total CompileTime (s) and the number of CPU fallback ops."""
    import torch_xla.debug.metrics as met  # optional dependency: only the xla backend needs it

    data = met.metric_data("CompileTime")
    return {
        "uncached_compile": int(met.counter_value("UncachedCompile") or 0),
        "compile_s": (data[1] / 1e9) if data else 0.0,
        "fallback_ops": len(met.executed_fallback_ops()),
    }


def flush_subnormals() -> None:
    """Treat subnormal float inputs and results as zero (DAZ/FTZ) in every CPU thread of this process.

    Call it before the process's first parallel CPU op, or it raises: ``torch.set_flush_denormal``
    sets the calling thread's floating-point mode only, and the OpenMP threads copy that mode once,
    when they are created. Checked, not assumed: a product over subnormal values, split across
    every thread, must come out all zero. Why training rows need it: ``results/training/README.md``
    (AVX-512 fp32 arithmetic on subnormal gradients made whole steps several times slower).
    """
    if not torch.set_flush_denormal(True):
        raise RuntimeError("this CPU cannot flush subnormal floats to zero (torch.set_flush_denormal)")
    # The smallest subnormal float32 by its bits (a float conversion here would itself flush it),
    # in a tensor large enough that every thread takes a share (ATen's grain is 32768 elements).
    subnormal = torch.ones(32768 * 4 * max(torch.get_num_threads(), 1), dtype=torch.int32).view(torch.float32)
    survivors = int((subnormal * 1.0).count_nonzero())
    if survivors:
        torch.set_flush_denormal(False)
        raise RuntimeError(f"{survivors} subnormal values survived in threads that started before "
                           "flush_subnormals(): call it before the process's first parallel op")


def memory_reset(dev: torch.device) -> float:
    """Start a peak-memory window; returns the current resident size in GB (CPU) or allocated (CUDA)."""
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        return torch.cuda.memory_allocated(dev) / 2**30
    # Writing 5 to clear_refs resets the process's peak RSS (VmHWM) to its current RSS (Linux).
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    return proc_status_gb("VmRSS")


def memory_peak(dev: torch.device) -> float:
    """Peak since :func:`memory_reset`: max allocated on CUDA, peak RSS (VmHWM) otherwise, in GB."""
    if dev.type == "cuda":
        return torch.cuda.max_memory_allocated(dev) / 2**30
    return proc_status_gb("VmHWM")


def mem_available_gb() -> float:
    """The system's MemAvailable (``/proc/meminfo``) in GB; NaN where there is none."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def proc_status_gb(field: str, pid: int | str = "self") -> float:
    """A size field of ``/proc/PID/status`` (VmRSS, VmHWM, ...) in GB; NaN where there is none."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 2**20
    return float("nan")
