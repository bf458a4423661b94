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
lane). Without a C compiler, or on another architecture, the best measured convolution rate
stands in, labelled as such.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# FMA latency in cycles. Haswell and Broadwell (family 6, these models) take 5; later Intel cores
# and every Zen take 4.
FMA_LATENCY = 4
SLOW_FMA_MODELS = {0x3C, 0x3F, 0x45, 0x46, 0x3D, 0x47, 0x4F, 0x56}
CHAINS = 12  # independent chains: more than 2 units x 5 cycles, so no core waits on latency
LOOP_SECONDS = 0.25  # per loop and core: long enough to reach the loaded clock, short for a run

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
                lanes, dependent = _rate(exe, True, cores)
                _, independent = _rate(exe, False, cores)
                clock_hz = dependent * fma_latency(ident)
                units = max(1, round(independent / clock_hz))
                fp32 = cores * units * lanes * 2 * clock_hz / 1e9
                bf16 = fp32 * (2 if "avx512_bf16" in flags else 1)
                return Ceiling(fp32, bf16, f"FMA loops on {cores} cores (cc -march=native)", cores,
                               clock_hz / 1e9, units, lanes)
    fallback = fallback_gflops or {}
    return Ceiling(fallback.get("fp32", float("nan")), fallback.get("bf16", float("nan")),
                   "no FMA loop here: best measured convolution rate", cores)


def main() -> int:
    """``python -m mrcnn_bench.running.ceiling``: this machine's ceiling as JSON (run it on an idle machine)."""
    print(json.dumps(dataclasses.asdict(measure()), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
