"""The run loop: build each row, warm it up, then time every row interleaved, round by round.

    for each round: for each row (order rotated every round): time one call

so slow drift of a shared machine hits every row alike. The first call of a row is timed apart
("time to first result", compilation included); warm-up calls every distinct input the rounds will
use (:func:`warmup_calls`), so no compilation lands in a round; the rounds give the median and IQR
of steady state.

What a call is: :mod:`mrcnn_bench.running.pipelines`. Where a row runs: :mod:`mrcnn_bench.running.execution`; by
default each row in a worker process of its own, stopped while the other rows run
(``RunOptions.isolate``), so a row's figures do not depend on its neighbours. Parity is checked
on the timed outputs themselves: each inference row against the reference row (torchvision eager)
of its variant, on the same images.

A run with a journal (``RunOptions.journal``: ``mrcnn-bench run --out``) appends each finished
round to it (:mod:`mrcnn_bench.running.journal`) and turns SIGTERM and SIGINT into a clean stop: the rounds
finished so far are returned with the run marked interrupted. ``resume`` reads the journal back, sets
up and warms up every row again, and times the remaining rounds only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from mrcnn.progress import progress
from mrcnn_bench.base import defaults, timing
from mrcnn_bench.running import backends, ceiling, journal
from mrcnn_bench.running.cases import Case, Row, Workload
from mrcnn_bench.running.context import Context, ContextOptions, make_context, save_context
from mrcnn_bench.running.execution import InProcessRow, RowRunner, RowTimeout, WorkerRow
from mrcnn_bench.running.parity import parity_stats
from mrcnn_bench.running.probes import machine_state, measure_peaks
from mrcnn_bench.running.profile import stage_profile
from mrcnn_bench.running.records import RowResult, RunInfo
from mrcnn_bench.running.row_extras import count_row_flops, evaluate_rows


@dataclass
class RunOptions:
    """Everything ``run`` needs: which rows, on what, how many rounds, what else to measure."""

    workload: Workload
    rows: list[Row]
    rounds: int = defaults.RUN_ROUNDS
    warmup: int = defaults.RUN_WARMUP
    threads: int | None = None  # None: every usable core
    seed: int = 0
    time_limit: float = 120.0  # of a bounded row's set-up + first call, and of each later call
    weights: str | None = None
    coco_root: str | None = None
    coco_split: str = "val2017"  # the split of coco_root whose images are timed
    overrides: dict[str, Any] = field(default_factory=dict)
    fresh_compile_cache: bool = True
    progress: bool = True
    peak_reps: int = 5
    flops: bool = True
    profile: bool = False
    eval_images: int = 0  # COCO mAP of the eager rows on this many images of the evaluation set
    eval_root: str | None = None  # COCO-layout root for it (default: a generated synthetic val set)
    eval_split: str = "val2017"
    journal: Path | None = None  # append each finished round here; SIGTERM / SIGINT stop cleanly
    resume: bool = False  # continue the run this journal holds
    cpus: tuple[int, ...] | None = None  # pin the run (and its workers) to these CPUs; None: as started
    # Each row in a process of its own, paused (SIGSTOP) while other rows run: no row shares a
    # compile cache, global state (autocast), allocator or runtime threads (XLA, inductor's compile
    # pool) with another, so a row's counts and ratio do not depend on which other rows run.
    # False: rows that need no worker (not bounded, same code) share this process, as before.
    isolate: bool = True


class Interrupted(BaseException):
    """A stop signal during a journaled run (a BaseException, so no row's error handling catches it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals(enabled: bool) -> Iterator[None]:
    """SIGTERM and SIGINT raise :class:`Interrupted` in the main thread while the block runs."""
    if not enabled:
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@dataclass
class RunOutput:
    """A finished run: every row's measurements and the run's own information."""

    rows: list[RowResult]
    info: RunInfo


_T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[mrcnn-bench {time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def context_for(opts: RunOptions, threads: int) -> tuple[Context, str]:
    """The run's images and weights (and its description of the weights), built for ``opts``' rows."""
    need_training = any(r.case.phase == "training" and not r.case.skip_reason() for r in opts.rows)
    return make_context(ContextOptions(opts.workload, opts.weights, opts.seed, threads, need_training, opts.coco_root,
                                       opts.coco_split, opts.overrides))


def run(opts: RunOptions, context: tuple[Context, str] | None = None) -> RunOutput:
    """Run every row interleaved (see the module's docstring). ``context``: :func:`context_for` of
    these options, built once by a caller that runs them several times (process pairs)."""
    if opts.cpus:
        os.sched_setaffinity(0, opts.cpus)  # workers started later inherit it
    threads = opts.threads or len(os.sched_getaffinity(0))
    key = journal.run_key(opts, threads)
    # Read before anything is built, so a journal of another run is refused at once.
    previous = journal.read(opts.journal, key) if opts.resume and opts.journal else None
    writer = journal.Writer(opts.journal, key, fresh=previous is None) if opts.journal else None
    torch.set_num_threads(threads)
    torch.manual_seed(opts.seed)
    results = [RowResult(row) for row in opts.rows]
    run_clock = timing.Stopwatch()
    start = restore(results, previous) if previous else 0
    active = [r for r in skip_absent(results) if r.status == "pending"]
    if context is None:
        context = context_for(dataclasses.replace(opts, rows=[r.row for r in active]), threads)
    ctx, weights_desc = context
    log(f"{opts.workload.label}, {len(ctx.images)} image(s), threads {threads}, weights {weights_desc}"
        + (f"; resuming at round {start + 1} of {opts.rounds}" if previous else ""))
    interrupted = ""
    machine = list(previous.machine) if previous else []
    peaks_start = peaks_end = {}
    limit: ceiling.Ceiling | None = None
    with contextlib.ExitStack() as stack:
        try:
            with stop_on_signals(writer is not None):
                if opts.peak_reps:
                    peaks_start = measure_peaks(opts.peak_reps)
                    limit = ceiling.measure({t: peaks_start.get(f"conv3x3_{t}", math.nan) for t in ("fp32", "bf16")})
                    log(f"ceiling {limit.fp32_gflops:.0f} GFLOP/s fp32, {limit.bf16_gflops:.0f} bf16 ({limit.source})")
                runners = setup_rows(active, ctx, opts, stack)
                warm_up(active, runners, opts, images=len(ctx.images))
                timed_rounds(active, runners, opts, images=len(ctx.images), start=start, writer=writer,
                             machine=machine)
        except Interrupted as e:
            interrupted = str(e)
            done = max((len(r.times) for r in results), default=0)
            log(f"interrupted by {interrupted}: keeping the rounds that finished ({done} of {opts.rounds})")
        if not interrupted:
            for r in active:
                runner = runners[r.row.name]
                if isinstance(runner, WorkerRow) and r.row.case.compiler == "inductor" and r.status != "timeout":
                    r.reasons = runner.last_reasons
            if opts.eval_images:
                evaluate_rows([r for r in results if r.status == "ok"], runners, ctx, opts.eval_images, opts.eval_root,
                              opts.eval_split, log)
    if not interrupted:
        peaks_end = measure_peaks(opts.peak_reps) if opts.peak_reps else {}
        if opts.flops:
            count_row_flops(results, ctx, log)
    stages, flops_by_stage, work_by_stage = None, {}, {}
    if opts.profile and not interrupted:
        log("profiling the stages of static and torchvision, eager")
        profiled = stage_profile(ctx)
        stages, flops_by_stage, work_by_stage = profiled.seconds, profiled.flops, profiled.work
    options = {"rounds": opts.rounds, "warmup": opts.warmup, "seed": opts.seed,
               "fresh_compile_cache": opts.fresh_compile_cache, "coco_root": opts.coco_root,
               "coco_split": opts.coco_split, "overrides": opts.overrides,
               # The training rows' processes flush subnormal floats (cases.Row.in_worker); runs
               # stored before this key kept them, and compare refuses to mix the two (ab.settings).
               "subnormals": SUBNORMALS}
    peaks = {k: max(v, peaks_end.get(k, v)) for k, v in peaks_start.items()}
    if limit is not None:  # no kernel beats the machine: one that did proves the ceiling wrong
        limit = ceiling.check(limit, peaks)
        if limit.unreliable:
            log(f"ceiling unreliable, no fraction of it shown: {limit.unreliable}")
    info = RunInfo(stages, opts.workload, peaks, machine, opts.time_limit, weights_desc, run_clock.elapsed(),
                   threads, options, interrupted=interrupted, resumed_from_round=start,
                   ceiling=dataclasses.asdict(limit) if limit else {}, stage_flops=flops_by_stage,
                   stage_work=work_by_stage)
    return RunOutput(results, info)


def restore(results: list[RowResult], previous: journal.Journal) -> int:
    """Put the journal's rounds back into the rows; returns how many rounds they hold.

    A row that stopped in those rounds (timeout, error) keeps its status and is not set up again.
    """
    by_name = {r.row.name: r for r in results}
    for rows in previous.rounds:
        for name, m in rows.items():
            r = by_name[name]
            if m.seconds is not None:
                r.times.append(m.seconds)
            if m.loss is not None:
                r.losses.append(m.loss)
            r.parity.extend(m.parity)
            for k, v in m.counters.items():
                r.counters_rounds[k] = r.counters_rounds.get(k, 0) + v
            if m.status not in ("ok", "pending"):
                r.status, r.detail = m.status, m.detail
    return len(previous.rounds)


def skip_absent(results: list[RowResult]) -> list[RowResult]:
    """Mark the rows whose backend is absent here as skipped; returns the others."""
    active = []
    for r in results:
        reason = r.row.case.skip_reason()
        if reason:
            r.status, r.detail = "skipped", reason
            log(f"{r.row.name}: skipped ({reason})")
        else:
            active.append(r)
    return active


def setup_rows(active: list[RowResult], ctx: Context, opts: RunOptions,
               stack: contextlib.ExitStack) -> dict[str, RowRunner]:
    """A runner per row (closed with ``stack``), in a working folder that workers share."""
    workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mrcnn-bench-")))
    if opts.fresh_compile_cache:
        # A cold cache, so compile times are those of a first run (workers inherit it). Inductor
        # keeps its precompiled C++ header under the temporary folder, not under its cache folder,
        # so the workers get a temporary folder of their own too.
        (workdir / "tmp").mkdir()
        cold = {"TORCHINDUCTOR_CACHE_DIR": str(workdir / "inductor-cache"), "TMPDIR": str(workdir / "tmp")}
        stack.enter_context(mock.patch.dict(os.environ, cold))  # the caller's values come back after
    if any(_in_worker(r.row, opts) for r in active):
        save_context(ctx, workdir)
    runners: dict[str, RowRunner] = {}
    for r in active:
        if _in_worker(r.row, opts):
            # Only a bounded row has a time limit: another row is waited for however long it takes.
            runner: RowRunner = WorkerRow(r.row, workdir, opts.time_limit if r.row.case.bounded else None)
        else:
            runner = InProcessRow(r.row, ctx)
        stack.callback(runner.close)
        runners[r.row.name] = runner
    return runners


def _in_worker(row: Row, opts: RunOptions) -> bool:
    return opts.isolate or row.in_worker


def _call(r: RowResult, runner: RowRunner, index: int, first: bool = False) -> tuple[float, Any]:
    """One timed call; keeps the row's peak memory. Returns (seconds, result)."""
    seconds, result, peak, extra = runner.call(index, first=first)
    r.peak_mem_gb = peak if math.isnan(r.peak_mem_gb) else max(peak, r.peak_mem_gb)
    r.call_mem_gb = extra if math.isnan(r.call_mem_gb) else max(extra, r.call_mem_gb)
    return seconds, result


SUBNORMALS = "flushed to zero in training rows"  # the run option that says so (run files before: "kept")

TRAIN_WARMUP = 2  # training steps before round 1: the second is the first with the optimiser's state


def warmup_calls(row: Row, opts: RunOptions, images: int | None = None) -> int:
    """How many warm-up calls (indices 0, 1, ...) a row gets before round 1; the rounds go on from there.

    At least ``opts.warmup``. An inference call ``i`` takes images ``i*b .. i*b+b-1`` modulo the
    ``images`` of the run (b images per call), so the inputs repeat every ``images / gcd(b, images)``
    calls: warming up that many compiles for every input (image, canvas) the rounds will use, so no
    compilation lands in a timed round. A training step takes the same samples every call, but at
    least two warm-up steps: the optimiser's state (SGD's momentum buffers) exists from the second
    step on, and on XLA that step is a graph of its own (a compilation in round 1 otherwise).
    """
    if row.case.phase == "training":
        return max(opts.warmup, TRAIN_WARMUP)
    n = opts.workload.images if images is None else images
    return max(opts.warmup, n // math.gcd(opts.workload.batch_size, n))


def warm_up(active: list[RowResult], runners: dict[str, RowRunner], opts: RunOptions,
            images: int | None = None) -> None:
    """Set-up and warm-up (:func:`warmup_calls`), row by row; a worker row gets the time limit for
    set-up + first call. ``images``: the run's image count (default: the workload's)."""
    for r in active:
        try:
            _warm_up_row(r, runners[r.row.name], warmup_calls(r.row, opts, images), opts)
            r.status = "ok"
        except RowTimeout as e:
            r.status, r.detail, r.counters_end, r.reasons = "timeout", str(e), e.counters, e.reasons
            log(f"{r.row.name}: TIMEOUT {e}")
        except Exception as e:
            r.status, r.detail = "error", f"{type(e).__name__}: {e}"
            log(f"{r.row.name}: ERROR in set-up/warm-up\n{traceback.format_exc()}")


def _warm_up_row(r: RowResult, runner: RowRunner, calls: int, opts: RunOptions) -> None:
    in_worker = isinstance(runner, WorkerRow)
    bounded = in_worker and runner.limit is not None
    log(f"{r.row.name}: set-up" + (" in its own process" if in_worker else "")
        + (f" (bounded at {opts.time_limit:g} s)" if bounded else ""))
    r.counters_start = runner.counters()
    # Dynamo's reasons are process-wide: keep those the row's own warm-up adds.
    reasons_before = backends.dynamo_reasons() if r.row.case.compiler == "inductor" and not in_worker else None
    r.setup_s, _ = timing.timed(runner.setup)
    if not in_worker:
        r.counters_start = runner.counters()
    for w in range(calls):
        seconds, _ = _call(r, runner, w, first=w == 0)
        r.warmup_s.append(seconds)
        if w == 0:
            r.first_result_s = seconds
            log(f"{r.row.name}: first result in {seconds:.2f} s (set-up {r.setup_s:.1f} s)")
    r.counters_warm = runner.counters()
    if reasons_before is not None:
        r.reasons = _new_reasons(reasons_before, backends.dynamo_reasons())


def _new_reasons(before: dict[str, list[str]], after: dict[str, list[str]]) -> dict[str, list[str]]:
    """The entries of ``after`` beyond those already in ``before`` (as multisets), per kind."""
    return {kind: list((Counter(texts) - Counter(before.get(kind, []))).elements()) for kind, texts in after.items()}


def timed_rounds(active: list[RowResult], runners: dict[str, RowRunner], opts: RunOptions,
                 images: int | None = None, start: int = 0, writer: journal.Writer | None = None,
                 machine: list[dict[str, float]] | None = None) -> list[dict[str, float]]:
    """Rounds ``start`` .. ``opts.rounds - 1``, interleaved; the machine's state before the first and
    after each round is appended to ``machine`` (returned).

    The order rotates every round; each variant's reference row's output of the round is the
    parity oracle for that variant's other inference rows (all inference rows take the same
    images in a round: they share :func:`warmup_calls`). Each finished round goes to ``writer``; a
    round cut short by :class:`Interrupted` is dropped from every row, so all rows keep the same rounds.
    """
    machine = [] if machine is None else machine
    running = [r for r in active if r.status == "ok"]
    rounds: Iterable[int] = progress(range(start, opts.rounds), desc="rounds", unit="round", initial=start,
                                     total=opts.rounds, enabled=opts.progress)
    worker_pids = [w.proc.pid for w in runners.values() if isinstance(w, WorkerRow) and w.proc]
    machine.append(machine_state(worker_pids))
    for rnd, order in timing.schedule(running, "rotate", rounds):
        marks = {r.row.name: _Mark(r) for r in running}
        outputs: dict[Row, Any] = {}
        try:
            for r in order:
                if r.status == "ok":
                    _time_row(r, runners[r.row.name], warmup_calls(r.row, opts, images) + rnd, rnd, outputs)
            _check_parity(running, outputs)
        except Interrupted:
            for r in running:
                marks[r.row.name].rewind(r)
            raise
        with _signals_held():  # the round is kept in memory and in the journal, or in neither
            machine.append(machine_state(worker_pids))
            if writer is not None:
                writer.round(rnd, {r.row.name: marks[r.row.name].since(r) for r in running}, machine[-1])
    return machine


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGTERM and SIGINT wait (pending) until the block ends, then stop the run as usual."""
    stops = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)


class _Mark:
    """A row's measurements before a round: what the round added, or how to take it back."""

    def __init__(self, r: RowResult) -> None:
        self.times, self.losses, self.parity = len(r.times), len(r.losses), len(r.parity)
        self.status, self.detail, self.counters = r.status, r.detail, dict(r.counters_rounds)

    def since(self, r: RowResult) -> journal.RowRound:
        return journal.RowRound(
            status=r.status, detail=r.detail,
            seconds=r.times[-1] if len(r.times) > self.times else None,
            loss=r.losses[-1] if len(r.losses) > self.losses else None,
            parity=r.parity[self.parity:],
            counters={k: v - self.counters.get(k, 0) for k, v in r.counters_rounds.items()
                      if v != self.counters.get(k, 0)})

    def rewind(self, r: RowResult) -> None:
        del r.times[self.times:], r.losses[self.losses:], r.parity[self.parity:]
        r.status, r.detail, r.counters_rounds = self.status, self.detail, dict(self.counters)


def _time_row(r: RowResult, runner: RowRunner, index: int, rnd: int, outputs: dict[Row, Any]) -> None:
    """One timed call of a row in round ``rnd``: its time, its counters' change, its output."""
    # Counters are process-wide: attribute to a row only what changed during its own call
    # (a worker reports its counters with each reply).
    before = (r.counters_end or r.counters_warm) if isinstance(runner, WorkerRow) else runner.counters()
    try:
        seconds, outputs[r.row] = _call(r, runner, index)
        r.times.append(seconds)
    except RowTimeout as e:
        r.status, r.detail, r.counters_end = "timeout", f"in round {rnd + 1}: {e}", e.counters
        r.reasons = e.reasons
        return
    except Exception as e:
        r.status, r.detail = "error", f"in round {rnd + 1}: {type(e).__name__}: {e}"
        log(f"{r.row.name}: ERROR in round {rnd + 1}\n{traceback.format_exc()}")
        return
    after = runner.counters()
    r.counters_end = after
    for k, v in _delta(before, after).items():
        r.counters_rounds[k] = r.counters_rounds.get(k, 0) + v
    if r.row.case.phase == "training":
        r.losses.append(outputs[r.row]["loss"])


def _delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: b[k] - a.get(k, 0) for k in b if isinstance(b[k], (int, float))}


def _check_parity(running: list[RowResult], outputs: dict[Row, Any]) -> None:
    """Each inference row's outputs of the round against its variant's reference row's."""
    for r in running:
        ref = Row(Case("torchvision"), r.row.variant)
        if r.row.case.phase == "inference" and r.row in outputs and ref in outputs and r.row != ref:
            r.parity.extend(parity_stats(a, b) for a, b in zip(outputs[ref], outputs[r.row], strict=True))
