"""Where the time goes: eager stage timings of the static and the torchvision model (``run --profile``).

Both models have the same module names (``backbone.body``, ``rpn.head``, ``roi_heads.mask_head``,
...), so forward hooks time the same stages in each. Eager CPU ops run synchronously, so timing a
module's forward with hooks is exact; a stage called several times per call is summed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from mrcnn_bench.cases import CASES, Row
from mrcnn_bench.context import Context
from mrcnn_bench.pipelines import Pipeline

_STAGE_MODULES = (
    "backbone.body", "backbone.fpn", "rpn.head", "rpn", "roi_heads.box_head", "roi_heads.box_predictor",
    "roi_heads.mask_head", "roi_heads.mask_predictor", "roi_heads",
)
# (label, modules whose time is added, modules whose time is subtracted); "total" is the whole call.
STAGES = (
    ("backbone: ResNet body", ("backbone.body",), ()),
    ("backbone: FPN", ("backbone.fpn",), ()),
    ("RPN head (convs)", ("rpn.head",), ()),
    ("RPN rest: anchors, top-k, decode, NMS", ("rpn",), ("rpn.head",)),
    ("box head (MLP) + predictor", ("roi_heads.box_head", "roi_heads.box_predictor"), ()),
    ("RoI heads rest: RoIAlign x2, box decode, NMS", ("roi_heads",),
     ("roi_heads.box_head", "roi_heads.box_predictor", "roi_heads.mask_head", "roi_heads.mask_predictor")),
    ("mask head (convs)", ("roi_heads.mask_head",), ()),
    ("mask predictor (deconv + 1x1)", ("roi_heads.mask_predictor",), ()),
    ("outside the network: resize, pad, box rescale, mask paste", ("total",),
     ("backbone.body", "backbone.fpn", "rpn", "roi_heads")),
    ("total, end to end", ("total",), ()),
)


def stage_times(runs: dict[str, tuple[torch.nn.Module, Callable[[], Any]]], reps: int = 3,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, dict[str, float]]:
    """Median seconds per stage of :data:`STAGES`, per run, over ``reps`` interleaved calls.

    ``runs`` maps a name to (model, call).
    """
    sums: dict[str, float] = {}
    starts: dict[str, float] = {}
    handles = []
    for model, _ in runs.values():
        for name in _STAGE_MODULES:
            module = model.get_submodule(name)

            def pre(_m, _a, name=name) -> None:
                starts[name] = clock()

            def post(_m, _a, _o, name=name) -> None:
                sums[name] = sums.get(name, 0.0) + clock() - starts[name]

            handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    per_rep: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    try:
        with torch.no_grad():
            for _, call in runs.values():
                call()
            for _ in range(reps):
                for name, (_, call) in runs.items():
                    sums.clear()
                    t0 = clock()
                    call()
                    sums["total"] = clock() - t0
                    per_rep[name].append(dict(sums))
    finally:
        for h in handles:
            h.remove()
    return {
        run: {label: statistics.median(sum(r.get(k, 0.0) for k in plus) - sum(r.get(k, 0.0) for k in minus)
                                       for r in reps_)
              for label, plus, minus in STAGES}
        for run, reps_ in per_rep.items()
    }


def profile_stages(ctx: Context, reps: int = 3) -> dict[str, dict[str, float]]:
    """Stage timings of static/eager and torchvision/eager on the run's first call."""
    runs = {}
    for impl in ("static", "torchvision"):
        pipeline = Pipeline(Row(CASES[f"{impl}/eager"]), ctx)
        pipeline.setup()
        runs[impl] = (pipeline.model, lambda p=pipeline: p.call(0))
    return stage_times(runs, reps)
