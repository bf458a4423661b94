"""Rows do not share a process: each row of a run has a worker of its own, stopped while others run.

Two rows in one process share dynamo's cache of ``MaskRCNN.forward`` (so one row's recompiles cite
another row's autocast state), the allocator, and runtime threads (XLA's, inductor's compile
workers). Structural checks only: no timing in any assertion.
"""

from __future__ import annotations

import contextlib
import os

import pytest

from mrcnn_bench.running.cases import Case, Row, Workload
from mrcnn_bench.running.context import Context, save_context
from mrcnn_bench.running.execution import InProcessRow, WorkerRow, process_state
from mrcnn_bench.running.records import RowResult
from mrcnn_bench.running.runner import RunOptions, setup_rows

ROWS = [Row(Case("torchvision")), Row(Case("static")), Row(Case("static", compiler="inductor")),
        Row(Case("torchvision", compiler="inductor", bounded=True))]


def _runners(isolate: bool) -> dict:
    ctx = Context("tiny", {}, Workload(), {}, [], [], 1, 0)
    opts = RunOptions(workload=Workload(), rows=ROWS, isolate=isolate, time_limit=120.0)
    results = [RowResult(row) for row in ROWS]
    with contextlib.ExitStack() as stack:
        return setup_rows(results, ctx, opts, stack)  # nothing started yet: runners start at setup()


def test_every_row_gets_a_worker_of_its_own_by_default():
    runners = _runners(True)
    assert all(isinstance(r, WorkerRow) for r in runners.values())
    assert len({r.dir for r in runners.values()}) == len(ROWS)
    # Only the bounded row has a time limit; the others are waited for however long they take.
    assert [r.limit is not None for r in runners.values()] == [False, False, False, True]


def test_in_process_keeps_only_bounded_rows_in_workers():
    runners = _runners(False)
    kinds = [type(r) for r in runners.values()]
    assert kinds == [InProcessRow, InProcessRow, InProcessRow, WorkerRow]


@pytest.mark.slow
def test_a_worker_is_stopped_except_during_its_own_calls(tmp_path, tiny_weights):
    from mrcnn.weights import textured_images

    ctx = Context("tiny", {}, Workload(), tiny_weights, textured_images(((240, 320),), 0), [], 1, 0)
    save_context(ctx, tmp_path)
    row = WorkerRow(Row(Case("static")), tmp_path, limit=None)
    try:
        row.setup()
        assert row.proc is not None
        pid = row.proc.pid
        assert process_state(pid) == "T", "a ready worker waits stopped"
        seconds, result, peak, _ = row.call(0, first=True)
        assert seconds > 0 and peak > 0 and len(result) == 1
        assert process_state(pid) == "T", "stopped again after its call"
        row.call(1)
        assert process_state(pid) == "T"
    finally:
        row.close()
    assert row.proc.poll() is not None, "close() ends a stopped worker"
    assert process_state(pid) in ("", "Z", "X")


def test_a_fresh_compile_cache_gives_workers_their_own_header_folder_too(monkeypatch):
    # Inductor's precompiled C++ header goes under the temporary folder, not its cache folder: a
    # worker that inherited the machine's TMPDIR would find it built, and its compile would not be cold.
    monkeypatch.setenv("TMPDIR", "/somewhere/else")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    ctx = Context("tiny", {}, Workload(), {}, [], [], 1, 0)
    opts = RunOptions(workload=Workload(), rows=ROWS[:1], isolate=True, time_limit=120.0)
    with contextlib.ExitStack() as stack:
        (runner,) = setup_rows([RowResult(ROWS[0])], ctx, opts, stack).values()
        workdir = runner.dir.parent
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(workdir / "inductor-cache")
        assert os.environ["TMPDIR"] == str(workdir / "tmp") and (workdir / "tmp").is_dir()
    assert os.environ["TMPDIR"] == "/somewhere/else"  # restored, not dropped
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
