"""Subnormal floats: training rows' processes flush them, checked in every CPU thread; compare refuses
to mix runs that flushed with runs that kept them; the probe's counter counts only subnormals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from studies.training_subnormals import subnormal_steps

from mrcnn_bench.gates import ab
from mrcnn_bench.running import runner
from mrcnn_bench.running.cases import Case, Row, Workload
from mrcnn_bench.running.records import Record, RunDocument, RunInfo

REPO = Path(__file__).resolve().parents[2]

# In a fresh interpreter with 2 CPU threads: flush (before or after a parallel op), then count the
# values of a parallel product over the smallest subnormal float32 that did not come out zero.
_CHILD = """
import sys, torch
from mrcnn_bench.running.backends import flush_subnormals
torch.set_num_threads(2)
if sys.argv[1] == "late":
    (torch.ones(1 << 21) * 2).sum()  # starts the CPU thread pool before the flush
try:
    flush_subnormals()
    print("flushed")
except RuntimeError as e:
    print("refused:", e)
x = torch.ones(1 << 21, dtype=torch.int32).view(torch.float32)  # the smallest subnormal, by its bits
print("survivors", int((x * 1.0).count_nonzero()))
"""


def _child(when: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO / "bench")}
    out = subprocess.run([sys.executable, "-c", _CHILD, when], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to have a second thread to check")
def test_flushing_first_reaches_every_thread():
    assert _child("early").split() == ["flushed", "survivors", "0"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to have a second thread to check")
def test_flushing_after_the_thread_pool_started_is_refused_not_half_done():
    out = _child("late")
    assert "refused:" in out and "call it before the process's first parallel op" in out
    assert "survivors 0" not in out  # the refusal left the mode as it was: nothing flushed


def test_training_rows_always_get_a_process_of_their_own():
    assert Row(Case("static", phase="training")).in_worker
    assert Row(Case("torchvision", phase="training")).in_worker
    assert not Row(Case("static")).in_worker


def _doc(phase: str, subnormals: str | None) -> RunDocument:
    options = {"rounds": 3, "overrides": {}} | ({"subnormals": subnormals} if subnormals else {})
    recs = [Record(row=c, case=c, phase=phase, status="ok", preset="tiny", image_size="240x320",
                   env={"threads": 2, "cpu": "x"}) for c in ("torchvision/train", "static/train")]
    return RunDocument("r", {}, RunInfo(workload=Workload("tiny"), threads=2, options=options), recs)


def test_compare_refuses_training_runs_that_flushed_against_runs_that_kept_subnormals():
    with pytest.raises(ValueError, match=f"subnormals \\(A: kept; B: {runner.SUBNORMALS}\\)"):
        ab.check_comparable(_doc("training", None), _doc("training", runner.SUBNORMALS))
    ab.check_comparable(_doc("training", runner.SUBNORMALS), _doc("training", runner.SUBNORMALS))
    # Inference rows never flushed: a stored inference run from before still compares.
    ab.check_comparable(_doc("inference", None), _doc("inference", runner.SUBNORMALS))


def test_subnormals_counts_only_nonzero_values_below_the_smallest_normal():
    tiny = torch.finfo(torch.float32).tiny
    t = torch.tensor([0.0, tiny, tiny / 2, -tiny / 4, 1e-45, 1.0, -0.0])
    assert subnormal_steps.subnormals([t]) == 3  # tiny/2, -tiny/4 and 1e-45 (the smallest subnormal)
    assert subnormal_steps.subnormals([t.to(torch.bfloat16), t]) == 3  # only float32 tensors are counted
