"""Subnormal floats in training steps: count them, and time a row's first steps with them kept or flushed.

The question (``bench/studies/training_subnormals/``): were the slow rounds of the COCO-size
training runs subnormal floats? :func:`one_pass` runs a training row's first steps in this process,
subnormals kept or flushed to zero in every thread from the process's start
(:func:`mrcnn_bench.running.backends.flush_subnormals`), timing each step and counting (untimed) the
subnormal values in the parameters and their gradients after it. Same settings as those runs:
``coco_r50_fpn``, 320x427 training images, canvases up to 512 (:data:`OVERRIDES`), 2 threads.
"""

from __future__ import annotations

import sys

import torch

from mrcnn_bench.base import timing
from mrcnn_bench.running.backends import flush_subnormals
from mrcnn_bench.running.cases import Row, default_workload, parse_cases
from mrcnn_bench.running.context import ContextOptions, make_context
from mrcnn_bench.running.pipelines import Pipeline

OVERRIDES = {"min_size": 320, "max_size": 512,
             "canvases": ((320, 320), (320, 448), (320, 512), (448, 320), (512, 320))}


def subnormals(tensors: list[torch.Tensor]) -> int:
    """How many nonzero values lie below the smallest normal float32 (float32 tensors only, any shape)."""
    tiny = torch.finfo(torch.float32).tiny
    return int(sum(((t != 0) & (t.abs() < tiny)).sum() for t in tensors if t.dtype == torch.float32))


def one_pass(case: str, steps: int, flush: bool) -> list[dict[str, float]]:
    """This process's pass: call it first thing in a fresh process (flushing must precede the CPU pool).

    One dict per step: ``step``, ``seconds``, ``loss``, and the subnormal counts ``params`` and ``grads``.
    """
    if flush:
        flush_subnormals()
    torch.set_num_threads(2)
    ctx, _ = make_context(ContextOptions(workload=default_workload("coco_r50_fpn", (320, 427)), threads=2,
                                         need_training=True, overrides=OVERRIDES))
    pipeline = Pipeline(Row(parse_cases(case)[0]), ctx)
    pipeline.setup()
    assert pipeline.model is not None
    params = [p for p in pipeline.model.parameters() if p.requires_grad]
    out = []
    for index in range(steps):
        seconds, result = timing.timed(pipeline.call, index)
        loss = result["loss"]
        grads = [p.grad for p in params if p.grad is not None]
        out.append({"step": index, "seconds": seconds, "loss": loss, "params": subnormals(params),
                    "grads": subnormals(grads)})
        print(f"flush={flush} step {index}: {seconds:.2f} s, loss {loss:.3f}, subnormal params "
              f"{out[-1]['params']}, grads {out[-1]['grads']}", file=sys.stderr, flush=True)
    return out
