"""The inference stages of both models: the modules that mark them, a meter read across each, the sums split.

Both models have the same module names (``backbone``, ``rpn.head``, ``roi_heads.mask_head``, ...),
so forward hooks measure the same stages in each. Only modules that both models call through their
``forward`` can be hooked: the static backbone runs the ResNet's and the FPN's layers itself (to
zero the padding between them, :func:`mrcnn.backbone.masked_features`), so ``backbone.body`` and
``backbone.fpn`` never fire there and the backbone is one stage. :func:`metered` adds any meter's
growth over each stage module (a clock: :mod:`mrcnn_bench.running.profile`, the history's shared
rounds; exact counters: :mod:`mrcnn_bench.running.work_counters`), and :func:`by_stage` splits those
sums into :data:`STAGES`, which add up to the whole call by construction (``outside`` is the rest).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

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


# Stage modules whose work the staged path (mrcnn.staged: MaskRCNN.box_stage and mask_stage) calls
# as methods rather than through ``forward``: they are metered as part of the module too (once, when
# ``forward`` calls them itself). torchvision's modules have no such methods.
_METHODS = {"roi_heads": ("detect_boxes", "masks")}


@contextlib.contextmanager
def metered(model: torch.nn.Module, meter: Callable[[], float], sums: dict[str, float]) -> Iterator[None]:
    """While open, each stage module's forward (and its :data:`_METHODS`) adds ``meter()``'s growth
    over it to ``sums[name]``; a call nested in another of the same module counts once. Meters may
    be nested on one model (each closes before the one opened before it)."""
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
    patched: list[tuple[torch.nn.Module, str, Any]] = []  # (module, method, its instance attribute before)
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

            patched.append((module, method, vars(module).get(method)))
            setattr(module, method, wrapped)  # an instance attribute: it shadows the class's method
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for module, method, before in reversed(patched):
            # Put back what was there: another meter's wrapper when meters are nested (work_counters).
            if before is None:
                delattr(module, method)
            else:
                setattr(module, method, before)


def by_stage(sums: dict[str, float]) -> dict[str, float]:
    """Seconds (or FLOPs) per stage label of :data:`STAGES` from the per-module sums of :func:`metered`
    and ``sums["total"]``, the whole call."""
    return {label: sum(sums.get(k, 0.0) for k in plus) - sum(sums.get(k, 0.0) for k in minus)
            for label, plus, minus in STAGES}
