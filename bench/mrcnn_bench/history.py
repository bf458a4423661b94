"""One commit measured for the history across commits (asv): every tracked figure, each in its own process.

:func:`measure_commit` runs, one after another and each in a fresh subprocess of the interpreter
asv installed the commit into:

- every case of :data:`mrcnn_bench.cases.TRACKED` timed against the ruler in as many processes as
  :data:`PROCESSES` gives its phase (``python -m mrcnn_bench.interleaved``), each with its share of
  the case's time budget, process ``p`` of every case before process ``p + 1`` of any, then pooled
  (:func:`mrcnn_bench.interleaved.pool`: the median of the processes' median ratios);
- the compile probe of each compiled case (``python -m mrcnn_bench.compile_probe``: one call per
  gate size, the backends' own counters);
- the fixed checkpoint's AP with the commit's inference (``python -m mrcnn_bench.fixed_accuracy``).

A part that fails keeps its error text and the others still report: asv then shows the metrics of
that part as failed for this commit, never as a number.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrcnn_bench import timing
from mrcnn_bench.cases import CASES, QUICK_WORKLOAD, TRACKED
from mrcnn_bench.interleaved import DEFAULT_BUDGET_S, CaseRecord, pool

_BENCH = str(Path(__file__).resolve().parents[1])  # so that subprocesses import this same harness
PART_TIMEOUT_S = 900.0
# Processes per timed case and commit, by the case's phase. An inference process draws a speed level
# of its own that its rounds cannot average away, so each inference case is timed in several and
# their medians pooled; a training step is long enough that one process's rounds hold its level, and
# splitting its budget leaves too few steps per process (results/asv/README.md, "Processes").
PROCESSES = {"inference": 5, "training": 1}
# Tracked compile counters: name shown in asv -> key of the compile probe's record. A case has the
# counters of its backend or compiler only (XLA's two, or dynamo's three).
COUNTERS = {
    "xla_compiles": "uncached_compile",
    "fallback_ops": "fallback_ops",
    "graphs": "unique_graphs",
    "graph_breaks": "graph_breaks",
    "recompiles": "recompiles",
}


@dataclass(frozen=True)
class Part:
    """One subprocess's outcome: its JSON record, or why there is none."""

    record: dict[str, Any] | None
    error: str | None
    seconds: float
    skipped: bool = False  # the part cannot run here (an absent backend, no fixture): not a failure

    def value(self, key: str) -> float:
        """A number from the record; raises with the part's own error when it has none."""
        if self.record is None:
            raise RuntimeError(self.error or "no record")
        v = self.record[key]
        if v is None:
            raise RuntimeError(f"{key} was not measured")
        return float(v)


def run_part(args: Sequence[str], timeout: float = PART_TIMEOUT_S) -> Part:
    """``python -m ARGS... OUT.json`` in a fresh process; exit 2 means "cannot run here" (skipped)."""
    with tempfile.TemporaryDirectory(prefix="mrcnn_history_") as tmp:
        out = Path(tmp) / "record.json"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([_BENCH, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        }
        wall = timing.Stopwatch()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", *args, str(out)], env=env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return Part(None, f"{' '.join(args)}: no result in {timeout:.0f} s", wall.elapsed())
        seconds = wall.elapsed()
        if proc.returncode == 0 and out.is_file():
            return Part(json.loads(out.read_text()), None, seconds)
        tail = "\n".join(proc.stderr.strip().splitlines()[-20:])
        return Part(None, f"{' '.join(args)} exited {proc.returncode}:\n{tail}", seconds, skipped=proc.returncode == 2)


@dataclass(frozen=True)
class CommitRecord:
    """Everything measured for one commit: by case, the timing against the ruler and the compile
    counts; and the fixed checkpoint's accuracy."""

    timing: dict[str, Part]
    compiles: dict[str, Part]
    accuracy: Part

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def compiled(case: str) -> bool:
    c = CASES[case]
    return c.phase == "inference" and (c.backend == "xla" or c.compiler != "eager")


def processes_for(case: str, processes: int | None = None) -> int:
    """Processes that time ``case``: ``processes`` if given, else :data:`PROCESSES` of its phase."""
    return processes if processes is not None else PROCESSES[CASES[case].phase]


def measure_commit(
    cases: Sequence[str] = TRACKED, budget_s: float = DEFAULT_BUDGET_S, accuracy: bool = True,
    processes: int | None = None,
) -> CommitRecord:
    """Measure the ``mrcnn`` this interpreter imports (a progress line per part on stderr).

    ``processes`` times every case in that many processes; None: :func:`processes_for` each case.
    """
    count = {c: processes_for(c, processes) for c in cases}
    plan: list[tuple[str, str, list[str]]] = [
        ("timing", c, ["mrcnn_bench.interleaved", c, "--budget-s", str(budget_s / count[c])])
        for p in range(max(count.values(), default=0)) for c in cases if p < count[c]
    ]
    plan += [("compiles", c, ["mrcnn_bench.compile_probe", c, QUICK_WORKLOAD.preset]) for c in cases if compiled(c)]
    if accuracy:
        plan.append(("accuracy", "", ["mrcnn_bench.fixed_accuracy", "evaluate"]))
    timing: dict[str, list[Part]] = {}
    parts: dict[str, dict[str, Part]] = {"compiles": {}, "accuracy": {}}
    for k, (kind, case, args) in enumerate(plan, 1):
        print(f"[{k}/{len(plan)}] {kind} {case}".rstrip(), file=sys.stderr, flush=True)
        part = run_part(args)
        state = "skipped" if part.skipped else ("failed" if part.error else "done")
        print(
            f"[{k}/{len(plan)}] {kind} {case}: {state} in {part.seconds:.0f} s".replace("  ", " "),
            file=sys.stderr,
            flush=True,
        )
        if kind == "timing":
            timing.setdefault(case, []).append(part)
        else:
            parts[kind][case] = part
    no_accuracy = Part(None, "accuracy not measured", 0.0, skipped=True)
    pooled = {case: pooled_part(ps) for case, ps in timing.items()}
    return CommitRecord(pooled, parts["compiles"], parts["accuracy"].get("", no_accuracy))


def pooled_part(parts: Sequence[Part]) -> Part:
    """The processes of one case as one part; the first that failed or was skipped if any did (a
    figure from fewer processes than planned is not the figure the history tracks)."""
    seconds = sum(p.seconds for p in parts)
    bad = next((p for p in parts if p.record is None), None)
    if bad is not None:
        return dataclasses.replace(bad, seconds=seconds)
    records = [CaseRecord.from_dict(p.record) for p in parts if p.record is not None]
    return Part(pool(records).to_dict(), None, seconds)
