"""The machine's fixed ceiling: measured by FMA loops where a C compiler and AVX2/FMA exist, else labelled."""

from __future__ import annotations

import math

import pytest
import torch

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


def _fake_fma_loops(monkeypatch, clock_ghz=2.11, units=2.0, alone_ghz=None, lanes=16):
    """The FMA loops replaced by fixed rates (vector FMAs per second per thread) on 2 cores, 4-cycle FMAs."""
    monkeypatch.setattr(ceiling, "cpu_flags", lambda: ({"fma", "avx2", "avx512f"}, {"vendor_id": "AuthenticAMD"}))
    monkeypatch.setattr(ceiling, "_fmaloop", lambda workdir: workdir / "fmaloop")
    monkeypatch.setattr(ceiling.os, "sched_getaffinity", lambda pid: {0, 1})

    def rate(exe, dependent, threads):
        if not dependent:
            return lanes, units * clock_ghz * 1e9
        return lanes, (alone_ghz if threads == 1 and alone_ghz else clock_ghz) * 1e9 / 4

    monkeypatch.setattr(ceiling, "_rate", rate)


def test_a_kernel_faster_than_the_ceiling_proves_its_clock_wrong(monkeypatch):
    # An Intel Xeon's run: ceiling 270 GFLOP/s from a 2.11 GHz chain, and matmul / conv at 443 / 455.
    _fake_fma_loops(monkeypatch)
    c = ceiling.measure()
    assert c.fp32_gflops == pytest.approx(2 * 2 * 16 * 2 * 2.11) and not c.unreliable
    checked = ceiling.check(c, {"matmul_fp32": 443.0, "conv3x3_fp32": 455.0, "matmul_bf16": 100.0}, set())
    assert checked.unreliable.startswith("conv3x3_fp32 ran at 455 GFLOP/s, 1.68x the fp32 ceiling of 270")
    assert "clock: the FMA loops themselves reached only 270 GFLOP/s" in checked.unreliable
    assert "needs 3.55" in checked.unreliable  # 2.11 GHz x 455 / 270
    assert ceiling.check(c, {"matmul_fp32": 200.0, "conv3x3_fp32": math.nan}, set()) == c  # below it: untouched
    # A kernel a little above it (the clock drifted between the loops and the probe) raises it.
    drift = ceiling.check(c, {"matmul_fp32": 275.0, "matmul_bf16": 100.0}, set())
    assert (drift.fp32_gflops, drift.bf16_gflops, drift.unreliable) == (275.0, c.bf16_gflops, "")
    assert drift.source.endswith("raised to the matmul_fp32 rate measured, 1.8% above the loops' clock")


@pytest.mark.parametrize(("loops", "rates", "flags", "failed"), [
    ({"alone_ghz": 3.0}, {"matmul_fp32": 320.0}, set(), "shared vCPUs: one core alone ran the FMA chain at 3.00 GHz"),
    ({"units": 1.45}, {"matmul_fp32": 190.0}, set(), "latency or units: the independent chains did 1.45 FMAs"),
    ({}, {"matmul_bf16": 2000.0}, {"amx_bf16"}, "units: this CPU has AMX tiles"),
])
def test_the_ceiling_names_the_assumption_its_measurements_contradict(monkeypatch, loops, rates, flags, failed):
    _fake_fma_loops(monkeypatch, **loops)
    checked = ceiling.check(ceiling.measure(), rates, flags)
    assert failed in checked.unreliable, checked.unreliable


def test_a_stand_in_ceiling_is_never_below_a_measured_kernel_rate():
    stand_in = ceiling.Ceiling(123.0, math.nan, "no FMA loop here: best measured convolution rate", 2)
    raised = ceiling.check(stand_in, {"conv3x3_fp32": 123.0, "matmul_fp32": 150.0, "matmul_bf16": 300.0})
    assert (raised.fp32_gflops, raised.bf16_gflops, raised.unreliable) == (150.0, 300.0, "")
    assert "best kernel rate" in raised.source


def test_a_run_whose_probe_beats_the_ceiling_shows_no_fraction_of_it(monkeypatch, tmp_path, tiny_weights):
    """End to end: a fake kernel probe far above the (faked) FMA ceiling; the run says so and prints no fraction."""
    from mrcnn_bench.cli import commands as cli
    from mrcnn_bench.running import runner, store

    _fake_fma_loops(monkeypatch)
    monkeypatch.setattr(runner, "measure_peaks", lambda reps: {"matmul_fp32": 1e4, "conv3x3_fp32": 50.0})
    weights = tmp_path / "weights.pt"
    torch.save(tiny_weights, weights)
    assert cli.main(["run", "--preset", "tiny", "--cases", "torchvision/eager,static/eager", "--rounds", "2",
                     "--images", "1", "--weights", str(weights), "--out", str(tmp_path / "out"), "--name", "t",
                     "--no-progress", "--in-process"]) == 0
    doc = store.load(tmp_path / "out" / "t.json")
    assert doc.run.ceiling["unreliable"].startswith("matmul_fp32 ran at 10000 GFLOP/s")
    assert all(math.isnan(r.frac_peak) and r.gflops_s > 0 for r in doc.records)
    md = (tmp_path / "out" / "t.md").read_text()
    assert "frac_peak not shown: this run's kernel rates contradict the machine's ceiling. matmul_fp32" in md
    assert "GFLOP/s over this machine's ceiling" not in md
