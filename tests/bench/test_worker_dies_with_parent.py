"""A killed harness leaves no worker behind: the kernel SIGKILLs a row's worker when its parent dies,
even while the worker is stopped (SIGSTOP) between calls, as workers are."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from mrcnn_bench.running.execution import dies_with_parent

PARENT = """
import subprocess, sys, time
from mrcnn_bench.running.execution import dies_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                         preexec_fn=dies_with_parent())
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return state not in ("", "Z") and not state.startswith("Z")


@pytest.mark.skipif(dies_with_parent() is None, reason="PR_SET_PDEATHSIG is Linux's")
def test_a_stopped_worker_dies_with_its_killed_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        os.kill(child, signal.SIGSTOP)
        assert _alive(child)
        parent.kill()  # SIGKILL: the parent runs no clean-up of its own
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), f"worker {child} outlived its killed parent"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
