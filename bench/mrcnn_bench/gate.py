"""``mrcnn-bench gate``: the one merge gate. Exit 1 when a change costs compiles, accuracy or speed.

Checks, each against a baseline in ``results/``:

1. **Compile counts, exactly.** Each gate case (default: static/inductor and static/xla on the
   tiny preset) runs over :data:`GATE_SIZES`, images of seven sizes in two canvas buckets, in a
   fresh subprocess. Dynamo's unique graphs, graph breaks and recompiles, XLA's UncachedCompile
   and fallback ops, and the FLOPs of one eager call must not rise above the baseline
   (``results/baselines/gate_<preset>.json``). When one rises, the message names the metric, the
   change, and why: the guards that failed and the graph-break reasons that dynamo recorded (with
   their frames), and, for XLA, each compilation's cause and the Python frames that triggered it
   (torch_xla's ``PT_XLA_DEBUG_LEVEL=2`` report), with the input shape of the call it happened in.
2. **Accuracy.** :func:`mrcnn.accuracy.check_accuracy` with the CI-sized recipe: box and mask AP
   must stay above the stored baseline minus its tolerance (``results/accuracy/ci.json``).
3. **Latency (optional, ``--latency-against REF``).** The working tree against ``REF``
   interleaved (:mod:`mrcnn_bench.ab`), failing on a flagged regression. CI does not run it:
   absolute times on a shared machine are not a gate, and a pair of installs takes minutes.

``--write-baseline`` records the current compile counts as the new baseline (commit the file with
the change that justifies it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mrcnn_bench.store import REPO, environment

GATE_CASES = ("static/inductor", "static/xla")
# Five landscape sizes that share the tiny preset's (320, 448) canvas, then two portrait ones (448, 320).
# Their aspect ratios differ, so resized they are 320 x 369..426: padded tightly (as torchvision pads)
# they would make three shapes. A static model compiles once per canvas bucket, whatever the sizes.
GATE_SIZES = ((240, 320), (250, 300), (260, 300), (270, 330), (230, 300), (320, 240), (300, 250))
GATED = ("unique_graphs", "graph_breaks", "recompiles", "uncached_compile", "fallback_ops", "flops")
INJECTIONS = ("recompile",)
_MEASURE_THREADS = max(1, min(2, os.cpu_count() or 1))  # counts do not depend on it; compile time does


def baseline_path(preset: str) -> Path:
    return REPO / "results" / "baselines" / f"gate_{preset}.json"


# ------------------------------------------------------------------------------------------------
# Measuring compile counts (in a subprocess, so counters start at zero and XLA debug output is ours)


def measure_case(case_name: str, preset: str, inject: str | None = None) -> dict[str, Any]:
    """Compile counters of one case after one call per size of :data:`GATE_SIZES` (this process)."""
    import torch

    from mrcnn.config import get_config
    from mrcnn.weights import synthetic_weights, textured_images
    from mrcnn_bench.cases import CASES, Workload
    from mrcnn_bench.runner import Context, Pipeline, Row, case_flops

    if inject == "recompile":
        _inject_recompile()
    torch.set_num_threads(_MEASURE_THREADS)
    case = CASES[case_name]
    cfg = get_config(preset)
    ctx = Context(preset, {}, Workload(preset, GATE_SIZES[0]), synthetic_weights(cfg, seed=0),
                  textured_images(GATE_SIZES, seed=3), [], torch.get_num_threads(), 0)
    pipeline = Pipeline(Row(case), ctx)
    pipeline.setup()
    start = pipeline.counters()
    calls = []
    from mrcnn.transform import to_image_batch

    for i, img in enumerate(ctx.images):
        shape = list(to_image_batch([img], cfg).tensors.shape)  # what the model is given
        print(f"mrcnn-bench gate: call {i + 1} on image {tuple(img.shape[-2:])} -> model input {shape}",
              file=sys.stderr, flush=True)
        pipeline.call(i)
        now = pipeline.counters()
        calls.append({"image": list(img.shape[-2:]), **{k: now[k] - start.get(k, 0) for k in now}})
    out = {k: v for k, v in calls[-1].items() if k != "image"}
    out["per_call"] = calls
    out["flops"] = case_flops(Row(case), ctx)
    if case.compiler == "inductor":
        from mrcnn_bench.backends import dynamo_reasons

        out["reasons"] = dynamo_reasons()
    return out


def _inject_recompile() -> None:
    """Test-only fault: pad each image tightly (as torchvision does) instead of to its canvas bucket."""
    import mrcnn.transform as transform

    def tight_canvas(sizes, cfg):
        d = cfg.size_divisible
        return (max(-(-h // d) * d for h, _ in sizes), max(-(-w // d) * d for _, w in sizes))

    transform.select_canvas = tight_canvas


_ANALYSIS = re.compile(r"^Compilation Analysis: (.*)$")


def xla_compile_causes(log: str) -> list[dict[str, Any]]:
    """torch_xla's ``PT_XLA_DEBUG_LEVEL=2`` compilation reports: cause, graph hash, Python frames, call."""
    causes: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    section = ""
    call = ""
    for line in log.splitlines():
        if line.startswith("mrcnn-bench gate: call"):
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
    """:func:`measure_case` in a fresh subprocess; XLA cases run with PT_XLA_DEBUG_LEVEL=2."""
    out_file, log_file = workdir / f"{case_name.replace('/', '_')}.json", workdir / "measure.log"
    env = dict(os.environ)
    env.setdefault("PJRT_DEVICE", "CPU")
    if "xla" in case_name:
        env["PT_XLA_DEBUG_LEVEL"] = "2"
    cmd = [sys.executable, "-m", "mrcnn_bench.gate", "--measure", case_name, "--preset", preset,
           "--measure-out", str(out_file)] + (["--inject", inject] if inject else [])
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
# The command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", help="preset of the compile-count cases (default: tiny)")
    p.add_argument("--cases", default=",".join(GATE_CASES), help=f"compile-count cases (default: {GATE_CASES})")
    p.add_argument("--baseline", default=None, help="compile baseline (default: results/baselines/gate_<preset>.json)")
    p.add_argument("--write-baseline", action="store_true", help="record the measured counts as the baseline")
    p.add_argument("--skip-compile", action="store_true", help="skip the compile-count check")
    p.add_argument("--accuracy", default="ci", metavar="RECIPE",
                   help="accuracy-gate recipe (default: ci); 'none' to skip")
    p.add_argument("--checkpoint", default=None, help="evaluate this checkpoint instead of training the recipe")
    p.add_argument("--accuracy-out", default=None, metavar="DIR",
                   help="keep the accuracy run's training output here (metrics.jsonl curve, checkpoints)")
    p.add_argument("--latency-against", default=None, metavar="REF",
                   help="also gate latency: the working tree against this git ref, interleaved")
    p.add_argument("--latency-cases", default="static/eager")
    p.add_argument("--latency-rounds", type=int, default=None)
    p.add_argument("--inject", choices=INJECTIONS, default=None,
                   help="test only: inject a fault (recompile: pad images tightly) to show the gate fails")
    p.add_argument("--out", default=None, metavar="FILE", help="write the measurements and verdicts as JSON")
    p.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    p.add_argument("--measure-out", default=None, help=argparse.SUPPRESS)


