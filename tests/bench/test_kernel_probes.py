"""The kernel-rate probe stays within seconds on any CPU: a kernel too slow for its full size here
(bf16 matmul without a bf16 unit) is timed on a smaller problem. A fake clock makes it exact."""

from __future__ import annotations

import pytest

from mrcnn_bench.running import probes


class FakeKernel:
    """A kernel whose call advances a fake clock by its FLOPs over a fixed rate (FLOP/s)."""

    def __init__(self, clock: list[float], flops_per_s: float):
        self.clock, self.flops_per_s, self.sizes_called = clock, flops_per_s, []

    def __call__(self, k: int):
        flops = 2.0 * (2048 >> k) ** 3

        def call():
            self.sizes_called.append(k)
            self.clock[0] += flops / self.flops_per_s

        return call, flops


@pytest.fixture
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(probes.time, "perf_counter", lambda: now[0])
    return now


@pytest.mark.parametrize(("flops_per_s", "halvings"), [(100e9, 0), (20e9, 1), (4e9, 2), (0.4e9, 3), (1e6, 3)])
def test_the_largest_size_whose_call_fits_the_budget(clock, flops_per_s, halvings):
    """Full size where one call fits PROBE_CALL_S, halved sides until it does, the smallest at worst."""
    kernel = FakeKernel(clock, flops_per_s)
    _, flops = probes._largest_within(kernel)
    assert flops == 2.0 * (2048 >> halvings) ** 3
    if halvings < probes.HALVINGS:
        assert flops / flops_per_s <= probes.PROBE_CALL_S < 8 * flops / flops_per_s
    # Sizing it cost two calls of the smallest problem, never a call of a larger one.
    assert kernel.sizes_called == [probes.HALVINGS, probes.HALVINGS]


def test_the_rate_is_the_kernels_own_at_the_size_chosen(clock):
    kernel = FakeKernel(clock, 3e9)
    gflops = probes._best_rate(*probes._largest_within(kernel), reps=3)
    assert gflops == pytest.approx(3.0)
    assert probes.time.perf_counter() < 10 * probes.PROBE_CALL_S  # the probe's whole (fake) time


def test_every_kernel_measured_on_this_machine():
    peaks = probes.measure_peaks(reps=1)
    assert set(peaks) == {"matmul_fp32", "conv3x3_fp32", "matmul_bf16", "conv3x3_bf16"}
    assert all(rate > 0 for rate in peaks.values()), peaks
