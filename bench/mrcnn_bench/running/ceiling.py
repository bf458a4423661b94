"""The machine's fixed arithmetic ceiling: cores x FMA units x SIMD lanes x 2 x clock, measured.

A per-run "peak" from a matmul or a convolution moves with the library's kernel choice (MKL takes
a slower path on some AMD CPUs) and with the machine's load, so a fraction of it is not a fraction
of anything physical. The ceiling here comes from the CPU itself, with two short loops of vector
FMAs compiled for this CPU (``cc -O2 -march=native``) and run on every usable core at once:

- a **dependent** chain (each FMA waits for the previous one) runs at one FMA per FMA latency, so
  its rate gives the clock under load: ``clock = FMAs x latency / seconds`` (the latency in cycles
  from :data:`FMA_LATENCY`, 4 on every x86 core since Skylake and Zen);
- **independent** chains (more than units x latency of them) saturate the FMA units, so their rate
  over ``lanes x 2 x clock`` gives the number of FMA units per core, whatever the CPU's model name
  says (a VM often hides it).

The SIMD width comes from the CPU's flags (AVX-512: 16 fp32 lanes, AVX2: 8). The bf16 ceiling is
twice the fp32 one where the CPU has AVX-512 BF16 (``vdpbf16ps`` does two multiply-adds per fp32
lane). Without a C compiler, or on another architecture, the best measured kernel rate stands in,
labelled as such.

No kernel runs faster than the machine can, so :func:`check` holds the ceiling against the kernel
rates the same run measured: a rate above it proves one of its factors wrong, and the ceiling comes
back marked ``unreliable``, naming the assumption that failed, so that no fraction of it is shown.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

# FMA latency in cycles. Haswell and Broadwell (family 6, these models) take 5; later Intel cores
# and every Zen take 4.
FMA_LATENCY = 4
SLOW_FMA_MODELS = {0x3C, 0x3F, 0x45, 0x46, 0x3D, 0x47, 0x4F, 0x56}
CHAINS = 12  # independent chains: more than 2 units x 5 cycles, so no core waits on latency
LOOP_SECONDS = 0.25  # per loop and core: long enough to reach the loaded clock, short for a run
# How far a kernel may run above the loops' product before a factor is called wrong. The clock drifts
# by a few percent between the loops' quarter second and a kernel probe (turbo, a VM's neighbours);
# the discrete factors are wrong in steps of 5/4 or more (a 4- vs 5-cycle latency, 1 vs 2 units).
CLOCK_DRIFT = 0.10

_SOURCE = r"""
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#if defined(__AVX512F__)
typedef __m512 V;
#define LANES 16
#define SET _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define ADD _mm512_add_ps
#define SUM _mm512_reduce_add_ps
#else
typedef __m256 V;
#define LANES 8
#define SET _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define ADD _mm256_add_ps
static float SUM(V v) { float f[8]; _mm256_storeu_ps(f, v); return f[0]+f[1]+f[2]+f[3]+f[4]+f[5]+f[6]+f[7]; }
#endif
static long n; static int dependent; static volatile float sink;
static void *loop(void *arg) {
  V b = SET(0.999999f), c = SET(1e-7f);
  if (dependent) {
    V a = SET(1.0f);
    for (long i = 0; i < n; i++) a = FMA(a, b, c);
    sink = SUM(a);
  } else {
    V a0=SET(1),a1=SET(2),a2=SET(3),a3=SET(4),a4=SET(5),a5=SET(6);
    V a6=SET(7),a7=SET(8),a8=SET(9),a9=SET(10),a10=SET(11),a11=SET(12);
    for (long i = 0; i < n; i++) {
      a0=FMA(a0,b,c); a1=FMA(a1,b,c); a2=FMA(a2,b,c); a3=FMA(a3,b,c); a4=FMA(a4,b,c); a5=FMA(a5,b,c);
      a6=FMA(a6,b,c); a7=FMA(a7,b,c); a8=FMA(a8,b,c); a9=FMA(a9,b,c); a10=FMA(a10,b,c); a11=FMA(a11,b,c);
    }
    sink = SUM(ADD(ADD(ADD(a0,a1),ADD(a2,a3)),ADD(ADD(ADD(a4,a5),ADD(a6,a7)),ADD(ADD(a8,a9),ADD(a10,a11)))));
  }
  return NULL;
}
int main(int argc, char **argv) {  /* fmaloop dependent|independent THREADS N -> lanes seconds */
  dependent = argv[1][0] == 'd'; int threads = atoi(argv[2]); n = atol(argv[3]);
  pthread_t t[256]; struct timespec s, e;
  clock_gettime(CLOCK_MONOTONIC, &s);
  for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, loop, NULL);
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  clock_gettime(CLOCK_MONOTONIC, &e);
  printf("%d %.9f\n", LANES, (e.tv_sec - s.tv_sec) + (e.tv_nsec - s.tv_nsec) * 1e-9);
  return 0;
}
"""


@dataclasses.dataclass(frozen=True)
class Ceiling:
    """GFLOP/s the machine can do at most (2 FLOPs per multiply-add, as FlopCounterMode counts)."""

    fp32_gflops: float
    bf16_gflops: float
    source: str  # how it was found: the FMA loops, or the fallback
    cores: int = 0
    clock_ghz: float = 0.0
    fma_units: int = 0
    lanes: int = 0  # fp32 lanes of one FMA
    clock_one_core_ghz: float = 0.0  # the dependent chain on one core alone: above clock_ghz, the cores contend
    units_measured: float = 0.0  # FMAs per cycle per core the independent chains did, before rounding
    latency_cycles: int = 0  # the FMA latency the clock assumes (fma_latency)
    unreliable: str = ""  # set by check: a measured kernel rate above the ceiling, and what failed

    def for_precision(self, precision: str) -> float:
        return self.bf16_gflops if precision == "bf16" else self.fp32_gflops


def cpu_flags() -> tuple[set[str], dict[str, str]]:
    """The CPU's feature flags and its identification fields (vendor_id, cpu family, model)."""
    flags: set[str] = set()
    ident: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (p.strip() for p in line.partition(":"))
            if key == "flags" and not flags:
                flags = set(value.split())
            elif key in ("vendor_id", "cpu family", "model", "model name") and key not in ident:
                ident[key] = value
    return flags, ident


