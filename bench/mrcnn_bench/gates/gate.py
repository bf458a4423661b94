"""``mrcnn-bench gate``: the one merge gate. Exit 1 when a change costs compiles, accuracy or speed.

Checks, each against a baseline in ``baselines/``:

1. **Compile counts, exactly.** Each gate case (default: static/inductor and static/xla on the
   tiny preset) runs over :data:`~mrcnn_bench.gates.compile_probe.GATE_SIZES`, images of seven sizes in
   two canvas buckets, in a fresh subprocess (``python -m mrcnn_bench.gates.compile_probe``). Dynamo's
   unique graphs, graph breaks and recompiles, XLA's UncachedCompile and fallback ops, and the
   FLOPs of one eager call must equal the baseline (``baselines/gate_<preset>.json``):
   a rise fails, and so does a fall, so that the baseline ratchets down (re-baseline with
   ``mrcnn-bench gate --write-baseline --accuracy none``). When one rises, the message names the metric, the
   change, and why: the guards that failed and the graph-break reasons that dynamo recorded (with
   their frames), and, for XLA, each compilation's cause and the Python frames that triggered it
   (torch_xla's ``PT_XLA_DEBUG_LEVEL=2`` report), with the input shape of the call it happened in.
2. **Accuracy.** :func:`mrcnn_bench.gates.accuracy_gate.check_accuracy` with the CI-sized recipe: box and mask AP
   must stay above the stored baseline minus its tolerance (``baselines/accuracy/ci.json``).
3. **Latency (optional, ``--latency-against REF``).** The working tree against ``REF`` in process
   pairs, as ``compare`` runs them (:mod:`mrcnn_bench.gates.ab`), failing on a flagged regression. CI does not run it:
   absolute times on a shared machine are not a gate, and a pair of installs takes minutes.

``--write-baseline`` records the current compile counts as the new baseline (commit the file with
the change that justifies it); only from a git tree that is clean outside ``baselines/``.

The gate never passes on nothing. Every input (baselines, ``--checkpoint``, ``--latency-against``,
the cases) is checked before anything is measured, and a gate that cannot decide exits 2: a case
(requested, or in the baseline) that cannot run here or whose measurement crashed, a gated metric
present on one side only, a case absent from the baseline. Exit codes: 0 passed, 1 a check failed
(this wins over 2), 2 could not decide.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mrcnn.recipes import get_recipe
from mrcnn_bench.base import defaults, vcs
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.gates import ab, latency_check
from mrcnn_bench.gates.accuracy_baseline import default_baseline_path, load_baseline
from mrcnn_bench.gates.compile_probe import GATE_SIZES, GATE_TRAIN_COUNTS, MEASURE_THREADS, jsonable, xla_compile_causes
from mrcnn_bench.running.cases import Case, parse_cases
from mrcnn_bench.running.store import REPO, environment

GATED = ("unique_graphs", "graph_breaks", "recompiles", "uncached_compile", "fallback_ops", "flops")
REBASELINE = "mrcnn-bench gate --write-baseline --accuracy none"


@dataclass
class GateOptions:
    """What ``mrcnn-bench gate`` checks, and where it writes."""

    preset: str = "tiny"  # of the compile-count cases
    cases: list[Case] | None = None  # default: the baseline's cases (defaults.GATE_CASES when writing the baseline)
    baseline: str | None = None  # default: baselines/gate_<preset>.json
    write_baseline: bool = False
    require_clean_tree: bool = True  # write a baseline in the repo only from a tree clean outside baselines/
    skip_compile: bool = False
    accuracy: str = "ci"  # accuracy-gate recipe; "none" skips the check
    checkpoint: str | None = None  # evaluate this instead of training the recipe
    accuracy_out: str | None = None  # keep the accuracy run's training output here
    # The baseline's seeds were trained on one thread each: the gate trains like them (the same
    # reductions in the same order), and leaves the other cores to what runs beside it (make test).
    accuracy_threads: int = 1
    latency_against: str | None = None  # git ref: also gate latency, the working tree against it
    latency_cases: list[Case] = field(default_factory=lambda: parse_cases(defaults.COMPARE_CASES))
    latency_rounds: int | None = None  # default: compare's
    latency_pairs: int = defaults.COMPARE_PAIRS  # process pairs of the latency check
    inject: str | None = None  # test only: a fault of defaults.INJECTIONS
    out: str | None = None  # write the measurements and verdicts as JSON
    progress: bool = True  # of the accuracy check's training (mrcnn.progress)


@dataclass
class Verdict:
    """What the checks found: ``failures`` (exit 1) and what kept them from deciding (``undecided``, exit 2)."""

    failures: list[str] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)

    def extend(self, other: Verdict) -> None:
        self.failures += other.failures
        self.undecided += other.undecided


class MeasureError(Exception):
    """A case's measurement subprocess failed: the gate cannot decide about that case."""


