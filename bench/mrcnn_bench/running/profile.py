"""Where the time goes: eager stage timings and FLOPs of the static and the torchvision model (``run --profile``).

Both models have the same module names (``backbone``, ``rpn.head``, ``roi_heads.mask_head``, ...),
so forward hooks measure the same stages in each. Only modules that both models call through their
``forward`` can be hooked: the static backbone runs the ResNet's and the FPN's layers itself (to
zero the padding between them, :func:`mrcnn.backbone.masked_features`), so ``backbone.body`` and
``backbone.fpn`` never fire there and the backbone is one stage. Eager CPU ops run synchronously,
so timing a module's forward with hooks is exact; a stage called several times per call is summed.
The same hooks read ``FlopCounterMode``'s running total in a separate counted call, so each stage's
FLOPs divide its time into GFLOP/s, a fraction of the machine's ceiling.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from mrcnn_bench.base import timing
from mrcnn_bench.running.cases import CASES, Row
from mrcnn_bench.running.context import Context
from mrcnn_bench.running.pipelines import Pipeline

_STAGE_MODULES = (
    "backbone", "rpn.head", "rpn", "roi_heads.box_head", "roi_heads.box_predictor", "roi_heads.mask_head",
    "roi_heads.mask_predictor", "roi_heads",
)
# (label, modules whose figure is added, modules whose figure is subtracted); "total" is the whole call.
STAGES = (
    ("backbone: ResNet body + FPN", ("backbone",), ()),
    ("RPN head (convs)", ("rpn.head",), ()),
    ("RPN rest: anchors, top-k, decode, NMS", ("rpn",), ("rpn.head",)),
    ("box head (MLP) + predictor", ("roi_heads.box_head", "roi_heads.box_predictor"), ()),
    ("RoI heads rest: RoIAlign x2, box decode, NMS", ("roi_heads",),
     ("roi_heads.box_head", "roi_heads.box_predictor", "roi_heads.mask_head", "roi_heads.mask_predictor")),
    ("mask head (convs)", ("roi_heads.mask_head",), ()),
    ("mask predictor (deconv + 1x1)", ("roi_heads.mask_predictor",), ()),
    ("outside the network: resize, pad, box rescale, mask paste", ("total",), ("backbone", "rpn", "roi_heads")),
    ("total, end to end", ("total",), ()),
)
# Short names of STAGES, for series and file keys (the history tracks each stage by this name).
STAGE_KEYS = dict(zip(
    (label for label, *_ in STAGES),
    ("backbone", "rpn_head", "rpn_rest", "box_head", "roi_rest", "mask_head", "mask_predictor", "outside", "total"),
    strict=True,
))

Runs = dict[str, tuple[torch.nn.Module, Callable[[], Any]]]  # name -> (model, one call)


# Stage modules whose work the staged path (mrcnn.staged: MaskRCNN.box_stage and mask_stage) calls
# as methods rather than through ``forward``: they are metered as part of the module too (once, when
# ``forward`` calls them itself). torchvision's modules have no such methods.
_METHODS = {"roi_heads": ("detect_boxes", "masks")}


@contextlib.contextmanager
def metered(model: torch.nn.Module, meter: Callable[[], float], sums: dict[str, float]) -> Iterator[None]:
    """While open, each stage module's forward (and its :data:`_METHODS`) adds ``meter()``'s growth
    over it to ``sums[name]``; a call nested in another of the same module counts once."""
    starts: dict[str, float] = {}
    depth: dict[str, int] = {}

    def enter(name: str) -> None:
        if not depth.get(name):
            starts[name] = meter()
        depth[name] = depth.get(name, 0) + 1

    def leave(name: str) -> None:
        depth[name] -= 1
        if not depth[name]:
            sums[name] = sums.get(name, 0.0) + meter() - starts[name]

    handles = []
    patched: list[tuple[torch.nn.Module, str]] = []
    for name in _STAGE_MODULES:
        module = model.get_submodule(name)
        handles += [module.register_forward_pre_hook(lambda _m, _a, name=name: enter(name)),
                    module.register_forward_hook(lambda _m, _a, _o, name=name: leave(name))]  # fmt: skip
        for method in _METHODS.get(name, ()):
            original = getattr(module, method, None)
            if original is None:
                continue

            def wrapped(*args: Any, original: Callable[..., Any] = original, name: str = name, **kwargs: Any) -> Any:
                enter(name)
                try:
                    return original(*args, **kwargs)
                finally:
                    leave(name)

            setattr(module, method, wrapped)  # an instance attribute: it shadows the class's method
            patched.append((module, method))
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for module, method in patched:
            delattr(module, method)


def by_stage(sums: dict[str, float]) -> dict[str, float]:
    """Seconds (or FLOPs) per stage label of :data:`STAGES` from the per-module sums of :func:`metered`
    and ``sums["total"]``, the whole call."""
    return {label: sum(sums.get(k, 0.0) for k in plus) - sum(sums.get(k, 0.0) for k in minus)
            for label, plus, minus in STAGES}


def stage_times(
    runs: Runs, reps: int = 3, clock: Callable[[], float] = timing.clock
) -> dict[str, dict[str, float]]:
    """Median seconds per stage of :data:`STAGES`, per run, over ``reps`` interleaved calls (after one
    untimed call of each)."""
    per_rep: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    sums: dict[str, float] = {}
    with contextlib.ExitStack() as stack, torch.no_grad():
        for model, _ in runs.values():
            stack.enter_context(metered(model, clock, sums))
        for _, call in runs.values():
            call()
        for _, names in timing.schedule(list(runs), "fixed", reps):
            for name in names:
                call = runs[name][1]
                sums.clear()
                t0 = clock()
                call()
                sums["total"] = clock() - t0
                per_rep[name].append(by_stage(sums))
    return {run: {label: statistics.median(r[label] for r in reps_) for label, *_ in STAGES}
            for run, reps_ in per_rep.items()}


def stage_flops(runs: Runs) -> dict[str, dict[str, float]]:
    """FLOPs per stage of :data:`STAGES` (2 per multiply-add; NMS and RoIAlign count none), per run,
    from one call under ``FlopCounterMode``."""
    out = {}
    for name, (model, call) in runs.items():
        sums: dict[str, float] = {}
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            with metered(model, lambda c=counter: float(c.get_total_flops()), sums):
                call()
            sums["total"] = float(counter.get_total_flops())
        out[name] = by_stage(sums)
    return out


def profile_stages(ctx: Context, reps: int = 3) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """(seconds, FLOPs) per stage of static/eager and torchvision/eager on the run's first call."""
    runs: Runs = {}
    for impl in ("static", "torchvision"):
        pipeline = Pipeline(Row(CASES[f"{impl}/eager"]), ctx)
        pipeline.setup()
        runs[impl] = (pipeline.model, lambda p=pipeline: p.call(0))
    return stage_times(runs, reps), stage_flops(runs)
