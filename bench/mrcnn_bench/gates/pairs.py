"""``compare A B`` live: K pairs of fresh processes, A and B alternating which starts first.

A process settles at a speed level of its own that its rounds cannot average away
(``results/latency_gate_live/``, ``results/stored_compare_aa/``), so one process per side gives a
verdict on one draw of levels, however many rounds it times. Here pair k is one run of
:func:`mrcnn_bench.running.runner.run` with a fresh worker per side, timing an even number of
interleaved rounds after its warm-up (the order inside a round rotates, so each side runs first in
half of them); pairs alternate which side's process is set up first. Each pair contributes one
value, its mean log ratio B/A, and :func:`mrcnn_bench.gates.stats.compare_pairs` tests across the
pairs, so the between-process component is inside the interval by construction.

What is measured once is measured by the first pair only: the ceiling and the FLOPs; the images
and weights are built once and handed to every pair's workers. Every pair writes compiled code to
one compile cache of the comparison's own, cold at the start (so the first pair's first-result
times are a cold start's; ``--reuse-compile-cache``: the caller's cache instead), so a later pair's
inductor worker loads its kernels instead of compiling them again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from unittest import mock

from mrcnn.progress import progress
from mrcnn_bench.base import timing
from mrcnn_bench.running import runner, store
from mrcnn_bench.running.cases import Case, Row, Variant
from mrcnn_bench.running.records import Record, RunDocument, to_document


@dataclass(frozen=True)
class Pair:
    """One pair of processes: A's and B's records of the same run, and which started first."""

    a: list[Record]
    b: list[Record]
    a_first: bool
    doc: RunDocument
    seconds: float  # the pair's wall time: set-up, warm-up and rounds of both processes


@contextlib.contextmanager
def shared_compile_cache(fresh: bool = True) -> Iterator[None]:
    """One inductor cache for every pair, cold at the start and removed at the end (``fresh``; else
    the caller's cache, as ``--reuse-compile-cache`` asks). Inductor keeps its precompiled C++
    header under the temporary folder, so the workers get one of their own too, as a run with a
    fresh compile cache does."""
    if not fresh:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="mrcnn-pairs-") as tmp:
        os.mkdir(os.path.join(tmp, "tmp"))
        cold = {"TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor-cache"), "TMPDIR": os.path.join(tmp, "tmp")}
        with mock.patch.dict(os.environ, cold):
            yield


def run_pairs(run: runner.RunOptions, cases: list[Case], variants: tuple[Variant, Variant], pairs: int,
              log: Callable[[str], None] = runner.log) -> list[Pair]:
    """``pairs`` runs of ``cases`` x (A, B), each with fresh workers; even pairs set up A first."""
    if pairs < 1 or (pairs > 1 and run.rounds % 2):  # the command checks its flags before this
        raise ValueError(f"{pairs} pairs of {run.rounds} rounds: pairs must be 1, or more with an even round count")
    va, vb = variants
    out: list[Pair] = []
    # Images and weights are built once: only the processes are fresh in each pair.
    context = runner.context_for(dataclasses.replace(run, rows=[Row(c, va) for c in cases]),
                                 run.threads or len(run.cpus or os.sched_getaffinity(0)))
    with shared_compile_cache(run.fresh_compile_cache):
        # One bar over the pairs; a pair's own bar over its rounds only when there is one pair.
        for k in progress(range(pairs), desc="process pairs", unit="pair", enabled=run.progress and pairs > 1):
            a_first = k % 2 == 0
            order = (va, vb) if a_first else (vb, va)
            rows = [Row(c, v) for c in cases for v in order]
            first = k == 0
            opts = dataclasses.replace(
                run, rows=rows, fresh_compile_cache=False,
                peak_reps=run.peak_reps if first else 0, flops=run.flops and first,
                progress=run.progress and pairs == 1)
            if pairs > 1:
                log(f"pair {k + 1} of {pairs}: {'A' if a_first else 'B'} set up first")
            clock = timing.Stopwatch()
            result = runner.run(opts, context)
            doc = to_document(result.rows, result.info, "compare", store.environment(result.info.threads, run.seed))
            out.append(Pair([r for r in doc.records if r.variant == "A"], [r for r in doc.records if r.variant == "B"],
                            a_first, doc, clock.elapsed()))
    return out