def fma_latency(ident: dict[str, str]) -> int:
    """FMA latency in cycles of this core (:data:`FMA_LATENCY`, or 5 on Haswell and Broadwell)."""
    intel = ident.get("vendor_id") == "GenuineIntel" and ident.get("cpu family") == "6"
    with contextlib.suppress(ValueError):
        if intel and int(ident.get("model", "-1")) in SLOW_FMA_MODELS:
            return 5
    return FMA_LATENCY


def _fmaloop(workdir: Path) -> Path | None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    src, exe = workdir / "fmaloop.c", workdir / "fmaloop"
    src.write_text(_SOURCE)
    done = subprocess.run([compiler, "-O2", "-march=native", "-pthread", str(src), "-o", str(exe)],
                          capture_output=True, timeout=120)
    return exe if done.returncode == 0 else None


def _rate(exe: Path, dependent: bool, threads: int) -> tuple[int, float]:
    """(lanes, vector FMAs per second per thread), the loop sized to about LOOP_SECONDS."""
    kind = "dependent" if dependent else "independent"
    n = 1_000_000
    while True:
        out = subprocess.run([str(exe), kind, str(threads), str(n)], capture_output=True, text=True,
                             timeout=60, check=True).stdout.split()
        lanes, seconds = int(out[0]), float(out[1])
        if seconds >= LOOP_SECONDS or n > 10**11:
            per_iteration = 1 if dependent else CHAINS
            return lanes, n * per_iteration / seconds
        n = int(n * min(100.0, 1.2 * LOOP_SECONDS / max(seconds, 1e-6)))


def measure(fallback_gflops: dict[str, float] | None = None) -> Ceiling:
    """The ceiling of the cores this process may use; ``fallback_gflops`` ({"fp32": .., "bf16": ..},
    e.g. the best convolution rates of :func:`mrcnn_bench.running.probes.measure_peaks`) where the loops
    cannot run."""
    flags, ident = cpu_flags()
    cores = len(os.sched_getaffinity(0))
    exe = None
    with tempfile.TemporaryDirectory(prefix="mrcnn_ceiling_") as tmp:
        if "fma" in flags and "avx2" in flags:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                exe = _fmaloop(Path(tmp))
        if exe is not None:
            with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError, IndexError):
                latency = fma_latency(ident)
                lanes, dependent = _rate(exe, True, cores)
                _, independent = _rate(exe, False, cores)
                alone = _rate(exe, True, 1)[1] if cores > 1 else dependent
                clock_hz = dependent * latency
                units = max(1, round(independent / clock_hz))
                fp32 = cores * units * lanes * 2 * clock_hz / 1e9
                bf16 = fp32 * (2 if "avx512_bf16" in flags else 1)
                return Ceiling(fp32, bf16, f"FMA loops on {cores} cores (cc -march=native)", cores,
                               clock_hz / 1e9, units, lanes, alone * latency / 1e9, independent / clock_hz,
                               latency)
    fallback = fallback_gflops or {}
    return Ceiling(fallback.get("fp32", float("nan")), fallback.get("bf16", float("nan")),
                   "no FMA loop here: best measured convolution rate", cores)


