"""The gate's compile measurement of one case: ``python -m mrcnn_bench.compile_probe CASE PRESET OUT.json [FAULT]``.

:func:`measure_case` calls the case once per size of :data:`GATE_SIZES` and reads its compile
counters after each call. ``mrcnn-bench gate`` runs it in a fresh subprocess per case, so counters
start at zero and torch_xla's debug output (``PT_XLA_DEBUG_LEVEL=2``) is the case's own, which
:func:`xla_compile_causes` reads back; asv calls :func:`measure_case` in its own benchmark
process. ``FAULT`` (``recompile``) is test-only.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import torch

import mrcnn.transform
from mrcnn.config import Config, get_config
from mrcnn.transform import to_image_batch
from mrcnn.weights import synthetic_weights, textured_images
from mrcnn_bench import defaults
from mrcnn_bench.backends import dynamo_reasons
from mrcnn_bench.cases import CASES, Row, Workload
from mrcnn_bench.context import Context
from mrcnn_bench.pipelines import Pipeline
from mrcnn_bench.probes import case_flops

# Five landscape sizes that share the tiny preset's (320, 448) canvas, then two portrait ones (448, 320).
# Their aspect ratios differ, so resized they are 320 x 369..426: padded tightly (as torchvision pads)
# they would make three shapes. A static model compiles once per canvas bucket, whatever the sizes.
GATE_SIZES = ((240, 320), (250, 300), (260, 300), (270, 330), (230, 300), (320, 240), (300, 250))
MEASURE_THREADS = max(1, min(2, os.cpu_count() or 1))  # counts do not depend on it; compile time does
CALL_LOG_PREFIX = "mrcnn-bench gate: call"  # the line before each call: the gate finds XLA's reports by it


def measure_case(case_name: str, preset: str, inject: str | None = None) -> dict[str, Any]:
    """Compile counters of one case after one call per size of :data:`GATE_SIZES` (this process).

    Returns the counters after the last call, ``per_call`` (the counters after each call, with its
    image size), ``flops`` (eager CPU) and, for inductor, dynamo's ``reasons``.
    """
    if inject == "recompile":
        _inject_recompile()
    elif inject is not None:
        raise ValueError(f"unknown fault {inject!r}; choose from {defaults.INJECTIONS}")
    torch.set_num_threads(MEASURE_THREADS)
    case = CASES[case_name]
    cfg = get_config(preset)
    ctx = Context(preset, {}, Workload(preset, GATE_SIZES[0]), synthetic_weights(cfg, seed=0),
                  textured_images(GATE_SIZES, seed=3), [], torch.get_num_threads(), 0)
    pipeline = Pipeline(Row(case), ctx)
    pipeline.setup()
    start = pipeline.counters()
    calls = []
    for i, img in enumerate(ctx.images):
        shape = list(to_image_batch([img], cfg).tensors.shape)  # what the model is given
        print(f"{CALL_LOG_PREFIX} {i + 1} on image {tuple(img.shape[-2:])} -> model input {shape}",
              file=sys.stderr, flush=True)
        pipeline.call(i)
        now = pipeline.counters()
        calls.append({"image": list(img.shape[-2:]), **{k: now[k] - start.get(k, 0) for k in now}})
    out: dict[str, Any] = {k: v for k, v in calls[-1].items() if k != "image"}
    out["per_call"] = calls
    out["flops"] = case_flops(Row(case), ctx)
    if case.compiler == "inductor":
        out["reasons"] = dynamo_reasons()
    return out


def _inject_recompile() -> None:
    """Test-only fault: pad each image tightly (as torchvision does) instead of to its canvas bucket."""

    def tight_canvas(sizes: list[tuple[int, int]], cfg: Config) -> tuple[int, int]:
        d = cfg.size_divisible
        return (max(-(-h // d) * d for h, _ in sizes), max(-(-w // d) * d for _, w in sizes))

    mrcnn.transform.select_canvas = tight_canvas


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


def jsonable(x: Any) -> Any:
    """``json.dumps`` default of the gate's files: NaN as null, anything else as its string."""
    if isinstance(x, float) and math.isnan(x):
        return None
    return str(x)


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(f"usage: python -m mrcnn_bench.compile_probe CASE PRESET OUT.json [{'|'.join(defaults.INJECTIONS)}]",
              file=sys.stderr)
        return 2
    case_name, preset, out = argv[:3]
    result = measure_case(case_name, preset, argv[3] if len(argv) == 4 else None)
    Path(out).write_text(json.dumps(result, default=jsonable))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
