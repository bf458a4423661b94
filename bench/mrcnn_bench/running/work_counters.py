"""Exact work counters per inference stage: FLOPs, aten operators dispatched and bytes they write.

Latency is noisy; much of what makes a call slower is more work: an extra convolution, a copy, a
dtype round trip, a larger canvas. Counted rather than timed, such work shows with no noise at all.
For one call of an eager model, each stage of :data:`mrcnn_bench.running.stages.STAGES` (keyed by
:data:`~mrcnn_bench.running.stages.STAGE_KEYS`) gets three integers, from one pass with two
dispatch modes active (:func:`count_stage_work`):

- ``flops``: ``FlopCounterMode``'s count, 2 per multiply-add, as the run's FLOPs per call are counted
  (convolutions, matmuls and the like; NMS, RoIAlign and elementwise ops count none).
- ``ops``: every aten operator call that reaches a Python dispatch mode, views and host reads
  (``view``, ``expand``, ``slice``, ``.item()``'s ``_local_scalar_dense``) included, since each is a
  dispatch the CPU pays for and an added reshape or ``.item()`` is as much a change as an added kernel. What it
  counts is the operator as the program dispatches it: a composite operator (``linear``, ``conv2d``)
  arrives already decomposed into the operators it runs (``addmm``, ``convolution``), and an operator
  with a kernel of its own (a ``torch.library`` custom op such as ``mrcnn::multilevel_roi_align_tv``,
  torchvision's ``roi_align`` and ``nms``) counts once, whatever its kernel calls inside.
- ``bytes``: bytes written by operators, ``numel * element_size`` summed over the tensors each call
  writes, as its schema says: every fresh output (an allocation such as ``empty`` included), and
  every argument the schema marks as written (``self`` of an in-place op such as ``add_``, ``copy_``
  or ``index_put_``, an ``out=`` tensor, the lists of ``_foreach_*_``), in full even where the op
  writes part of it. A view (a return that aliases an input unwritten: ``view``, ``split``,
  ``detach``) writes nothing, since it shares its input's storage, and an in-place op's return is
  its argument, counted once. Scalars and other non-tensor outputs count nothing; bytes read are not
  counted.

The counts are a function of the operators the model dispatches (with one version of torch and
torchvision: another may dispatch others) and of the shapes and dtypes of their tensors, so a fixed
call counts the same in every run. The static network's shapes are fixed by its config and canvas,
so its stages count the same for every image of one size, except where the detections decide:
the staged eager path (``mrcnn.staged``, the CPU default of ``mask_detection_buckets="auto"``) runs
the mask branch on the bucket of slots its valid detections fill, and ``outside`` (the host's
post-processing) pastes one mask per valid detection, resized to its box. torchvision's model is
data-dependent throughout (proposals kept by NMS, detections above the score threshold), so its
counts follow the image. Across hosts, a box that rounds to another pixel moves ``outside``'s bytes:
its series are compared across commits on one machine, as the history's are.

What the counters cannot see: time spent in a kernel (threads, vectorisation, memory bandwidth and
caches), the work inside one operator's kernel (a faster RoIAlign on two cores changes no count),
and bytes read.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from mrcnn_bench.running import stages
from mrcnn_bench.running.cases import CASES, Row
from mrcnn_bench.running.context import Context
from mrcnn_bench.running.probes import eager_stand_in

COUNTERS = ("flops", "ops", "bytes")


@dataclass(frozen=True)
class StageWork:
    """The work of one stage of one call: exact counts (module docstring)."""

    flops: int
    ops: int
    bytes: int

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class OpCounter(TorchDispatchMode):
    """Counts every aten operator call that reaches it (``ops``) and the bytes each writes (``bytes``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops += 1
        self.bytes += written_bytes(func, args, kwargs, out)
        return out


def written_bytes(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """Bytes one call of ``func`` writes, from its schema: each fresh output tensor (a return with no
    alias) and each argument the schema marks as written (``self`` of an in-place op, ``out=``), in
    full. A return that aliases an input is not counted again: a view writes nothing, and an in-place
    op's return is the argument already counted."""
    schema = func._schema
    written = [v for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write
               for v in [args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)]]
    returns = schema.returns
    results = out if len(returns) > 1 else (out,) if returns else ()
    fresh = [v for r, v in zip(returns, results, strict=True) if r.alias_info is None]
    return sum(t.numel() * t.element_size() for t in tree_leaves([written, fresh]) if isinstance(t, torch.Tensor))


def count_stage_work(model: torch.nn.Module, call: Callable[[], Any]) -> dict[str, StageWork]:
    """The work of one ``call()`` of ``model`` (eager, under ``torch.no_grad``) per stage key of
    :data:`~mrcnn_bench.running.stages.STAGE_KEYS`, ``"total"`` the whole call. Count a call after
    the first: a model's first call may do work once (torchvision's ``MultiScaleRoIAlign`` infers its
    scales there), which the calls that are timed never repeat."""
    sums: dict[str, dict[str, float]] = {name: {} for name in COUNTERS}
    counter = OpCounter()
    # The op counter is entered last, so it sees each operator first, as the program dispatches it:
    # FlopCounterMode may decompose an operator it has no formula for, and those parts are not counted.
    with torch.no_grad(), FlopCounterMode(display=False) as flops, counter:
        meters = {"flops": flops.get_total_flops, "ops": lambda: counter.ops, "bytes": lambda: counter.bytes}
        with _metered_all(model, meters, sums):
            call()
        totals = {"flops": flops.get_total_flops(), "ops": counter.ops, "bytes": counter.bytes}
    per_stage = {name: stages.by_stage({**sums[name], "total": float(totals[name])}) for name in COUNTERS}
    return {key: StageWork(**{name: _exact(per_stage[name][label]) for name in COUNTERS})
            for label, key in stages.STAGE_KEYS.items()}


@contextlib.contextmanager
def _metered_all(model: torch.nn.Module, meters: dict[str, Callable[[], float]],
                 sums: dict[str, dict[str, float]]) -> Iterator[None]:
    """:func:`~mrcnn_bench.running.stages.metered` once per counter, all open together."""
    with contextlib.ExitStack() as stack:
        for name, meter in meters.items():
            stack.enter_context(stages.metered(model, meter, sums[name]))
        yield


def _exact(value: float) -> int:
    """A stage's count as an int: sums of integer counts, exact in a float below 2**53."""
    if value != int(value) or abs(value) >= 2**53:
        raise ValueError(f"a count of {value!r} is not an exact integer")
    return int(value)


def as_dict(work: dict[str, StageWork]) -> dict[str, dict[str, int]]:
    """Stage key -> counter -> count, for JSON."""
    return {key: w.to_dict() for key, w in work.items()}


def case_work(case_names: Sequence[str], ctx: Context, index: int = 0) -> dict[str, dict[str, dict[str, int]]]:
    """Case -> :func:`as_dict` of its call ``index``, counted on its eager fp32 CPU stand-in
    (:func:`mrcnn_bench.running.probes.eager_stand_in`): a compiled case's work is its eager model's. Cases
    whose stand-ins are the same model (implementation and config) share one count. Each model is
    called once before its counted call (:func:`count_stage_work`)."""
    counted: dict[tuple[str, str], dict[str, dict[str, int]]] = {}
    out = {}
    for name in case_names:
        pipeline = eager_stand_in(Row(CASES[name]), ctx)
        key = (pipeline.case.impl, repr(pipeline.cfg))
        if key not in counted:
            pipeline.setup()
            assert pipeline.model is not None
            pipeline.call(index)
            counted[key] = as_dict(count_stage_work(pipeline.model, lambda p=pipeline: p.call(index)))
        out[name] = counted[key]
    return out
