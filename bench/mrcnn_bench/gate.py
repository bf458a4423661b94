"""``mrcnn-bench gate``: the one merge gate. Exit 1 when a change costs compiles, accuracy or speed.

Checks, each against a baseline in ``results/``:

1. **Compile counts, exactly.** Each gate case (default: static/inductor and static/xla on the
   tiny preset) runs over :data:`~mrcnn_bench.compile_probe.GATE_SIZES`, images of seven sizes in
   two canvas buckets, in a fresh subprocess (``python -m mrcnn_bench.compile_probe``). Dynamo's
   unique graphs, graph breaks and recompiles, XLA's UncachedCompile and fallback ops, and the
   FLOPs of one eager call must not rise above the baseline
   (``results/baselines/gate_<preset>.json``). When one rises, the message names the metric, the
   change, and why: the guards that failed and the graph-break reasons that dynamo recorded (with
   their frames), and, for XLA, each compilation's cause and the Python frames that triggered it
   (torch_xla's ``PT_XLA_DEBUG_LEVEL=2`` report), with the input shape of the call it happened in.
2. **Accuracy.** :func:`mrcnn_bench.accuracy_gate.check_accuracy` with the CI-sized recipe: box and mask AP
   must stay above the stored baseline minus its tolerance (``results/accuracy/ci.json``).
3. **Latency (optional, ``--latency-against REF``).** The working tree against ``REF``
   interleaved (:mod:`mrcnn_bench.ab`), failing on a flagged regression. CI does not run it:
   absolute times on a shared machine are not a gate, and a pair of installs takes minutes.

``--write-baseline`` records the current compile counts as the new baseline (commit the file with
the change that justifies it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mrcnn_bench import ab
from mrcnn_bench.cases import Case, default_time_limit, default_workload, parse_cases
from mrcnn_bench.compile_probe import CALL_LOG_PREFIX, GATE_SIZES, MEASURE_THREADS, jsonable
from mrcnn_bench.runner import RunOptions
from mrcnn_bench.store import REPO, environment

GATE_CASES = ("static/inductor", "static/xla")
GATED = ("unique_graphs", "graph_breaks", "recompiles", "uncached_compile", "fallback_ops", "flops")
LATENCY_PRESET = "tiny"  # the latency check runs compare's defaults (the gate's --preset is the compile check's)


@dataclass
class GateOptions:
    """What ``mrcnn-bench gate`` checks, and where it writes."""

    preset: str = "tiny"  # of the compile-count cases
    cases: list[Case] = field(default_factory=lambda: parse_cases(",".join(GATE_CASES)))
    baseline: str | None = None  # default: results/baselines/gate_<preset>.json
    write_baseline: bool = False
    skip_compile: bool = False
    accuracy: str = "ci"  # accuracy-gate recipe; "none" skips the check
    checkpoint: str | None = None  # evaluate this instead of training the recipe
    accuracy_out: str | None = None  # keep the accuracy run's training output here
    latency_against: str | None = None  # git ref: also gate latency, the working tree against it
    latency_cases: list[Case] = field(default_factory=lambda: parse_cases("static/eager"))
    latency_rounds: int | None = None  # default: compare's
    inject: str | None = None  # test only: a fault of compile_probe.INJECTIONS
    out: str | None = None  # write the measurements and verdicts as JSON


def baseline_path(preset: str) -> Path:
    return REPO / "results" / "baselines" / f"gate_{preset}.json"


# ------------------------------------------------------------------------------------------------
# Measuring compile counts (in a subprocess, so counters start at zero and XLA debug output is ours)


_ANALYSIS = re.compile(r"^Compilation Analysis: (.*)$")


def xla_compile_causes(log: str) -> list[dict[str, Any]]:
    """torch_xla's ``PT_XLA_DEBUG_LEVEL=2`` compilation reports: cause, graph hash, Python frames, call."""
    causes: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    section = ""
    call = ""
    for line in log.splitlines():
        if line.startswith(CALL_LOG_PREFIX):
            call = line.split(": ", 1)[1]
            continue
        m = _ANALYSIS.match(line)
        if not m:
            continue
        text = m.group(1).rstrip()
        if text.startswith("Compilation Cause"):
            current = {"cause": [], "graph_hash": None, "frames": [], "during": call}
            causes.append(current)
            section = "cause"
        elif current is None:
            continue
        elif text.startswith("Graph Info"):
            section = "graph"
        elif text.startswith("Python Frame Triggered Execution"):
            section = "frames"
        elif text.startswith(("----", "====")):
            section = ""
        elif section == "cause":
            current["cause"].append(text.strip())
        elif section == "graph" and "Graph Hash" in text:
            current["graph_hash"] = text.split(":", 1)[1].strip()
        elif section == "frames":
            current["frames"].append(text.strip())
    return causes


