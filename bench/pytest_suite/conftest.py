"""pytest-benchmark suite over the quick cases: ``pytest bench/pytest_suite --benchmark-only``."""

from __future__ import annotations

import os

os.environ.setdefault("PJRT_DEVICE", "CPU")  # before torch_xla is imported (by any test module)

import torch  # after PJRT_DEVICE

from mrcnn_bench.running.store import cpu_model

QUICK_ROUNDS = 5  # CI's: the suite there checks that every case runs and compiles once, not its speed


def pytest_addoption(parser):
    parser.addoption("--quick-rounds", type=int, default=QUICK_ROUNDS,
                     help=f"timed rounds per quick case (default: {QUICK_ROUNDS}; a stored baseline wants 30 or more)")


def pytest_benchmark_update_machine_info(config, machine_info):
    """CPU and GPU model in every saved benchmark file, so files from several machines stay apart."""
    machine_info["cpu_model"] = cpu_model()
    machine_info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    machine_info["torch"] = torch.__version__
    machine_info["torch_threads"] = torch.get_num_threads()
