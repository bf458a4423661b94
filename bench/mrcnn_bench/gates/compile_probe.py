"""The gate's compile measurement of one case.

``python -m mrcnn_bench.gates.compile_probe CASE PRESET OUT.json [FAULT]``:

:func:`measure_case` calls the case once per size of :data:`GATE_SIZES` (a training case: one step
per ground-truth mix of :data:`GATE_TRAIN_COUNTS`) and reads its compile counters after each call.
``mrcnn-bench gate`` runs it in a fresh subprocess per case, so counters start at zero and
torch_xla's debug output (``PT_XLA_DEBUG_LEVEL=2``) is the case's own, which
:func:`xla_compile_causes` reads back; asv calls :func:`measure_case` in its own benchmark process.
``FAULT`` (``recompile``) is test-only.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from typing import Any

import torch

import mrcnn.transform
from mrcnn.config import Config, get_config
from mrcnn.transform import to_image_batch
from mrcnn.weights import synthetic_weights, textured_images
from mrcnn_bench.base import defaults, timing
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.running.backends import dynamo_reasons
from mrcnn_bench.running.cases import CASES, TRAIN_BATCH, Row, Workload
from mrcnn_bench.running.context import Context, Sample, initial_weights, training_samples
from mrcnn_bench.running.pipelines import Pipeline
from mrcnn_bench.running.probes import case_flops

# Five landscape sizes that share the tiny preset's (320, 448) canvas, then two portrait ones (448, 320).
# Their aspect ratios differ, so resized they are 320 x 369..426: padded tightly (as torchvision pads)
# they would make three shapes. A static model compiles once per canvas bucket, whatever the sizes.
GATE_SIZES = ((240, 320), (250, 300), (260, 300), (270, 330), (230, 300), (320, 240), (300, 250))
# Training cases: one SGD step per pair of ground-truth counts (images of GATE_SIZES[0], one canvas:
# a new canvas is the inference cases' test, and each training graph costs a minute to compile).
# None and few objects, the most the samples hold, and mixes: the sampled positives, and so the
# mask-RoI bucket of a bucketed case, vary from step to step.
GATE_TRAIN_COUNTS = ((2, 1), (0, 0), (11, 3), (1, 0), (5, 11), (0, 2))
MEASURE_THREADS = max(1, min(2, os.cpu_count() or 1))  # counts do not depend on it; compile time does
CALL_LOG_PREFIX = "mrcnn-bench gate: call"  # the line before each call: the gate finds XLA's reports by it


def measure_case(case_name: str, preset: str, inject: str | None = None) -> dict[str, Any]:
    """Compile counters of one case after one call per size of :data:`GATE_SIZES` (this process);
    a training case: one SGD step per mix of :data:`GATE_TRAIN_COUNTS`.

    Returns the counters after the last call, ``first_call_s`` (the first call's seconds, its
    compilation included), ``per_call`` (the counters after each call, with its image size or,
    training, its objects per image, and its seconds), ``flops`` (eager CPU) and, for inductor, dynamo's ``reasons``.
    """
    if inject == "recompile":
        _inject_recompile()
    elif inject is not None:
        raise ValueError(f"unknown fault {inject!r}; choose from {defaults.INJECTIONS}")
    torch.set_num_threads(MEASURE_THREADS)
    case = CASES[case_name]
    cfg = get_config(preset)
    training = case.phase == "training"
    train = training_mixes(GATE_SIZES[0]) if training else []
    ctx = Context(preset, {}, Workload(preset, GATE_SIZES[0]), synthetic_weights(cfg, seed=0),
                  textured_images(GATE_SIZES, seed=3), train, torch.get_num_threads(), 0,
                  initial_weights(cfg, 0) if training else {})
    pipeline = Pipeline(Row(case), ctx)
    pipeline.setup()
    start = pipeline.counters()
    calls = []
    inputs = [(list(GATE_SIZES[0]), counts) for counts in GATE_TRAIN_COUNTS] if training else [
        (list(img.shape[-2:]), None) for img in ctx.images]
    for i, (size, counts) in enumerate(inputs):
        images = [torch.zeros(3, *size)] * (TRAIN_BATCH if training else 1)
        shape = list(to_image_batch(images, cfg).tensors.shape)  # what the model is given
        what = f"objects {counts}" if training else f"image {tuple(size)}"
        print(f"{CALL_LOG_PREFIX} {i + 1} on {what} -> model input {shape}", file=sys.stderr, flush=True)
        seconds, _ = timing.timed(pipeline.call, i)
        now = pipeline.counters()
        key = {"objects": list(counts)} if training else {"image": size}
        calls.append({**key, **{k: now[k] - start.get(k, 0) for k in now}, "seconds": seconds})
    out: dict[str, Any] = {k: v for k, v in calls[-1].items() if k not in ("image", "objects", "seconds")}
    out["first_call_s"] = calls[0]["seconds"]  # compilation included: the case's time to first result
    out["per_call"] = calls
    out["flops"] = case_flops(Row(case), ctx)
    if case.compiler == "inductor":
        out["reasons"] = dynamo_reasons()
    return out


def training_mixes(size: tuple[int, int]) -> list[Sample]:
    """Training samples at ``size``, two per step of :data:`GATE_TRAIN_COUNTS`: the bench's synthetic
    samples cut to each count of objects (the first n of their ground truth)."""
    most = max(max(c) for c in GATE_TRAIN_COUNTS)
    pool = [s for s in training_samples(size, 4, seed=3) if len(s[1]["labels"]) >= most]
    if not pool:
        raise RuntimeError(f"no synthetic training sample at {size} holds {most} objects; change GATE_TRAIN_COUNTS")
    image, target = pool[0]
    objects = len(target["labels"])

    def first(n: int) -> dict[str, Any]:  # every per-object field (boxes, labels, masks, iscrowd, ...)
        return {k: v[:n] if torch.is_tensor(v) and v.ndim and len(v) == objects else v for k, v in target.items()}

    return [(image, first(n)) for counts in GATE_TRAIN_COUNTS for n in counts]


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
        print("usage: python -m mrcnn_bench.gates.compile_probe CASE PRESET OUT.json "
              f"[{'|'.join(defaults.INJECTIONS)}]",
              file=sys.stderr)
        return 2
    case_name, preset, out = argv[:3]
    result = measure_case(case_name, preset, argv[3] if len(argv) == 4 else None)
    atomic_write(out, json.dumps(result, default=jsonable))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