def measure(case_name: str, preset: str, inject: str | None, workdir: Path) -> dict[str, Any]:
    """:func:`~mrcnn_bench.compile_probe.measure_case` in a fresh subprocess; XLA cases with PT_XLA_DEBUG_LEVEL=2."""
    out_file, log_file = workdir / f"{case_name.replace('/', '_')}.json", workdir / "measure.log"
    env = dict(os.environ)
    env.setdefault("PJRT_DEVICE", "CPU")
    if "xla" in case_name:
        env["PT_XLA_DEBUG_LEVEL"] = "2"
    cmd = [sys.executable, "-m", "mrcnn_bench.compile_probe", case_name, preset, str(out_file)]
    cmd += [inject] if inject else []
    with open(log_file, "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    text = log_file.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"measuring {case_name} failed (exit {proc.returncode}):\n{text[-3000:]}")
    result = json.loads(out_file.read_text())
    if "xla" in case_name:
        result["xla_causes"] = xla_compile_causes(text)
    return result


# ------------------------------------------------------------------------------------------------
# Comparing with the baseline


def compile_failures(case_name: str, base: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Messages for every gated metric of ``now`` above ``base``, each with the reasons that explain it."""
    failures = []
    for metric in GATED:
        if metric not in base or metric not in now:
            continue
        b, n = float(base[metric]), float(now[metric])
        if n > b:
            failures.append(f"{case_name}: {metric} rose from {b:g} to {n:g} (+{n - b:g})" + explain(metric, base, now))
        elif metric == "flops" and n != b:
            failures.append(f"{case_name}: flops changed from {b:g} to {n:g} ({n / b - 1:+.2%}); "
                            "FLOPs are deterministic: update the baseline if the change is intended")
    return failures


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


def measure_all(opts: GateOptions) -> dict[str, Any]:
    """Compile counts of every gate case that can run here, each in its own subprocess."""
    measured: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mrcnn-gate-") as tmp:
        for case in opts.cases:
            reason = case.skip_reason()
            if reason:
                print(f"gate: {case.name} skipped ({reason})", file=sys.stderr)
                continue
            print(f"gate: measuring compile counts of {case.name} over {len(GATE_SIZES)} image sizes",
                  file=sys.stderr)
            m = measured[case.name] = measure(case.name, opts.preset, opts.inject, Path(tmp))
            print(f"gate: {case.name}: " + ", ".join(f"{k}={m[k]:g}" for k in GATED if k in m), file=sys.stderr)
    return measured


def check_compiles(opts: GateOptions, report: dict[str, Any]) -> list[str]:
    """Measure, then write the baseline (``write_baseline``) or compare with it: failure messages."""
    path = Path(opts.baseline) if opts.baseline else baseline_path(opts.preset)
    measured = report["compile"] = measure_all(opts)
    if opts.write_baseline:
        doc = {"preset": opts.preset, "sizes": GATE_SIZES, "cases": measured,
               "environment": environment(MEASURE_THREADS, 0)}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"gate: wrote baseline {path}", file=sys.stderr)
        return []
    if not path.is_file():
        return [f"no compile baseline at {path}; create it with `mrcnn-bench gate --write-baseline`"]
    try:
        base = json.loads(path.read_text())["cases"]
    except (ValueError, KeyError) as e:
        return [f"{path}: not a gate baseline ({e})"]
    failures = []
    for name, now in measured.items():
        if name not in base:
            failures.append(f"{name}: not in the baseline {path}; add it with --write-baseline")
            continue
        failures += compile_failures(name, base[name], now)
    return failures


def check_accuracy(opts: GateOptions, report: dict[str, Any]) -> list[str]:
    """The accuracy gate (train the recipe or evaluate the checkpoint): failure messages."""
    # Imported here: it pulls in the training stack, seconds of start-up that the compile and
    # latency checks do not need.
    from mrcnn_bench import accuracy_gate

    options = accuracy_gate.AccuracyOptions(recipe=opts.accuracy, checkpoint=opts.checkpoint,
                                            out_dir=opts.accuracy_out, progress=True)
    result = accuracy_gate.check_accuracy(options)
    report["accuracy"] = {"passed": result.passed, "messages": list(result.messages), "metrics": result.metrics,
                          "wall_time_s": result.wall_time}
    for msg in result.messages:
        print(f"gate: accuracy: {msg}", file=sys.stderr)
    return [] if result.passed else [f"accuracy: {m}" for m in result.failures]


def check_latency(opts: GateOptions, report: dict[str, Any]) -> list[str]:
    """The working tree against ``latency_against``, interleaved: a message per flagged regression."""
    assert opts.latency_against is not None
    run = RunOptions(workload=default_workload(LATENCY_PRESET), rows=[],
                     rounds=opts.latency_rounds or ab.DEFAULT_COMPARE_ROUNDS,
                     time_limit=default_time_limit(LATENCY_PRESET), peak_reps=0, flops=False)
    compare = ab.CompareOptions(opts.latency_against, ".", cases=opts.latency_cases, run=run)
    recs_a, recs_b, _ = ab.run_live(compare)
    table = ab.compare_records(recs_a, recs_b)
    report["latency"] = json.loads(table.to_json(orient="records"))
    print(table.to_markdown(index=False, floatfmt=".4g"), file=sys.stderr)
    return [f"latency: {line['case']}: {line['verdict']}" for _, line in table.iterrows() if line["regression"]]


def run_gate(opts: GateOptions) -> int:
    """Every check asked for; prints the verdict. Exit code: 1 on any failure, else 0."""
    report: dict[str, Any] = {}
    failures: list[str] = []
    if not opts.skip_compile:
        failures += check_compiles(opts, report)
    if opts.accuracy != "none" and not opts.write_baseline:
        failures += check_accuracy(opts, report)
    if opts.latency_against:
        failures += check_latency(opts, report)
    report["failures"] = failures
    if opts.out:
        Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.out).write_text(json.dumps(report, indent=1, default=jsonable) + "\n")
    if failures:
        print("GATE FAILED:\n" + "\n".join(f"  - {f}" for f in failures))
        return 1
    print("gate passed: " + ", ".join(k for k in ("compile", "accuracy", "latency") if k in report))
    return 0
