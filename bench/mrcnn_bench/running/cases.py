"""Benchmark cases: the one definition that the runner, asv, pytest-benchmark and the gate share.

A :class:`Case` is one way of running the model (implementation, backend, compiler, precision,
phase). A :class:`Workload` is what it runs on (preset, image size, images per call). A
:class:`Row` is a case plus a :class:`Variant` (which code, which settings). A run is a workload
times a list of rows, timed interleaved (see :mod:`mrcnn_bench.running.runner`).

Your own cases, with no edit here: a module of yours calls :func:`add_case` (and, for another
model or compiler, :func:`register_implementation` / :func:`register_compiler`), and is named in
``$MRCNN_BENCH_CASES`` (comma-separated module names) or declared as an entry point of the group
``mrcnn_bench.running.cases`` in your package. It is loaded when this module is, in every process (runs,
workers, asv, pytest-benchmark), so its cases appear in ``mrcnn-bench run`` and ``list``, the report,
pytest-benchmark (``quick=True``) and asv (``tracked=True``). Example: ``bench/examples/my_cases.py``.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import random
import re
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Literal, get_args

from mrcnn_bench.base.errors import UsageError

if TYPE_CHECKING:  # backends imports torch: kept out of `mrcnn-bench --help` (mrcnn_bench.cli.commands)
    from mrcnn_bench.running.backends import Backend

Compiler = Literal["eager", "inductor", "frozen", "export", "aoti"]  # none | torch.compile | +freezing | .pt2 | AOTI
Precision = Literal["fp32", "bf16"]  # bf16: autocast
Phase = Literal["inference", "training"]  # latency per call | SGD steps per second
Interface = Literal["static", "torchvision"]  # how a call reaches a model (Implementation)

PRECISIONS: tuple[str, ...] = get_args(Precision)
PHASES: tuple[str, ...] = get_args(Phase)
INTERFACES: tuple[str, ...] = get_args(Interface)


@dataclass(frozen=True)
class Implementation:
    """A model the harness can time, and how a call reaches it (``interface``).

    ``static``: ``mrcnn.MaskRCNN``'s: ``forward(ImageBatch) -> Detections`` at inference, and
    ``forward(ImageBatch, Targets) -> losses`` in training; the harness resizes and pads on the host.
    ``torchvision``: torchvision's detection models': ``forward(list of images) -> list[dict]``, and
    ``forward(images, targets) -> losses``. ``builder``: ``"module:function"`` taking the run's
    ``mrcnn.config.Config`` and its torchvision-named state_dict and returning the model (it may
    ignore the weights); empty for the two built in, which :mod:`mrcnn_bench.running.pipelines` builds.
    """

    interface: Interface
    builder: str = ""


IMPLEMENTATIONS: dict[str, Implementation] = {name: Implementation(name) for name in INTERFACES}  # the built-ins
# Compiler name -> "module:function" of its builder (mrcnn_bench.running.pipelines.Builder); "" for the built-ins.
COMPILERS: dict[str, str] = dict.fromkeys(get_args(Compiler), "")


@dataclass(frozen=True)
class Case:
    """One implementation on one backend. ``bounded`` cases run in a worker killed at the time limit."""

    impl: str  # a key of IMPLEMENTATIONS
    backend: Backend = "cpu"
    compiler: str = "eager"  # a key of COMPILERS
    precision: Precision = "fp32"
    phase: Phase = "inference"
    bounded: bool = False  # may never finish (torchvision on XLA, torchvision under torch.compile)
    tag: str = ""  # names a case that differs by config only: "static/eager+k32"
    overrides: tuple[tuple[str, Any], ...] = ()  # Config overrides of this case, on top of the run's

    def __post_init__(self) -> None:
        for value, allowed, field in ((self.impl, tuple(IMPLEMENTATIONS), "impl"),
                                      (self.compiler, tuple(COMPILERS), "compiler"),
                                      (self.precision, PRECISIONS, "precision"), (self.phase, PHASES, "phase")):
            if value not in allowed:
                raise UsageError(f"case {field} {value!r} is not one of {allowed}")
        if (self.compiler in ("export", "aoti", "frozen") and self.phase != "inference") or (
                self.compiler in ("export", "aoti") and self.impl != "static"):  # fmt: skip
            raise UsageError("export and aoti cases exist for static inference only, frozen cases for inference")
        if self.overrides and not self.tag:
            raise UsageError("a case with config overrides needs a tag, which names it")
        if not re.fullmatch(r"[A-Za-z0-9_.-]*", self.tag):  # a comma or slash would make it unselectable
            raise UsageError(f"case tag {self.tag!r}: letters, digits, '_', '.' and '-' only (it is part of --cases)")
        # Hashable however it was given (a run file's JSON gives lists).
        object.__setattr__(self, "overrides", tuple((str(k), v) for k, v in self.overrides))

    @property
    def name(self) -> str:
        """``impl/variant[+tag]``: the non-default fields joined, e.g. static/inductor-bf16, torchvision/xla."""
        parts = [p for p, default in ((self.backend, "cpu"), (self.compiler, "eager"), (self.precision, "fp32"))
                 if p != default]
        if self.phase == "training":
            parts.append("train")
        return f"{self.impl}/{'-'.join(parts) or 'eager'}" + (f"+{self.tag}" if self.tag else "")

    @property
    def interface(self) -> Interface:
        return IMPLEMENTATIONS[self.impl].interface

    @property
    def flushes_subnormals(self) -> bool:
        """Training: its process treats subnormal floats as zero from its start
        (:func:`mrcnn_bench.running.backends.flush_subnormals`; why: ``results/training/README.md``)."""
        return self.phase == "training"

    def skip_reason(self) -> str | None:
        """Why this case cannot run here (an absent backend), or None."""
        from mrcnn_bench.running.backends import unavailable  # lazy: backends loads torch, cases must not (fast --help)

        return unavailable(self.backend)


@dataclass(frozen=True)
class Workload:
    """What the cases of one run share: preset, image sizes, how many images a call takes.

    Fixed (``sizes`` empty): ``images`` generated textured images of one ``image_size``. A stream
    (``sizes`` given): one synthetic-data-set image per size, in that order (varied sizes, aspect ratios
    and object counts, as real streams are; :func:`stream_sizes` is the default's rule); ``images`` is
    then ``len(sizes)``. Training steps take ``image_size`` either way.
    """

    preset: str = "tiny"
    image_size: tuple[int, int] = (240, 320)  # fits a canvas of the tiny preset exactly (no extra padding)
    batch_size: int = 1  # images per inference call; training steps use TRAIN_BATCH
    images: int = 3  # distinct images, cycled over the rounds (a stream: its length)
    sizes: tuple[tuple[int, int], ...] = ()  # a stream's image sizes (height, width); (): fixed image_size

    def __post_init__(self) -> None:
        if len(self.image_size) != 2 or min(self.image_size) <= 0:
            raise UsageError(f"image_size must be (height, width) > 0, got {self.image_size}")
        sizes = tuple((int(h), int(w)) for h, w in self.sizes)  # hashable however given (a run file has lists)
        if any(min(s) <= 0 for s in sizes):
            raise UsageError(f"sizes must be (height, width) > 0, got {self.sizes}")
        object.__setattr__(self, "sizes", sizes)
        if sizes:
            object.__setattr__(self, "images", len(sizes))
        if self.batch_size < 1 or self.images < 1:
            raise UsageError("batch_size and images must be >= 1")

    @property
    def sizes_label(self) -> str:
        """``fixed 240x320`` or ``stream of 8 sizes (480x640, ...)``: which kind of workload this is."""
        if not self.sizes:
            return f"fixed {self.image_size[0]}x{self.image_size[1]}"
        return f"stream of {len(self.sizes)} sizes ({', '.join(f'{h}x{w}' for h, w in self.sizes)})"

    @property
    def kind(self) -> str:
        """``fixed 240x320`` or ``stream of 8 sizes``: :attr:`sizes_label` without the list."""
        return self.sizes_label.split(" (")[0]

    @property
    def label(self) -> str:
        return f"{self.preset} {self.sizes_label} b{self.batch_size}"

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if not self.sizes:  # added later: a fixed workload writes the keys run files always had
            del out["sizes"]
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Workload:
        return cls(d["preset"], tuple(d["image_size"]), d["batch_size"], d["images"],
                   tuple(tuple(s) for s in d.get("sizes", ())))


# The default stream (mrcnn-bench run): common photo aspect ratios, width:height, landscape and
# portrait, as COCO's images have them; at the tiny preset they resize onto all five canvases.
STREAM_ASPECTS: tuple[tuple[int, int], ...] = ((4, 3), (3, 4), (16, 9), (1, 1), (3, 2), (2, 3), (9, 16), (5, 4))
STREAM_LONG_SIDE = (320, 640)  # px, inclusive: COCO's images are at most 640 px a side
STREAM_IMAGES = len(STREAM_ASPECTS)


def stream_sizes(seed: int = 0, count: int = STREAM_IMAGES) -> tuple[tuple[int, int], ...]:
    """The default stream's (height, width) sizes, a rule of the seed and nothing else.

    Every block of ``len(STREAM_ASPECTS)`` images takes each aspect ratio of :data:`STREAM_ASPECTS`
    once, in an order shuffled by the seed; each image's long side is drawn uniformly from
    :data:`STREAM_LONG_SIDE` and its short side is the long side over the aspect ratio, rounded. Only
    ``random.Random(seed).random()`` is drawn, whose sequence Python keeps across versions.
    """
    if count < 1:
        raise UsageError(f"a stream needs at least one image, got {count}")
    rng = random.Random(seed)
    lo, hi = STREAM_LONG_SIDE
    out: list[tuple[int, int]] = []
    while len(out) < count:
        for w, h in sorted(STREAM_ASPECTS, key=lambda _: rng.random()):
            long_side = lo + int(rng.random() * (hi - lo + 1))
            short_side = round(long_side * min(w, h) / max(w, h))
            out.append((short_side, long_side) if w >= h else (long_side, short_side))
    return tuple(out[:count])


@dataclass(frozen=True)
class Variant:
    """Which code and settings a row runs: ``code`` is a checkout whose ``mrcnn`` is imported.

    ``slowdown``: the fraction of extra inference work the harness adds to the model
    (:func:`mrcnn_bench.running.slowdown.inject_slowdown`), e.g. 0.1 for B in a test of the latency gate.
    """

    label: str = ""  # "" in a plain run; "A" / "B" in compare
    code: str | None = None  # None: the mrcnn this process imports
    overrides: tuple[tuple[str, Any], ...] = ()  # Config overrides, e.g. (("box_score_thresh", 0.05),)
    slowdown: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.slowdown < 1.0:
            raise UsageError(f"slowdown must be in [0, 1), got {self.slowdown}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Variant:
        return cls(d["label"], d["code"], tuple(tuple(kv) for kv in d["overrides"]), d.get("slowdown", 0.0))


@dataclass(frozen=True)
class Row:
    """A case run with a variant: one line of the table."""

    case: Case
    variant: Variant = Variant()

    @property
    def name(self) -> str:
        return f"{self.variant.label}:{self.case.name}" if self.variant.label else self.case.name

    @property
    def in_worker(self) -> bool:
        """Rows that run in a worker subprocess (:class:`mrcnn_bench.running.execution.WorkerRow`) even with
        ``--in-process``: bounded cases, other code, and cases whose process must flush subnormals
        from its start (:attr:`Case.flushes_subnormals`)."""
        return self.case.bounded or self.variant.code is not None or self.case.flushes_subnormals

    def to_dict(self) -> dict[str, Any]:
        """The JSON form a worker rebuilds the row from."""
        return {"case": dataclasses.asdict(self.case), "variant": self.variant.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Row:
        return cls(Case(**d["case"]), Variant.from_dict(d["variant"]))


TRAIN_BATCH = 2  # images per training step (the throughput setting)

_ALL = (
    Case("torchvision"),
    Case("static"),
    Case("static", compiler="inductor"),
    Case("static", compiler="inductor", precision="bf16"),
    Case("static", backend="xla"),
    Case("static", compiler="export"),
    Case("static", compiler="aoti"),
    Case("torchvision", compiler="inductor", bounded=True),
    Case("torchvision", backend="xla", bounded=True),
    Case("torchvision", backend="cuda"),
    Case("static", backend="cuda"),
    Case("static", backend="cuda", compiler="inductor"),
    Case("static", backend="cuda", compiler="inductor", precision="bf16"),
    Case("torchvision", phase="training"),
    Case("static", phase="training"),
    Case("static", compiler="inductor", phase="training"),
    Case("static", backend="xla", phase="training"),
    Case("torchvision", backend="cuda", phase="training"),
    Case("static", backend="cuda", phase="training"),
)
# The training rows' mask-RoI buckets (the positive quota is appended: 32 on tiny, 128 at COCO settings).
TRAIN_BUCKETS = (("mask_train_buckets", (8, 16, 32)),)
TRAIN_BUCKETS_NHWC = (*TRAIN_BUCKETS, ("channels_last", True))  # and the convolutions in channels_last
# and the pure-tensor RoIAlign (a gather, whose backward is a scatter-add) instead of torchvision's kernel
TRAIN_BUCKETS_TENSOR_OPS = (*TRAIN_BUCKETS, ("ops_impl", "tensor"))
# Named cases beyond the matrix that ``all`` runs. The gate counts the mask branch's bucketed graphs
# (one box-stage graph per canvas and one mask-stage graph per (canvas, bucket), every bucket built at
# a canvas's first call), which make bench's synthetic weights (K valid detections) would not speed up.
# The training ones time the mask-RoI buckets (torchvision's loss on fewer slots), fp32 and under bf16
# autocast, with torchvision eager under bf16 autocast beside them, and each again with channels_last;
# static inductor with pure-tensor ops; both under inductor with freezing; eager recomputing the backbone.
_EXTRA = (
    Case("static", compiler="inductor", tag="buckets", overrides=(("mask_detection_buckets", (16, 50)),)),
    Case("static", phase="training", tag="buckets", overrides=TRAIN_BUCKETS),
    Case("static", compiler="inductor", phase="training", tag="buckets", overrides=TRAIN_BUCKETS),
    Case("static", compiler="inductor", precision="bf16", phase="training", tag="buckets", overrides=TRAIN_BUCKETS),
    Case("torchvision", precision="bf16", phase="training"), Case("static", compiler="frozen"),
    Case("static", phase="training", tag="buckets-nhwc", overrides=TRAIN_BUCKETS_NHWC),
    Case("static", compiler="inductor", phase="training", tag="buckets-nhwc", overrides=TRAIN_BUCKETS_NHWC),
    Case("static", compiler="inductor", precision="bf16", phase="training", tag="buckets-nhwc",
         overrides=TRAIN_BUCKETS_NHWC),
    Case("static", compiler="inductor", phase="training", tag="buckets-tensorops", overrides=TRAIN_BUCKETS_TENSOR_OPS),
    Case("torchvision", compiler="frozen", bounded=True),
    Case("static", phase="training", tag="ckpt", overrides=(("activation_checkpointing", True),)))
CASES: dict[str, Case] = {c.name: c for c in (*_ALL, *_EXTRA)}
EXTRA: tuple[str, ...] = tuple(c.name for c in _EXTRA)  # in CASES and `list`, not in `all`
REFERENCE = "torchvision/eager"  # the oracle: latency ratios and parity are against it
TRAIN_REFERENCE = "torchvision/train"

# The quick cases (asv, pytest-benchmark, CI): seconds each on the tiny preset.
QUICK_WORKLOAD = Workload("tiny", (240, 320), 1, 3)
QUICK: tuple[str, ...] = ("torchvision/eager", "static/eager", "static/xla", "static/train")
# What the history across commits (asv) tracks: the quick cases and static/inductor, whose compile
# counts it must follow too. CI's pytest-benchmark run leaves inductor out (minutes of compiling on
# 2 cores); the gate counts its compilations there.
TRACKED: tuple[str, ...] = (*QUICK, "static/inductor")

# The main job's default matrix per preset (inference at batch 1; training at TRAIN_BATCH).
DEFAULT_WORKLOADS: dict[str, Workload] = {
    "tiny": Workload("tiny", (240, 320)),
    "coco_r50_fpn": Workload("coco_r50_fpn", (480, 640)),
}
# torchvision on XLA did not finish one image in 15 minutes here; under torch.compile each new size
# cost 45 to 478 s. Bounded cases report "> limit" with the compile counts they reached.
DEFAULT_TIME_LIMIT = {"tiny": 120.0, "coco_r50_fpn": 300.0}


def default_workload(preset: str, image_size: tuple[int, int] | None = None, batch_size: int = 1,
                     images: int = 3) -> Workload:
    """The workload of ``preset`` (its default image size unless ``image_size`` is given)."""
    default = DEFAULT_WORKLOADS.get(preset, Workload(preset))
    return Workload(preset, image_size or default.image_size, batch_size, images)


def stream_workload(preset: str, sizes: tuple[tuple[int, int], ...] | None = None, batch_size: int = 1,
                    seed: int = 0, images: int = STREAM_IMAGES) -> Workload:
    """A stream on ``preset``: ``sizes``, or the default rule's first ``images`` (:func:`stream_sizes`)."""
    default = DEFAULT_WORKLOADS.get(preset, Workload(preset))
    return Workload(preset, default.image_size, batch_size, sizes=sizes or stream_sizes(seed, images))


def default_time_limit(preset: str) -> float:
    """Seconds a bounded row gets for set-up + first call, and for each later call."""
    return DEFAULT_TIME_LIMIT.get(preset, 300.0)

PARITY_MIN_MATCHED = 0.90
PARITY_MIN_MASK_IOU = 0.85


def parse_cases(text: str | None) -> list[Case]:
    """Comma list of case names, ``all``, ``quick``, ``inference`` or ``training`` -> cases, in order."""
    if text is None or text.strip() in ("", "all"):
        return [c for name, c in CASES.items() if name not in EXTRA]
    names: list[str] = []
    for item in (n.strip() for n in text.split(",")):
        if item == "quick":
            names += QUICK
        elif item in PHASES:
            names += [n for n, c in CASES.items() if c.phase == item and n not in EXTRA]
        elif item:
            names.append(item)
    if unknown := [n for n in names if n not in CASES]:
        raise UsageError(f"unknown case(s) {unknown}; choose from {list(CASES)} (or all, quick, inference, training)")
    # A user's builder that cannot load is found now, not in each row's set-up.
    for case in (cases := [CASES[n] for n in dict.fromkeys(names)]):
        for builder in filter(None, (IMPLEMENTATIONS[case.impl].builder, COMPILERS.get(case.compiler, ""))):
            check_builder(builder, case.name)
    return cases


def check_builder(builder: str, case: str) -> None:
    """UserCasesError unless ``builder`` ("module:function") imports and names a callable."""
    module, function = builder.split(":", 1)
    try:
        found = getattr(importlib.import_module(module), function, None)
    except (Exception, SystemExit) as e:  # the user's module: say which one, whatever it raised
        raise UserCasesError(f"case {case}: builder {builder!r} cannot be loaded: {_one_line(e)}") from e
    if not callable(found):
        raise UserCasesError(f"case {case}: builder {builder!r}: {module} has no function {function!r}")


# ------------------------------------------------------------------------------------------------
# Your own cases


def register_implementation(name: str, interface: Interface, builder: str) -> None:
    """Make ``name`` usable as a case's ``impl``: a model built by ``builder`` ("module:function")."""
    if name in IMPLEMENTATIONS:
        raise UsageError(f"an implementation named {name!r} is already registered")
    if interface not in INTERFACES or ":" not in builder:
        raise UsageError(f"{name}: interface must be one of {INTERFACES} and builder 'module:function'")
    IMPLEMENTATIONS[name] = Implementation(interface, builder)


def register_compiler(name: str, builder: str) -> None:
    """Make ``name`` a case's ``compiler``: ``builder`` ("module:function"), ``(model, case, slowdown) -> Compiled``."""
    if name in COMPILERS:
        raise UsageError(f"a compiler named {name!r} is already registered")
    if ":" not in builder:
        raise UsageError(f"{name}: builder must be 'module:function'")
    COMPILERS[name] = builder


def add_case(case: Case, quick: bool = False, tracked: bool = False) -> Case:
    """Add ``case`` to CASES; ``quick``: to QUICK too (pytest-benchmark, CI), ``tracked``: to TRACKED (asv)."""
    global QUICK, TRACKED
    if case.name in CASES:
        raise UsageError(f"a case named {case.name!r} already exists")
    CASES[case.name] = case
    if quick:
        QUICK = (*QUICK, case.name)
    if quick or tracked:
        TRACKED = (*TRACKED, case.name)
    return case


USER_CASES_ENV = "MRCNN_BENCH_CASES"  # comma-separated modules that add cases
ENTRY_POINT_GROUP = "mrcnn_bench.cases"  # or entry points of this group, in any installed package


class UserCasesError(UsageError):
    """A module of ``$MRCNN_BENCH_CASES`` or an entry point failed to load: exit 2, one line naming it and its error."""


def _one_line(e: BaseException) -> str:
    """``RuntimeError: typo in my cases``: the exception's type and the first line of its message."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def load_user_cases() -> list[str]:
    """Import every module named in ``$MRCNN_BENCH_CASES`` and every entry point of the group; their names.

    Raises :class:`UserCasesError` naming the module (or entry point) that failed, whatever it raised:
    a missing module, a syntax error, an exception at import, a bad ``add_case`` call, a ``sys.exit``.
    """
    loaded = []
    for name in filter(None, (n.strip() for n in os.environ.get(USER_CASES_ENV, "").split(","))):
        try:
            importlib.import_module(name)
        except (Exception, SystemExit) as e:  # the user's module: say which one, whatever it raised
            raise UserCasesError(f"${USER_CASES_ENV}: cannot load {name!r}: {_one_line(e)}") from e
        loaded.append(name)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except (Exception, SystemExit) as e:
            raise UserCasesError(f"entry point {ep.name} = {ep.value!r} of group {ENTRY_POINT_GROUP}: cannot load: "
                                 f"{_one_line(e)}") from e
        loaded.append(ep.value)
    return loaded


USER_CASES = load_user_cases()  # last: the modules use this one's definitions above
