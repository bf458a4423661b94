"""The machine's fixed ceiling: measured by FMA loops where a C compiler and AVX2/FMA exist, else labelled."""

from __future__ import annotations

import math

import pytest

from mrcnn_bench.running import ceiling
from mrcnn_bench.running.cases import Case, Row, Workload
from mrcnn_bench.running.records import RowResult, RunInfo, make_record


def test_fma_latency_table():
    assert ceiling.fma_latency({"vendor_id": "GenuineIntel", "cpu family": "6", "model": str(0x3F)}) == 5  # Haswell
    assert ceiling.fma_latency({"vendor_id": "GenuineIntel", "cpu family": "6", "model": "85"}) == 4  # Skylake-SP
    assert ceiling.fma_latency({"vendor_id": "AuthenticAMD", "cpu family": "26", "model": "17"}) == 4


def test_the_ceiling_is_cores_times_units_times_lanes_times_clock():
    flags, _ = ceiling.cpu_flags()
    c = ceiling.measure({"fp32": 123.0, "bf16": 246.0})
    compiler = ceiling.shutil.which("cc") or ceiling.shutil.which("gcc")
    if not ({"fma", "avx2"} <= flags and compiler):
        pytest.skip("no AVX2/FMA or no C compiler here: the fallback is tested below")
    assert c.source.startswith("FMA loops"), c
    assert c.lanes == (16 if "avx512f" in flags else 8)
    assert 1 <= c.fma_units <= 4 and 0.3 < c.clock_ghz < 7.0, c  # physical bounds, not a timing target
    assert c.fp32_gflops == pytest.approx(c.cores * c.fma_units * c.lanes * 2 * c.clock_ghz)
    assert c.bf16_gflops == pytest.approx(c.fp32_gflops * (2 if "avx512_bf16" in flags else 1))


def test_without_a_compiler_the_convolution_rate_stands_in_and_says_so(monkeypatch):
    monkeypatch.setattr(ceiling.shutil, "which", lambda name: None)
    c = ceiling.measure({"fp32": 123.0, "bf16": 246.0})
    assert (c.fp32_gflops, c.bf16_gflops) == (123.0, 246.0) and "convolution" in c.source and c.fma_units == 0


def test_frac_peak_divides_by_the_ceiling_not_the_kernel_rates():
    r = RowResult(Row(Case("static")), status="ok", times=[0.5, 0.5, 0.5], flops=100e9)
    info = RunInfo(workload=Workload(), options={"rounds": 3}, peaks={"conv3x3_fp32": 50.0},
                   ceiling={"fp32_gflops": 400.0, "bf16_gflops": 800.0})
    rec = make_record(r, info, {})
    assert rec.gflops_s == pytest.approx(200.0) and rec.frac_peak == pytest.approx(0.5)
    old = make_record(r, RunInfo(workload=Workload(), options={"rounds": 3}, peaks={"conv3x3_fp32": 400.0}), {})
    assert old.frac_peak == pytest.approx(0.5)  # run files from before the ceiling keep their meaning
    assert not math.isnan(old.gflops_s)
