"""One commit measured for the history across commits (asv): every tracked figure, in a few processes.

:func:`measure_commit` runs, one after another and each in a fresh subprocess of the interpreter
asv installed the commit into:

- :data:`SHARED_PROCESSES` processes of ``python -m mrcnn_bench.history.shared_rounds``: the inference cases
  of :data:`mrcnn_bench.running.cases.TRACKED` timed against one ruler in the same rounds, the eager ones
  stage by stage; pooled across processes (:func:`mrcnn_bench.history.interleaved.pool`: the median of the
  processes' median ratios). The first process runs the compile probe of each compiled case before
  it builds anything (the backends' own counters, and the case's cold first call as its time to first
  result), and the memory and FLOP probes after its rounds. A compiled case with a compiler of its
  own (inductor) is timed in :data:`COMPILED_PROCESSES` processes only, from :data:`COMPILED_FROM`
  on: each process pays for loading its compiled graphs (results/asv/README.md, "Shared rounds");
- each training case against the ruler's training step in one process (``python -m
  mrcnn_bench.history.interleaved``), after the first shared process;
- the exact work counters of each inference case, stage by stage, on its eager CPU stand-in (``python -m
  mrcnn_bench.history.stage_work``), after every timed process: one call per distinct model, nothing timed;
- the fixed checkpoint's AP with the commit's inference (``mrcnn-bench asv fixture``).

The commit's processes share an inductor cache and a cache of the run's inputs (calibrated weights,
images), both in a temporary folder made for this commit and removed after it: the first process
compiles cold, so its figures are a fresh machine's, and the later ones load what it made.

A part that fails keeps its error text and the others still report: asv then shows the metrics of
that part as failed for this commit, never as a number (the work counters' as skipped: a count that
cannot be made is no figure of the commit's speed).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mrcnn_bench.base import timing
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.history.interleaved import CaseRecord, pool
from mrcnn_bench.running.cases import CASES, TRACKED

_BENCH = str(Path(__file__).resolve().parents[2])  # so that subprocesses import this same harness
PART_TIMEOUT_S = 900.0
SHARED_PROCESSES = 4  # shared-rounds processes per commit
COMPILED_PROCESSES = 2  # of them, those that also time the cases with a compiler (inductor)
# The first of those: 0 is the process that ran their compile probe, 1 the next. Where the probe
# ran, inductor's ratio drew a higher level of its own in two studies, but not when the two plans
# were alternated on one VM, where neither was less noisy (results/asv/README.md, "The two
# inductor plans"): the history keeps 0, and its series with it.
COMPILED_FROM = 0
SHARED_BUDGET_S = 16.0  # seconds of timed rounds per shared process
TRAIN_BUDGET_S = 20.0  # seconds of timed rounds of each training case (one process)
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


def run_part(args: Sequence[str], timeout: float = PART_TIMEOUT_S, env: dict[str, str] | None = None) -> Part:
    """``python -m ARGS... OUT.json`` in a fresh process, with ``env`` added to this one's; exit 2
    means "cannot run here" (skipped)."""
    with tempfile.TemporaryDirectory(prefix="mrcnn_history_") as tmp:
        out = Path(tmp) / "record.json"
        env = {
            **os.environ,
            **(env or {}),
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
    """Everything measured for one commit: by case, the timing against the ruler, the compile
    counts and the work counters (record: stage key -> counter -> count); and the fixed checkpoint's
    accuracy."""

    timing: dict[str, Part]
    compiles: dict[str, Part]
    accuracy: Part
    work: dict[str, Part] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def compiled(case: str) -> bool:
    c = CASES[case]
    return c.phase == "inference" and (c.backend == "xla" or c.compiler != "eager")


def shared_plan(
    cases: Sequence[str], processes: int = SHARED_PROCESSES, compiled_from: int = COMPILED_FROM
) -> list[list[str]]:
    """The inference cases of each shared process: the cases without a compiler of their own in
    every one, those with one (inductor) in :data:`COMPILED_PROCESSES` processes from
    ``compiled_from`` on (fewer where the processes end first)."""
    if not 0 <= compiled_from < processes:
        raise UsageError(f"compiled_from must be 0 to {processes - 1} with {processes} processes, got {compiled_from}")
    own = range(compiled_from, min(processes, compiled_from + COMPILED_PROCESSES))
    return [[c for c in cases if p in own or CASES[c].compiler == "eager"] for p in range(processes)]


def measure_commit(
    cases: Sequence[str] = TRACKED, budget_s: float = SHARED_BUDGET_S, accuracy: bool = True,
    processes: int = SHARED_PROCESSES, train_budget_s: float = TRAIN_BUDGET_S, compiled_from: int = COMPILED_FROM,
) -> CommitRecord:
    """Measure the ``mrcnn`` this interpreter imports (a progress line per part on stderr).

    ``budget_s``: seconds of timed rounds per shared process; ``processes``: how many of those;
    ``compiled_from``: the first of them that times inductor (:func:`shared_plan`). The first
    process runs the compile probe of every compiled case, timed there or not, and a compiled case's
    time to first result is its probe's cold first call.
    """
    # context loads torch: asv imports this module to list the suite
    from mrcnn_bench.running.context import CONTEXT_CACHE_ENV

    skipped = {c: Part(None, f"{c}: {r}", 0.0, skipped=True) for c in cases if (r := CASES[c].skip_reason())}
    inference = [c for c in cases if CASES[c].phase == "inference" and c not in skipped]
    training = [c for c in cases if CASES[c].phase == "training" and c not in skipped]
    plan_cases = [names for names in shared_plan(inference, processes, compiled_from) if names]
    probed = [c for c in inference if compiled(c)]
    first_probes = ["--probes", "--compile-probe"]
    if plan_cases and [c for c in plan_cases[0] if compiled(c)] != probed:
        first_probes += ["--probe-cases", ",".join(probed)]
    shared = [
        ["mrcnn_bench.history.shared_rounds", "--cases", ",".join(names), "--budget-s", str(budget_s),
         *(first_probes if p == 0 else [])]
        for p, names in enumerate(plan_cases)
    ]
    plan: list[tuple[str, list[str]]] = [("shared", a) for a in shared[:1]]
    plan += [("training", ["mrcnn_bench.history.interleaved", c, "--budget-s", str(train_budget_s)]) for c in training]
    plan += [("shared", a) for a in shared[1:]]
    if inference:
        plan.append(("work", ["mrcnn_bench.history.stage_work", "--cases", ",".join(inference)]))
    if accuracy:
        plan.append(("accuracy", ["mrcnn_bench.history.fixed_accuracy", "evaluate"]))
    timing: dict[str, list[Part]] = {}
    compiles: dict[str, Part] = {c: skipped[c] for c in skipped if compiled(c)}
    work: dict[str, Part] = {c: skipped[c] for c in skipped if CASES[c].phase == "inference"}
    acc = Part(None, "accuracy not measured", 0.0, skipped=True)
    with tempfile.TemporaryDirectory(prefix="mrcnn_commit_") as tmp:
        env = {"TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor"), CONTEXT_CACHE_ENV: str(Path(tmp) / "inputs")}
        for k, (kind, args) in enumerate(plan, 1):
            named = args[2] if kind in ("shared", "work") else args[1] if kind == "training" else ""
            what = f"{kind} {named}".rstrip()
            print(f"[{k}/{len(plan)}] {what}", file=sys.stderr, flush=True)
            part = run_part(args, env=env) if kind != "work" else counted(args, env)
            state = "skipped" if part.skipped else ("failed" if part.error else "done")
            print(f"[{k}/{len(plan)}] {what}: {state} in {part.seconds:.0f} s", file=sys.stderr, flush=True)
            if kind == "training":
                timing.setdefault(args[1], []).append(part)
            elif kind == "accuracy":
                acc = part
            elif kind == "work":
                work.update(split_shared(part, args[2].split(","), "work"))
            else:
                names = args[2].split(",")
                for name, case_part in split_shared(part, names).items():
                    timing.setdefault(name, []).append(case_part)
                if "--compile-probe" in args:
                    compiles.update(split_shared(part, probed, "compiles"))
    pooled = {case: pooled_part(ps) for case, ps in timing.items()}
    for case, probe in compiles.items():  # the cold first call, wherever the case was timed
        first = (probe.record or {}).get("first_call_s")
        if first is not None and case in pooled and pooled[case].record is not None:
            pooled[case] = dataclasses.replace(pooled[case], record={**pooled[case].record, "first_result_s": first})
    return CommitRecord({**pooled, **skipped}, compiles, acc, work)


def counted(args: Sequence[str], env: dict[str, str]) -> Part:
    """The work counters' part: whatever goes wrong there (even here, in this process) is its error,
    never the commit's; asv skips its benchmarks."""
    try:
        part = run_part(args, env=env)
        record = part.record
        if record is not None and not (isinstance(record, dict) and isinstance(record.get("work"), dict)):
            return Part(None, f"{' '.join(args)}: no work record", part.seconds)
        return part
    except Exception as e:  # the counts are extra: no failure of theirs may cost the commit its timing
        return Part(None, f"{' '.join(args)}: {type(e).__name__}: {e}", 0.0)


def split_shared(part: Part, names: Sequence[str], kind: str = "timing") -> dict[str, Part]:
    """One shared process's outcome as a part per case: its record of ``kind`` ("timing",
    "compiles" or, from the work counters' process, "work"), or the process's error for every case;
    each case is given an equal share of the process's seconds."""
    share = part.seconds / max(1, len(names))
    if part.record is None:
        return {n: dataclasses.replace(part, seconds=share) for n in names}
    records = part.record.get(kind, {})
    return {n: Part(records[n], None, share) if n in records else Part(None, f"{n}: no {kind} record", share)
            for n in names}


def pooled_part(parts: Sequence[Part]) -> Part:
    """The processes of one case as one part; the first that failed or was skipped if any did (a
    figure from fewer processes than planned is not the figure the history tracks)."""
    seconds = sum(p.seconds for p in parts)
    bad = next((p for p in parts if p.record is None), None)
    if bad is not None:
        return dataclasses.replace(bad, seconds=seconds)
    records = [CaseRecord.from_dict(p.record) for p in parts if p.record is not None]
    return Part(pool(records).to_dict(), None, seconds)
