"""Running a row: in this process (:class:`InProcessRow`) or in a worker process (:class:`WorkerRow`).

Both answer ``setup()``, then ``call(index) -> (seconds, result, peak GB, call's extra GB)``,
``counters()`` and ``close()``. A row runs in a worker subprocess (``python -m mrcnn_bench.running.worker``)
by default (``RunOptions.isolate``), and always when it may never finish (``Case.bounded``: killed
at the time limit, reported as "> limit" with the compile counts it reached), when its variant
imports other code (``compare A B`` across two checkouts), or when it trains (its process flushes
subnormal floats from the start: :func:`mrcnn_bench.running.backends.flush_subnormals`). A worker is
stopped (SIGSTOP, its whole process group) except during its own calls, so nothing of an idle row
(runtime threads, inductor's compile workers) runs while another row is timed. The protocol is
:mod:`mrcnn_bench.running.worker`'s.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from mrcnn_bench.base import timing
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.running import backends
from mrcnn_bench.running.cases import Row
from mrcnn_bench.running.context import Context
from mrcnn_bench.running.pipelines import Pipeline

CallResult = tuple[float, Any, float, float]  # (seconds, result, peak memory GB, peak minus memory before GB)


class RowRunner(Protocol):
    """What the run loop drives: :class:`InProcessRow` or :class:`WorkerRow`."""

    def setup(self) -> None: ...

    def call(self, index: int, first: bool = False) -> CallResult: ...

    def counters(self) -> dict[str, float]: ...

    def close(self) -> None: ...


class RowTimeout(Exception):
    """The worker passed its time limit; ``detail`` says how far it got."""

    def __init__(self, limit: float, detail: str, counters: dict | None = None, reasons: dict | None = None) -> None:
        super().__init__(f"> {limit:g} s ({detail})" if detail else f"> {limit:g} s")
        self.limit, self.detail, self.counters, self.reasons = limit, detail, counters or {}, reasons or {}


class RowError(Exception):
    """The row failed: the worker reported an exception, sent nonsense or exited."""


class InProcessRow:
    """``setup()`` once, then ``call(index) -> (seconds, result, peak GB, call's extra GB)``."""

    def __init__(self, row: Row, ctx: Context) -> None:
        self.pipeline = Pipeline(row, ctx)

    def setup(self) -> None:
        self.pipeline.setup()

    def call(self, index: int, first: bool = False) -> CallResult:
        return timed_call(self.pipeline, index)

    def counters(self) -> dict[str, float]:
        return self.pipeline.counters()

    def close(self) -> None:
        pass


def timed_call(pipeline: Pipeline, index: int) -> CallResult:
    """(seconds, result, peak memory GB, peak minus memory before the call GB) of one call."""
    before = backends.memory_reset(pipeline.device)
    seconds, result = timing.timed(pipeline.call, index)
    peak = backends.memory_peak(pipeline.device)
    return seconds, result, peak, peak - before


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def dies_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when this process dies (Linux; None
    elsewhere). A killed harness would otherwise leave its workers behind, and a worker stopped with
    SIGSTOP between calls ignores every signal but SIGKILL."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def arm() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the request: nobody would send it
            os._exit(1)

    return arm


class WorkerRow:
    """A row run by ``python -m mrcnn_bench.running.worker`` in its own process group, stopped between calls.

    The time limit (None: none) bounds set-up plus the first call (time to first result), and then
    each call.
    The worker writes its compile counters to ``status.json`` every half second (and after each
    call), so a killed worker still says how far it got. ``PYTHONPATH`` puts the variant's
    checkout (if any) first, so its ``mrcnn`` is the one imported; the harness is this one.
    """

    def __init__(self, row: Row, workdir: Path, limit: float | None) -> None:
        self.row, self.limit = row, None if limit is None else float(limit)
        self.dir = workdir / row.name.replace("/", "_").replace(":", "_")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self._buf = b""
        self._deadline = 0.0
        self.last_counters: dict[str, float] = {}
        self.last_reasons: dict[str, list[str]] = {}

    def setup(self) -> None:
        """Start the worker and wait until it has built its model (counts against the first call)."""
        env = dict(os.environ)
        harness = str(Path(__file__).resolve().parents[2])  # bench/: where mrcnn_bench lies
        paths = [p for p in (self.row.variant.code, harness, env.get("PYTHONPATH")) if p]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        atomic_write((self.dir / "row.json"), json.dumps(self.row.to_dict()))
        self._log = open(self.dir / "worker.log", "wb")  # noqa: SIM115 (closed in close())
        self._set_deadline()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mrcnn_bench.running.worker", str(self.workdir), str(self.dir)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env,
            start_new_session=True,  # its own process group: killing it kills inductor's compile workers too
            preexec_fn=dies_with_parent(),
        )
        msg = self._receive()
        if msg.get("event") != "ready":
            raise RowError(msg.get("error") or f"worker sent {msg} instead of 'ready'")
        self._signal(signal.SIGSTOP)

    def call(self, index: int, first: bool = False) -> CallResult:
        if not first:
            self._set_deadline()
        out = self.dir / "outputs.pt"
        self._signal(signal.SIGCONT)
        try:
            self._send({"cmd": "call", "index": index, "out": str(out)})
            msg = self._receive()
        finally:
            self._signal(signal.SIGSTOP)
        if not msg.get("ok"):
            raise RowError(msg.get("error", f"bad reply {msg}"))
        self.last_counters = msg.get("counters", {})
        self.last_reasons = msg.get("reasons") or {}
        result = torch.load(out, weights_only=True)
        out.unlink()
        return float(msg["seconds"]), result, float(msg["peak_gb"]), float(msg["delta_gb"])

    def counters(self) -> dict[str, float]:
        return dict(self.last_counters)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self._signal(signal.SIGCONT)
                self._send({"cmd": "exit"})
                self.proc.wait(timeout=10)
        self._kill()
        with contextlib.suppress(Exception):
            self._log.close()

    def _set_deadline(self) -> None:
        self._deadline = math.inf if self.limit is None else time.monotonic() + self.limit

    def _signal(self, signum: int) -> None:
        """``signum`` to the worker's whole process group (inductor's compile workers too); after
        SIGSTOP, waits (up to a second) until the worker is stopped: delivery is asynchronous."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)
        if signum == signal.SIGSTOP:
            deadline = time.monotonic() + 1.0
            while process_state(self.proc.pid) not in ("T", "t", "Z", "X", "") and time.monotonic() < deadline:
                time.sleep(0.001)

    def _kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(Exception):
                pipe.close()

    def _send(self, msg: dict) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError as e:
            raise RowError(f"worker exited: {self.log_tail()}") from e

    def _receive(self) -> dict:
        """Next JSON line from the worker, before the deadline; kills the worker on timeout."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            if b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                with contextlib.suppress(ValueError):
                    return json.loads(line)
                continue
            remaining = self._deadline - time.monotonic()
            timeout = None if math.isinf(remaining) else max(0.0, remaining)
            ready = select.select([fd], [], [], timeout)[0] if remaining > 0 else []
            if not ready:
                status = self._read_status()
                self._kill()
                raise RowTimeout(self.limit, describe_status(status), status.get("counters"), status.get("reasons"))
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self._kill()
                raise RowError(f"worker exited with code {self.proc.returncode}: {self.log_tail()}")
            self._buf += chunk

    def _read_status(self) -> dict:
        try:
            return json.loads((self.dir / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def log_tail(self, n: int = 1500) -> str:
        with contextlib.suppress(Exception):
            self._log.flush()
            return (self.dir / "worker.log").read_bytes()[-n:].decode(errors="replace").strip()
        return ""


def process_state(pid: int) -> str:
    """The state letter of a process from /proc (T: stopped, S: sleeping, R: running); "" if unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2]


def describe_status(status: dict) -> str:
    """'in first call, UncachedCompile=12, ...' from a worker's last status.json."""
    if not status:
        return "no status from the worker yet"
    parts = [f"in {status.get('phase', '?')}"]
    c = status.get("counters", {})
    if "uncached_compile" in c:
        parts.append(f"UncachedCompile={c['uncached_compile']}, XLA CompileTime={c['compile_s']:.0f} s, "
                     f"fallback ops={c.get('fallback_ops', '?')}")
    if "unique_graphs" in c:
        parts.append(f"dynamo graphs={c['unique_graphs']}, graph breaks={c['graph_breaks']}")
    return ", ".join(parts)
