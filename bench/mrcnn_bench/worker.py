"""A row in its own process: ``python -m mrcnn_bench.worker RUN_DIR ROW_DIR``.

JSON commands arrive on stdin (``{"cmd": "call", "index": i, "out": path}`` or ``{"cmd": "exit"}``);
replies go to the original stdout, one JSON line each; the call's result is saved to ``out``.
Everything else that prints (torch, XLA) goes to ``ROW_DIR/worker.log``. A heartbeat thread writes
``ROW_DIR/status.json`` (phase, compile counters) twice a second, so a worker killed at its time
limit still tells how far it got.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path


def import_mrcnn_from(code: str) -> None:
    """Make ``import mrcnn`` load the checkout ``code``, ahead of any installed or editable ``mrcnn``.

    PYTHONPATH alone is not enough: an editable install's import hook can come first.
    """
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("mrcnn", [code])
    if spec is None or spec.loader is None:
        raise RuntimeError(f"{code}: no mrcnn package to import")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mrcnn"] = module
    spec.loader.exec_module(module)


def main(run_dir: Path, row_dir: Path) -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever else prints goes to the log, not into the protocol
    code = json.loads((row_dir / "row.json").read_text())["variant"]["code"]
    if code:
        import_mrcnn_from(code)
    import torch

    from mrcnn_bench.cases import Case
    from mrcnn_bench.runner import Pipeline, Row, Variant, load_context, timed_call

    spec = json.loads((row_dir / "row.json").read_text())
    variant = spec["variant"]
    row = Row(Case(**spec["case"]), Variant(variant["label"], variant["code"],
                                            tuple(tuple(kv) for kv in variant["overrides"])))
    state: dict = {"phase": "setup", "counters": {}}
    t_start = time.monotonic()
    pipeline: Pipeline | None = None

    def reasons() -> dict:
        from mrcnn_bench.backends import dynamo_reasons

        return dynamo_reasons() if row.case.compiler == "inductor" else {}

    def write_status() -> None:
        state["elapsed_s"] = time.monotonic() - t_start
        tmp = row_dir / "status.json.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, row_dir / "status.json")

    def heartbeat() -> None:
        while True:
            with contextlib.suppress(Exception):  # counters are read while the main thread writes them
                # Not during set-up: reading counters imports torch_xla, which would race (and
                # deadlock) with the main thread's own import of it.
                if pipeline is not None and state["phase"] != "setup":
                    state["counters"] = pipeline.counters()
                    state["reasons"] = reasons()
                write_status()
            time.sleep(0.5)

    threading.Thread(target=heartbeat, daemon=True).start()
    try:
        ctx = load_context(run_dir)
        torch.set_num_threads(ctx.threads)
        built = Pipeline(row, ctx)
        built.setup()
    except Exception:
        print(json.dumps({"event": "error", "error": traceback.format_exc(limit=8)}), file=proto)
        return 1
    pipeline = built
    state["phase"] = "first call"
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
            state["phase"] = f"call {calls + 1}"
            state["counters"] = pipeline.counters()
            reply = {"ok": True, "seconds": seconds, "peak_gb": peak, "delta_gb": extra,
                     "counters": state["counters"], "reasons": reasons()}
        except Exception:
            reply = {"ok": False, "error": traceback.format_exc(limit=8)}
        print(json.dumps(reply), file=proto)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
