"""pytest-benchmark suite over the quick cases: ``pytest bench --benchmark-only``."""

from __future__ import annotations

import os

os.environ.setdefault("PJRT_DEVICE", "CPU")  # before torch_xla is imported (by any test module)

import torch  # after PJRT_DEVICE

from mrcnn_bench.store import cpu_model


def pytest_benchmark_update_machine_info(config, machine_info):
    """CPU and GPU model in every saved benchmark file, so files from several machines stay apart."""
    machine_info["cpu_model"] = cpu_model()
    machine_info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    machine_info["torch"] = torch.__version__
    machine_info["torch_threads"] = torch.get_num_threads()