def check(c: Ceiling, rates: Mapping[str, float], flags: set[str] | None = None) -> Ceiling:
    """``c`` held against the kernel rates the run measured (``{"matmul_fp32": GFLOP/s, ...}``, the
    precision after the last underscore; ``flags``: the CPU's, default this one's).

    A stand-in ceiling (no FMA loop here) is the best kernel rate measured, so it is raised to the
    best of ``rates``; so is a ceiling from the FMA loops that a rate exceeds by at most
    :data:`CLOCK_DRIFT` (the clock moved between them). One exceeded by more comes back with
    ``unreliable`` saying by how much and which assumption failed (:func:`_failed_assumption`).
    """
    best: dict[str, tuple[float, str]] = {}
    for name, rate in rates.items():
        tag = name.rpartition("_")[2]
        if math.isfinite(rate) and rate > best.get(tag, (-math.inf, ""))[0]:
            best[tag] = (rate, name)
    raised = {tag: max((v for v in (c.for_precision(tag), best.get(tag, (math.nan,))[0]) if v == v),
                       default=math.nan) for tag in ("fp32", "bf16")}
    if not c.fma_units:
        return dataclasses.replace(c, fp32_gflops=raised["fp32"], bf16_gflops=raised["bf16"],
                                   source="no FMA loop here: the best kernel rate measured")
    over = [(rate / c.for_precision(tag), name, rate, tag) for tag, (rate, name) in best.items()
            if rate > c.for_precision(tag)]
    if not over:
        return c
    factor, name, rate, tag = max(over)
    if factor <= 1 + CLOCK_DRIFT:
        return dataclasses.replace(c, fp32_gflops=raised["fp32"], bf16_gflops=raised["bf16"], source=(
            f"{c.source}, raised to the {name} rate measured, {100 * (factor - 1):.1f}% above the loops' clock"))
    head = (f"{name} ran at {rate:.0f} GFLOP/s, {factor:.2f}x the {tag} ceiling of {c.for_precision(tag):.0f} "
            f"({c.cores} cores x {c.fma_units} FMA units x {c.lanes} lanes x 2 x {c.clock_ghz:.2f} GHz"
            f"{' x 2 for bf16' if c.bf16_gflops > c.fp32_gflops and tag == 'bf16' else ''}), so a factor of it "
            "is too low: ")
    flags = cpu_flags()[0] if flags is None else flags
    return dataclasses.replace(c, unreliable=head + _failed_assumption(c, rate, factor, tag, flags))


def _failed_assumption(c: Ceiling, rate: float, factor: float, tag: str, flags: set[str]) -> str:
    """Which of the ceiling's assumptions the measurements contradict, with the evidence."""
    if tag == "bf16" and "amx_bf16" in flags:
        return ("units: this CPU has AMX tiles (amx_bf16), which do bf16 multiply-adds outside the FMA "
                "units the ceiling counts")
    if c.clock_one_core_ghz > 1.1 * c.clock_ghz:
        return (f"shared vCPUs: one core alone ran the FMA chain at {c.clock_one_core_ghz:.2f} GHz, all "
                f"{c.cores} at once at {c.clock_ghz:.2f} GHz each, so the cores contended (SMT siblings, or "
                "other work on the host) while the loops ran")
    # The loops' own rate at the ceiling's precision (bf16's is fp32's times the ratio measure set).
    loops = c.cores * c.units_measured * c.lanes * 2 * c.clock_ghz * c.for_precision(tag) / c.fp32_gflops
    if loops >= rate:
        return (f"latency or units: the independent chains did {c.units_measured:.2f} FMAs per cycle per core "
                f"at the clock a {c.latency_cycles}-cycle FMA latency gives, which the ceiling rounds to "
                f"{c.fma_units}; an FMA likely takes other than {c.latency_cycles} cycles on this core")
    return (f"clock: the FMA loops themselves reached only {loops:.0f} GFLOP/s, so the kernel ran at a higher "
            f"clock than the loops' {c.clock_ghz:.2f} GHz (it needs {c.clock_ghz * factor:.2f}: turbo the "
            "loops' short run did not reach, or a host busy while they ran)")


def main() -> int:
    """``python -m mrcnn_bench.running.ceiling``: this machine's ceiling as JSON (run it on an idle machine)."""
    print(json.dumps(dataclasses.asdict(measure()), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
