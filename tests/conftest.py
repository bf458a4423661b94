"""Shared fixtures. XLA runs on the CPU here; torch_xla reads PJRT_DEVICE when it is imported."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")
# XLA:CPU's LLVM back end unoptimised compiles a graph in about half the time (results/ci_time/).
# The tests count compilations and compare outputs, which the optimisation level leaves alone;
# speed is measured in bench/, not here. Set before torch_xla is imported, inherited by the
# processes tests start; a user's own XLA_FLAGS win.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
# The packages the tests build go on an allow-list of their own, not the user's (mrcnn.export.trust).
os.environ.setdefault("MRCNN_TRUSTED_PACKAGES", os.path.join(tempfile.mkdtemp(prefix="mrcnn-tests-"), "trusted.txt"))

# bench/ on the path: the studies' logic that tests check lives beside each study (studies.<question>.*),
# outside the installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import pytest
import torch


def _test_threads() -> int:
    """Torch's threads in the test process: up to two, or MRCNN_TEST_THREADS (``make unit UNIT_THREADS=1``,
    for a machine shared with other work; results/ci_time/ times one thread against two beside the gate)."""
    raw = os.environ.get("MRCNN_TEST_THREADS", "")
    if not raw:
        return max(1, min(2, os.cpu_count() or 1))
    if not raw.isdigit() or int(raw) < 1:
        raise pytest.UsageError(f"MRCNN_TEST_THREADS must be a whole number >= 1, not {raw!r}")
    return int(raw)


def pytest_configure(config):
    torch.set_num_threads(_test_threads())


# Start the XLA runtime before any test runs a CPU backward: torch_xla 2.9 otherwise fails a later
# XLA backward with an internal assert (device_ready_queues_ in autograd's engine).
try:
    import torch_xla

    torch_xla.device()
except ImportError:
    pass


@pytest.fixture(autouse=True)
def _threads_restored():
    """A test that sets torch's thread count (a run, a measurement) leaves the next test the count it found."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_cfg():
    from mrcnn.config import get_config

    return get_config("tiny")


@pytest.fixture(scope="session")
def tiny_weights(tiny_cfg):
    """Non-trivial weights shared by every test that compares with torchvision (computed once)."""
    from mrcnn.weights import synthetic_weights

    return synthetic_weights(tiny_cfg, seed=0)