def check_compiles(args: argparse.Namespace, report: dict[str, Any]) -> list[str]:
    from mrcnn_bench.cases import parse_cases

    cases = [c.name for c in parse_cases(args.cases)]
    path = Path(args.baseline) if args.baseline else baseline_path(args.preset)
    measured: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mrcnn-gate-") as tmp:
        for name in cases:
            reason = parse_cases(name)[0].skip_reason()
            if reason:
                print(f"gate: {name} skipped ({reason})", file=sys.stderr)
                continue
            print(f"gate: measuring compile counts of {name} over {len(GATE_SIZES)} image sizes", file=sys.stderr)
            measured[name] = measure(name, args.preset, args.inject, Path(tmp))
            m = measured[name]
            print(f"gate: {name}: " + ", ".join(f"{k}={m[k]:g}" for k in GATED if k in m), file=sys.stderr)
    report["compile"] = measured
    if args.write_baseline:
        doc = {"preset": args.preset, "sizes": GATE_SIZES, "cases": measured,
               "environment": environment(_MEASURE_THREADS, 0)}
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


def check_accuracy(args: argparse.Namespace, report: dict[str, Any]) -> list[str]:
    from mrcnn.accuracy import check_accuracy as accuracy_gate

    result = accuracy_gate(recipe=args.accuracy, checkpoint=args.checkpoint, out_dir=args.accuracy_out, progress=True)
    report["accuracy"] = {"passed": result.passed, "messages": list(result.messages), "metrics": result.metrics,
                          "wall_time_s": result.wall_time}
    for msg in result.messages:
        print(f"gate: accuracy: {msg}", file=sys.stderr)
    return [] if result.passed else [f"accuracy: {m}" for m in result.failures]


def check_latency(args: argparse.Namespace, report: dict[str, Any]) -> list[str]:
    from mrcnn_bench import ab
    from mrcnn_bench.cli import build_parser

    rounds = args.latency_rounds or ab.DEFAULT_COMPARE_ROUNDS
    cmp_args = build_parser().parse_args(["compare", args.latency_against, ".", "--cases", args.latency_cases,
                                          "--rounds", str(rounds), "--peak-reps", "0", "--no-flops"])
    recs_a, recs_b, _ = ab.run_live(cmp_args)
    table = ab.compare_records(recs_a, recs_b)
    report["latency"] = json.loads(table.to_json(orient="records"))
    print(table.to_markdown(index=False, floatfmt=".4g"), file=sys.stderr)
    return [f"latency: {line['case']}: {line['verdict']}" for _, line in table.iterrows() if line["regression"]]


def main(args: argparse.Namespace) -> int:
    if args.measure:
        result = measure_case(args.measure, args.preset, args.inject)
        Path(args.measure_out).write_text(json.dumps(result, default=_jsonable))
        return 0
    report: dict[str, Any] = {}
    failures: list[str] = []
    if not args.skip_compile:
        failures += check_compiles(args, report)
    if args.accuracy != "none" and not args.write_baseline:
        failures += check_accuracy(args, report)
    if args.latency_against:
        failures += check_latency(args, report)
    report["failures"] = failures
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1, default=_jsonable) + "\n")
    if failures:
        print("GATE FAILED:\n" + "\n".join(f"  - {f}" for f in failures))
        return 1
    print("gate passed: " + ", ".join(k for k in ("compile", "accuracy", "latency") if k in report))
    return 0


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    return str(x)


if __name__ == "__main__":
    from mrcnn_bench.cli import build_parser

    sys.exit(main(build_parser().parse_args(["gate", *sys.argv[1:]])))