def baseline_path(preset: str) -> Path:
    return REPO / defaults.BASELINES_DIR / f"gate_{preset}.json"


def compile_baseline_path(opts: GateOptions) -> Path:
    return Path(opts.baseline) if opts.baseline else baseline_path(opts.preset)


def rebaseline_command(opts: GateOptions) -> str:
    """The command that rewrites this gate's compile baseline."""
    extra = (f" --preset {opts.preset}" if opts.preset != "tiny" else "") + (
        f" --baseline {opts.baseline}" if opts.baseline else "")
    return REBASELINE + extra


# ------------------------------------------------------------------------------------------------
# Inputs, all checked before anything is measured (ValueError: exit 2, one line)


def check_inputs(opts: GateOptions) -> tuple[list[Case], dict[str, Any]]:
    """The compile cases to measure and their baseline ({} when writing it).

    ValueError naming every bad input found, in one line: the files and refs given on the command line
    first, then the recipe and the baselines, then the cases that cannot run here.
    """
    if opts.skip_compile and opts.accuracy == "none" and not opts.latency_against:
        raise UsageError("nothing to check: --skip-compile with --accuracy none and no --latency-against")
    if opts.skip_compile and opts.write_baseline:
        raise UsageError("--write-baseline writes compile counts; it cannot go with --skip-compile")
    problems: list[str] = []
    accuracy = opts.accuracy != "none" and not opts.write_baseline
    if accuracy and opts.checkpoint is not None and not Path(opts.checkpoint).exists():
        problems.append(f"--checkpoint {opts.checkpoint}: no such file or folder")
    if opts.latency_against and not is_code(opts.latency_against):
        problems.append(f"--latency-against {opts.latency_against!r} is neither a directory nor a git ref of {REPO}")
    rounds = opts.latency_rounds or defaults.COMPARE_ROUNDS
    if opts.latency_against and 1 < opts.latency_pairs < defaults.MIN_PAIRS:
        problems.append(f"--latency-pairs {opts.latency_pairs}: a test across pairs needs {defaults.MIN_PAIRS} or "
                        "more; 1 times one process per side")
    if opts.latency_against and opts.latency_pairs > 1 and rounds % 2:
        problems.append(f"--latency-rounds {rounds}: must be even with --latency-pairs above 1 (each side first "
                        "in half)")
    if accuracy:
        try:
            get_recipe(opts.accuracy)  # TrainSetupError (a UsageError) for an unknown recipe
            load_baseline(default_baseline_path(opts.accuracy), opts.accuracy)  # BaselineError is a UsageError
        except UsageError as e:
            problems.append(str(e))
    cases: list[Case] = []
    base: dict[str, Any] = {}
    if not opts.skip_compile:
        try:
            cases, base = compile_inputs(opts)
        except UsageError as e:
            problems.append(str(e))
    if len(problems) > 1:
        raise UsageError(f"{len(problems)} problems: " + "; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1)))
    if problems:
        raise UsageError(problems[0])
    return cases, base


def compile_inputs(opts: GateOptions) -> tuple[list[Case], dict[str, Any]]:
    """The compile cases (every one must run here) and the baseline's cases (each must hold them)."""
    path = compile_baseline_path(opts)
    if opts.write_baseline:
        if opts.inject:
            raise UsageError("--inject with --write-baseline would record the fault as the baseline")
        check_clean_tree(opts)
        base: dict[str, Any] = {}
        cases = opts.cases or parse_cases(",".join(defaults.GATE_CASES))
    else:
        base = load_compile_baseline(path, opts.preset)
        cases = opts.cases or parse_cases(",".join(base))
        absent = [c.name for c in cases if c.name not in base]
        if absent:
            raise UsageError(f"{', '.join(absent)}: not in the baseline {path}; add with `{rebaseline_command(opts)}`")
        for name in sorted(set(base) - {c.name for c in cases}):
            print(f"gate: {name} of the baseline is not among --cases: not checked", file=sys.stderr)
    unmeasurable = [f"{c.name} ({c.skip_reason()})" for c in cases if c.skip_reason()]
    if unmeasurable:
        raise UsageError(f"cannot measure {'; '.join(unmeasurable)}: the gate cannot decide without it")
    return cases, base


def load_compile_baseline(path: Path, preset: str) -> dict[str, Any]:
    """The ``cases`` of a compile baseline file measured on ``preset``; ValueError when it is not one."""
    if not path.is_file():
        raise UsageError(f"no compile baseline at {path}; create it with `{REBASELINE}`")
    try:
        doc = json.loads(path.read_text())
        cases = doc["cases"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise UsageError(f"{path}: not a gate baseline ({type(e).__name__}: {e})") from None
    if not isinstance(cases, dict) or not cases:
        raise UsageError(f"{path}: not a gate baseline (no cases)")
    if doc.get("preset", preset) != preset:
        raise UsageError(f"{path} holds preset {doc['preset']!r}, not {preset!r}: the counts are not comparable")
    for name, entry in cases.items():
        # Checked before anything is measured: a NaN count compares false both ways and would pass.
        if not isinstance(entry, dict) or not any(m in entry for m in GATED):
            raise UsageError(f"{path}: case {name!r} holds no gated metric ({', '.join(GATED)})")
        for metric in GATED:
            v = entry.get(metric)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v < 0):
                raise UsageError(f"{path}: case {name!r}: {metric} must be a finite count >= 0, got {v!r}")
    return cases


def dirty_files(repo: Path = REPO) -> list[str] | None:
    """Files changed since HEAD or untracked, outside ``baselines/``; None when git cannot tell."""
    changed = vcs.output(repo, "--no-optional-locks", "diff", "--name-only", "HEAD")
    untracked = vcs.output(repo, "--no-optional-locks", "ls-files", "--others", "--exclude-standard")
    if changed is None or untracked is None:
        return None
    files = sorted(set(changed.splitlines()) | set(untracked.splitlines()))
    return [f for f in files if f and not f.startswith(f"{defaults.BASELINES_DIR}/")]


def check_clean_tree(opts: GateOptions) -> None:
    """ValueError unless the tree is clean outside baselines/: a baseline must be the counts of a commit.

    Only for a baseline inside the repository (one that can be committed); a scratch one elsewhere
    (a test's temporary folder) is written from any tree.
    """
    if not opts.require_clean_tree or not compile_baseline_path(opts).resolve().is_relative_to(REPO):
        return
    dirty = dirty_files()
    if dirty is None:
        raise UsageError(f"--write-baseline needs a git checkout, and {REPO} is not one (or git is missing)")
    if dirty:
        shown = ", ".join(dirty[:10]) + (f" and {len(dirty) - 10} more" if len(dirty) > 10 else "")
        raise UsageError(
            f"--write-baseline needs a tree clean outside {defaults.BASELINES_DIR}/; commit or revert: {shown}"
        )


def is_code(spec: str) -> bool:
    """A checkout directory or a git ref of this repository (what ``compare`` runs live)."""
    return Path(spec).is_dir() or vcs.commit_of(REPO, spec) is not None


# ------------------------------------------------------------------------------------------------
# Measuring compile counts (in a subprocess, so counters start at zero and XLA debug output is ours)


def measure(case_name: str, preset: str, inject: str | None, workdir: Path) -> dict[str, Any]:
    """:func:`~mrcnn_bench.gates.compile_probe.measure_case` in a fresh subprocess; XLA cases with PT_XLA_DEBUG_LEVEL=2.

    Raises :class:`MeasureError` when the subprocess fails, after printing the end of its log.
    """
    out_file, log_file = workdir / f"{case_name.replace('/', '_')}.json", workdir / "measure.log"
    env = dict(os.environ)
    env.setdefault("PJRT_DEVICE", "CPU")
    if "xla" in case_name:
        env["PT_XLA_DEBUG_LEVEL"] = "2"
    cmd = [sys.executable, "-m", "mrcnn_bench.gates.compile_probe", case_name, preset, str(out_file)]
    cmd += [inject] if inject else []
    with open(log_file, "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    text = log_file.read_text(errors="replace")
    if proc.returncode != 0:
        print(f"gate: the log of {case_name}'s measurement ends:\n{text[-3000:]}", file=sys.stderr)
        raise MeasureError(f"{case_name}: its measurement failed (exit {proc.returncode}; the log's end is above)")
    result = json.loads(out_file.read_text())
    if "xla" in case_name:
        result["xla_causes"] = xla_compile_causes(text)
    return result


# ------------------------------------------------------------------------------------------------
# Comparing with the baseline


def compile_failures(case_name: str, base: dict[str, Any], now: dict[str, Any],
                     rebaseline: str = REBASELINE) -> list[str]:
    """Messages for every gated metric of ``now`` that differs from ``base``; a rise explains itself.

    A fall fails too: the baseline must ratchet down with it (``rebaseline`` says how). A metric on
    one side only is not compared here: :func:`missing_metrics` reports it.
    """
    failures = []
    for metric in GATED:
        if base.get(metric) is None or now.get(metric) is None:
            continue
        b, n = float(base[metric]), float(now[metric])
        if n > b:
            failures.append(f"{case_name}: {metric} rose from {b:g} to {n:g} (+{n - b:g})" + explain(metric, base, now))
        elif metric == "flops" and n != b:
            failures.append(f"{case_name}: flops changed from {b:g} to {n:g} ({n / b - 1:+.2%}); "
                            f"FLOPs are deterministic: if the change is intended, re-baseline with `{rebaseline}`")
        elif n < b:
            failures.append(f"{case_name}: {metric} fell from {b:g} to {n:g} ({n - b:g}): an improvement, so "
                            f"ratchet the baseline down: re-baseline with `{rebaseline}` and commit it")
    return failures


def missing_metrics(case_name: str, base: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """A message for each gated metric that one side has and the other lacks (or holds as null)."""
    out = []
    for metric in GATED:
        in_base, in_now = base.get(metric) is not None, now.get(metric) is not None
        if in_base != in_now:
            side = "this measurement" if in_base else "the baseline"
            out.append(f"{case_name}: {metric} is missing from {side}, so it cannot be compared")
    return out


def explain(metric: str, base: dict[str, Any], now: dict[str, Any]) -> str:
    """Why a count rose: the calls where it grew, dynamo's reasons, torch_xla's causes and frames."""
    lines = []
    grew = [c for c, b in zip(now.get("per_call", []), base.get("per_call", [])) if c.get(metric, 0) > b.get(metric, 0)]
    if grew:
        lines.append(f"first above the baseline after the call on image {grew[0]['image']} (HxW)")
    reasons = now.get("reasons") or {}
    if metric in ("recompiles", "unique_graphs"):
        lines += [f"recompile: {r}" for r in reasons.get("recompiles", [])[:8]]
    if metric in ("graph_breaks", "unique_graphs"):
        lines += [f"graph break: {r}" for r in reasons.get("graph_breaks", [])[:8]]
    if metric == "uncached_compile":
        known = {c.get("graph_hash") for c in base.get("xla_causes", [])}
        for c in now.get("xla_causes", []):
            if c.get("graph_hash") in known:
                continue
            frames = [f for f in c["frames"] if "site-packages" not in f][:4] or c["frames"][:4]
            lines.append(f"XLA compiled a new graph {c['graph_hash']} during {c['during'] or '?'}; cause: "
                         f"{' '.join(c['cause'])}; Python frames: {' <- '.join(frames)}")
    return "".join(f"\n    {line}" for line in lines)


# ------------------------------------------------------------------------------------------------
# The checks


def measure_all(opts: GateOptions, cases: list[Case]) -> tuple[dict[str, Any], list[str]]:
    """Compile counts of each case, each in its own subprocess, and a message for each that failed."""
    measured: dict[str, Any] = {}
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="mrcnn-gate-") as tmp:
        for case in cases:
            inputs = (f"{len(GATE_TRAIN_COUNTS)} training steps" if case.phase == "training"
                      else f"{len(GATE_SIZES)} image sizes")
            print(f"gate: measuring compile counts of {case.name} over {inputs}",
                  file=sys.stderr)
            try:
                m = measured[case.name] = measure(case.name, opts.preset, opts.inject, Path(tmp))
            except MeasureError as e:
                failed.append(str(e))
                continue
            print(f"gate: {case.name}: " + ", ".join(f"{k}={m[k]:g}" for k in GATED if k in m), file=sys.stderr)
    return measured, failed


def check_compiles(opts: GateOptions, cases: list[Case], base: dict[str, Any], report: dict[str, Any]) -> Verdict:
    """Measure ``cases``, then write the baseline (``write_baseline``) or compare with ``base``."""
    path = compile_baseline_path(opts)
    measured, failed = measure_all(opts, cases)
    report["compile"] = measured
    verdict = Verdict(undecided=failed)
    if opts.write_baseline:
        if failed:
            verdict.undecided.append(f"baseline {path} not written: a case could not be measured")
            return verdict
        doc = {"preset": opts.preset, "sizes": GATE_SIZES, "cases": measured,
               "environment": environment(MEASURE_THREADS, 0)}
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(doc, indent=1) + "\n")
        print(f"gate: wrote baseline {path}", file=sys.stderr)
        return verdict
    for name, now in measured.items():
        verdict.undecided += missing_metrics(name, base[name], now)
        verdict.failures += compile_failures(name, base[name], now, rebaseline_command(opts))
    return verdict


def check_accuracy(opts: GateOptions, report: dict[str, Any]) -> list[str]:
    """The accuracy gate (train the recipe or evaluate the checkpoint): failure messages."""
    # Imported here: it pulls in the training stack, seconds of start-up that the compile and
    # latency checks do not need.
    from mrcnn_bench.gates import accuracy_gate

    options = accuracy_gate.AccuracyOptions(recipe=opts.accuracy, checkpoint=opts.checkpoint,
                                            out_dir=opts.accuracy_out, progress=opts.progress,
                                            threads=opts.accuracy_threads)
    result = accuracy_gate.check_accuracy(options)
    report["accuracy"] = {"passed": result.passed, "messages": list(result.messages), "metrics": result.metrics,
                          "wall_time_s": result.wall_time}
    for msg in result.messages:
        print(f"gate: accuracy: {msg}", file=sys.stderr)
    return [] if result.passed else [f"accuracy: {m}" for m in result.failures]


def check_latency(opts: GateOptions, report: dict[str, Any]) -> Verdict:
    """The working tree against ``latency_against``, in process pairs as ``compare`` runs them: a
    failure per flagged regression."""
    assert opts.latency_against is not None
    run = latency_check.run_options(opts.latency_rounds or defaults.COMPARE_ROUNDS)
    compare = ab.CompareOptions(opts.latency_against, ".", cases=opts.latency_cases, run=run,
                                pairs=opts.latency_pairs)
    table = ab.live_table(ab.run_live(compare), None, compare.alpha)
    report["latency"] = json.loads(table.to_json(orient="records"))
    compared = set(table["case"]) if not table.empty else set()
    verdict = Verdict(undecided=[f"latency: {c.name} did not run on both sides" for c in opts.latency_cases
                                 if c.name not in compared])
    if not table.empty:
        print(table.to_markdown(index=False, floatfmt=".4g"), file=sys.stderr)
        verdict.failures = [f"latency: {line['case']}: {line['verdict']}" for _, line in table.iterrows()
                            if line["regression"]]
    return verdict


def run_gate(opts: GateOptions) -> int:
    """Every check asked for; prints the verdict. Exit code: 1 on a failure, else 2 if undecided, else 0.

    Raises ValueError (exit 2) for a bad input, before anything is measured.
    """
    cases, base = check_inputs(opts)
    report: dict[str, Any] = {}
    verdict = Verdict()
    if not opts.skip_compile:
        verdict.extend(check_compiles(opts, cases, base, report))
    if opts.accuracy != "none" and not opts.write_baseline:
        verdict.failures += check_accuracy(opts, report)
    if opts.latency_against:
        verdict.extend(check_latency(opts, report))
    report["failures"], report["undecided"] = verdict.failures, verdict.undecided
    if opts.out:
        Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(opts.out, json.dumps(report, indent=1, default=jsonable) + "\n")
    return print_verdict(verdict, [k for k in ("compile", "accuracy", "latency") if k in report])


def print_verdict(verdict: Verdict, checked: list[str]) -> int:
    """The verdict on stdout; its exit code."""
    if verdict.failures:
        print("GATE FAILED:\n" + "\n".join(f"  - {f}" for f in verdict.failures))
    if verdict.undecided:
        print("GATE COULD NOT DECIDE:\n" + "\n".join(f"  - {u}" for u in verdict.undecided))
    if verdict.failures:
        return 1
    if verdict.undecided:
        return 2
    print("gate passed: " + ", ".join(checked))
    return 0
