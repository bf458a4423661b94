"""A row in its own process: ``python -m mrcnn_bench.running.worker RUN_DIR ROW_DIR``.

JSON commands arrive on stdin (``{"cmd": "call", "index": i, "out": path}`` or ``{"cmd": "exit"}``);
replies go to the original stdout, one JSON line each; the call's result is saved to ``out``.
Everything else that prints (torch, XLA) goes to ``ROW_DIR/worker.log``. A heartbeat thread writes
``ROW_DIR/status.json`` (phase, compile counters) twice a second, so a worker killed at its time
limit still tells how far it got. A training row's worker treats subnormal floats as zero from its
first statement on (:func:`mrcnn_bench.running.backends.flush_subnormals`), before any CPU thread exists.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mrcnn_bench.base.files import atomic_write


def import_mrcnn_from(code: str) -> None:
    """Make ``import mrcnn`` load the checkout ``code``, ahead of any installed or editable ``mrcnn``.

    PYTHONPATH alone is not enough: an editable install's import hook can come first.
    """
    spec = importlib.machinery.PathFinder.find_spec("mrcnn", [code])
    if spec is None or spec.loader is None:
        raise RuntimeError(f"{code}: no mrcnn package to import")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mrcnn"] = module
    spec.loader.exec_module(module)


class _Status:
    """``ROW_DIR/status.json``, rewritten twice a second by a heartbeat thread: phase, counters, reasons."""

    def __init__(self, row_dir: Path) -> None:
        self.row_dir = row_dir
        self.state: dict[str, Any] = {"phase": "setup", "counters": {}}
        self.t_start = time.monotonic()
        self.counters: Callable[[], dict] | None = None  # set once the pipeline is built
        self.reasons: Callable[[], dict] = dict

    def write(self) -> None:
        self.state["elapsed_s"] = time.monotonic() - self.t_start
        # Rewritten twice a second and read by the parent: whole, but not flushed to disk each time.
        atomic_write(self.row_dir / "status.json", json.dumps(self.state), durable=False)

    def beat(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # counters are read while the main thread writes them
                # Not during set-up: reading counters imports torch_xla, which would race (and
                # deadlock) with the main thread's own import of it.
                if self.counters is not None and self.state["phase"] != "setup":
                    self.state["counters"] = self.counters()
                    self.state["reasons"] = self.reasons()
                self.write()
            time.sleep(0.5)


def main(run_dir: Path, row_dir: Path) -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever else prints goes to the log, not into the protocol
    spec = json.loads((row_dir / "row.json").read_text())
    status = _Status(row_dir)
    # From here on, set-up counts against the row's time limit and the status file says so.
    threading.Thread(target=status.beat, daemon=True).start()
    try:
        # Imported here, inside the row's error handling: torch, the backends and the cases first
        # (they import no mrcnn), so that the row can flush subnormals before any CPU thread exists.
        import torch

        from mrcnn_bench.running.backends import dynamo_reasons, flush_subnormals
        from mrcnn_bench.running.cases import Row

        row = Row.from_dict(spec)
        if row.case.flushes_subnormals:
            flush_subnormals()  # first, before any thread of the CPU pool exists
        if spec["variant"]["code"]:
            import_mrcnn_from(spec["variant"]["code"])
        # Imported only now: these import mrcnn, which must be the variant's checkout set above.
        from mrcnn_bench.running.context import load_context
        from mrcnn_bench.running.execution import timed_call
        from mrcnn_bench.running.pipelines import Pipeline

        ctx = load_context(run_dir)
        torch.set_num_threads(ctx.threads)
        pipeline = Pipeline(row, ctx)
        pipeline.setup()
    except Exception:
        print(json.dumps({"event": "error", "error": traceback.format_exc(limit=8)}), file=proto)
        return 1
    if row.case.compiler == "inductor":
        status.reasons = dynamo_reasons
    status.counters, status.state["phase"] = pipeline.counters, "first call"
    print(json.dumps({"event": "ready"}), file=proto)
    calls = 0
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "exit":
            break
        try:
            seconds, result, peak, extra = timed_call(pipeline, msg["index"])
            torch.save(result, msg["out"])
            calls += 1
            status.state["phase"] = f"call {calls + 1}"
            status.state["counters"] = pipeline.counters()
            reply = {"ok": True, "seconds": seconds, "peak_gb": peak, "delta_gb": extra,
                     "counters": status.state["counters"], "reasons": status.reasons()}
        except Exception:
            reply = {"ok": False, "error": traceback.format_exc(limit=8)}
        print(json.dumps(reply), file=proto)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
