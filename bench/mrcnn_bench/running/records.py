"""Typed results: a row's raw measurements (:class:`RowResult`), its flat record (:class:`Record`), and
the run file that holds them (:class:`RunDocument`).

A run file (``mrcnn-bench run --out DIR`` writes ``DIR/<name>.json``) is::

    {"schema": 1, "name": ..., "environment": {...}, "run": {peaks, machine load, options},
     "records": [{...one row...}, ...]}

Every record repeats the environment (commit, versions, device names, threads, seed, host) as
``env_<key>`` entries, so records from several machines and commits can be concatenated into one
table without losing where each came from. :meth:`Record.to_dict` gives exactly those keys (the
JSON form, NaN where a value is missing; :mod:`mrcnn_bench.running.store` writes NaN as null), and
:meth:`Record.from_dict` reads them back, null as NaN.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.running.backends import Backend
from mrcnn_bench.running.cases import TRAIN_BATCH, Phase, Precision, Row, Workload
from mrcnn_bench.running.journal import check_name
from mrcnn_bench.running.parity import aggregate_parity

SCHEMA = 1
NAN = math.nan
Status = Literal["pending", "ok", "skipped", "timeout", "error"]


@dataclass
class RowResult:
    """What the run loop measured of one row, before it is flattened into a :class:`Record`."""

    row: Row
    status: Status = "pending"
    detail: str = ""
    setup_s: float = NAN
    first_result_s: float = NAN
    warmup_s: list[float] = field(default_factory=list)  # each warm-up call, compilation included
    times: list[float] = field(default_factory=list)
    counters_start: dict[str, float] = field(default_factory=dict)
    counters_warm: dict[str, float] = field(default_factory=dict)
    counters_end: dict[str, float] = field(default_factory=dict)
    counters_rounds: dict[str, float] = field(default_factory=dict)  # summed over the timed calls only
    reasons: dict[str, list[str]] = field(default_factory=dict)  # dynamo's graph-break / recompile reasons
    accuracy: dict[str, float] = field(default_factory=dict)  # COCO metrics (--eval)
    parity: list[dict[str, Any]] = field(default_factory=list)
    peak_mem_gb: float = NAN
    call_mem_gb: float = NAN
    flops: float = NAN
    losses: list[float] = field(default_factory=list)


@dataclass
class Record:
    """One row of a run, flat: what the tables, ``compare`` and the dashboard read.

    Counts (compiles, graphs, breaks) are floats so that "not applicable" can be NaN. The slowdown
    of a variant (:attr:`mrcnn_bench.running.cases.Variant.slowdown`) is listed in ``variant_overrides`` as
    ``inject_slowdown``, the name it had when it was a config field, so run files read as before.
    """

    row: str = ""  # "A:static/eager" in compare, else the case name
    case: str = ""
    variant: str = ""
    variant_code: str | None = None
    variant_overrides: dict[str, Any] = field(default_factory=dict)
    impl: str = "static"  # a key of cases.IMPLEMENTATIONS
    backend: Backend = "cpu"
    compiler: str = "eager"  # a key of cases.COMPILERS
    precision: Precision = "fp32"
    phase: Phase = "inference"
    preset: str = ""
    image_size: str = ""  # "HxW"; "stream HxW,HxW,..." for the inference rows of a stream
    batch_size: int = 1  # images per call (TRAIN_BATCH for training rows)
    status: Status = "pending"
    detail: str = ""
    median_s: float = NAN
    iqr_s: float = NAN
    times_s: list[float] = field(default_factory=list)
    images_per_s: float = NAN
    latency_per_image_s: float = NAN
    first_result_s: float = NAN
    setup_s: float = NAN
    compile_s: float = NAN
    uncached_compile: float = NAN
    uncached_compile_rounds: float = NAN
    fallback_ops: float = NAN
    unique_graphs: float = NAN
    graph_breaks: float = NAN
    recompiles: float = NAN
    unique_graphs_rounds: float = NAN
    counters_end: dict[str, float] = field(default_factory=dict)
    reasons: dict[str, list[str]] = field(default_factory=dict)
    flops: float = NAN
    gflops_s: float = NAN
    frac_peak: float = NAN
    peak_mem_gb: float = NAN
    call_mem_gb: float = NAN
    parity_matched_ref: float = NAN
    parity_matched_other: float = NAN
    mask_iou_mean: float = NAN
    mask_iou_min: float = NAN
    final_loss: float = NAN
    box_ap: float = NAN
    mask_ap: float = NAN
    eval_images: int = 0
    # Added later, written only when set (so older run files read back the same): the warm-up calls,
    # which go once over every distinct input before round 1, compilation included, and their sum,
    # the time of one cold pass over the workload's images.
    warmup_s: list[float] = field(default_factory=list)
    first_pass_s: float = NAN
    env: dict[str, Any] = field(default_factory=dict)  # written as env_<key> entries

    def to_dict(self) -> dict[str, Any]:
        """The record's JSON form: today's keys, in order, the environment as ``env_<key>``."""
        out = {f.name: getattr(self, f.name) for f in _FIELDS}
        for name in _RECORD_WRITTEN_WHEN_SET:
            value = out[name]
            if value == [] or value != value:  # empty or NaN
                del out[name]
        out.update({f"env_{k}": v for k, v in self.env.items()})
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Record:
        """A record from its JSON form (null as NaN); missing keys take their defaults."""
        unknown = [k for k in d if k not in _FIELD_NAMES and not k.startswith("env_")]
        if unknown:
            raise UsageError(f"not a record: unknown key(s) {unknown}")
        values = {k: (NAN if v is None and k in _FLOAT_FIELDS else v) for k, v in d.items() if k in _FIELD_NAMES}
        bad = [k for k in _FLOAT_FIELDS & set(values) if not _is_number(values[k])]
        if bad:
            raise UsageError(f"record {d.get('row')!r}: {', '.join(sorted(bad))} must be numbers or null")
        times = values.get("times_s", [])
        if not isinstance(times, list) or not all(_is_number(t) and math.isfinite(t) and t >= 0 for t in times):
            raise UsageError(f"record {d.get('row')!r}: times_s must be a list of seconds (finite, >= 0)")
        env = {k[len("env_"):]: v for k, v in d.items() if k.startswith("env_")}
        return cls(**values, env=env)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


_FIELDS = [f for f in dataclasses.fields(Record) if f.name != "env"]
_RECORD_WRITTEN_WHEN_SET = ("warmup_s", "first_pass_s")
_FIELD_NAMES = frozenset(f.name for f in _FIELDS)
_FLOAT_FIELDS = frozenset(f.name for f in _FIELDS if f.type == "float")


@dataclass
class RunInfo:
    """The ``run`` part of a run file: how the run went as a whole."""

    stages: dict[str, dict[str, float]] | None = None  # --profile: seconds per stage, per implementation
    workload: Workload = field(default_factory=Workload)
    peaks: dict[str, float] = field(default_factory=dict)  # GFLOP/s per kernel (probes.measure_peaks)
    machine_per_round: list[dict[str, float]] = field(default_factory=list)  # probes.machine_state
    limit_s: float = NAN  # time limit of bounded rows
    weights: str = ""  # where the weights came from
    total_s: float = NAN
    threads: int = 1
    options: dict[str, Any] = field(default_factory=dict)  # rounds, warmup, seed, cache, COCO root, overrides
    interrupted: str = ""  # the signal that stopped the run (SIGTERM, SIGINT) before its last round
    resumed_from_round: int = 0  # rounds read back from the journal of an interrupted run (--resume)
    ceiling: dict[str, Any] = field(default_factory=dict)  # mrcnn_bench.running.ceiling.Ceiling, as a dict
    stage_flops: dict[str, dict[str, float]] = field(default_factory=dict)  # --profile: FLOPs by implementation, stage
    # --profile: exact work counters by implementation, stage key, counter (mrcnn_bench.running.work_counters)
    stage_work: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)

    @property
    def overrides(self) -> dict[str, Any]:
        """The config overrides the run was made with (``--set``); empty when none."""
        return dict(self.options.get("overrides") or {})

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["workload"] = self.workload.to_dict()
        for name in _WRITTEN_WHEN_SET:  # added later: absent means unset, so older run files read back the same
            if not out[name]:
                del out[name]
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunInfo:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = [k for k in d if k not in names]
        if unknown:
            raise UsageError(f"not a run's information: unknown key(s) {unknown}")
        floats = {f.name for f in dataclasses.fields(cls) if f.type == "float"}
        values = {k: (NAN if v is None and k in floats else v) for k, v in d.items()}  # null: NaN, as written
        if "workload" in d:
            values["workload"] = Workload.from_dict(d["workload"])
        return cls(**values)


_WRITTEN_WHEN_SET = ("interrupted", "resumed_from_round", "ceiling", "stage_flops", "stage_work")


@dataclass
class RunDocument:
    """A run file: its name, environment, run information and records."""

    name: str
    environment: dict[str, Any]
    run: RunInfo
    records: list[Record]
    schema: int = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "name": self.name, "environment": self.environment,
                "run": self.run.to_dict(), "records": [r.to_dict() for r in self.records]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunDocument:
        """ValueError unless ``d`` is a run file of :data:`SCHEMA`."""
        if not isinstance(d, dict) or d.get("schema") != SCHEMA or not isinstance(d.get("records"), list):
            raise UsageError(f"not an mrcnn-bench run file (schema {SCHEMA} with 'records')")
        # The name becomes the report's file names: a path in it would write outside --out.
        return cls(check_name(d.get("name"), "its 'name'"), d["environment"], RunInfo.from_dict(d["run"]),
                   [Record.from_dict(r) for r in d["records"]], d["schema"])


def as_number(x: Any) -> float:
    """A record's value as a float; NaN for a missing (None) or non-numeric one."""
    return float(x) if isinstance(x, (int, float)) and x is not None else math.nan


def median_iqr(xs: list[float]) -> tuple[float, float]:
    """Median and interquartile range (torch.quantile's linear interpolation); NaN for no samples."""
    if not xs:
        return NAN, NAN
    t = torch.tensor(xs, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
    return float(q[1]), float(q[2] - q[0])


def _delta(a: dict[str, float], b: dict[str, float], key: str) -> float:
    if key not in b:
        return NAN
    return float(b[key]) - float(a.get(key, 0))


def variant_overrides(row: Row) -> dict[str, Any]:
    """The case's and the variant's config overrides, and the slowdown under the name run files have always used."""
    out = {**dict(row.case.overrides), **dict(row.variant.overrides)}
    if row.variant.slowdown:
        out["inject_slowdown"] = row.variant.slowdown
    return out


def make_record(r: RowResult, run: RunInfo, env: dict[str, Any]) -> Record:
    """One row of a run as a flat record."""
    case, workload = r.row.case, run.workload
    med, iqr = median_iqr(r.times)
    measured = med == med
    images_per_call = TRAIN_BATCH if case.phase == "training" else workload.batch_size
    tag = "bf16" if case.precision == "bf16" else "fp32"
    # The machine's fixed ceiling (mrcnn_bench.running.ceiling) where measured; older run files: their kernel peaks.
    # A ceiling some kernel beat is no ceiling: no fraction of it (its notes say why).
    peak = run.ceiling.get(f"{tag}_gflops", NAN) if run.ceiling else NAN
    if peak != peak:
        peak = max((v for k, v in run.peaks.items() if k.endswith(tag)), default=NAN)
    if run.ceiling.get("unreliable"):
        peak = NAN
    gflops = r.flops / med / 1e9 if measured else NAN
    warm, rounds, start = r.counters_warm, r.counters_rounds, r.counters_start
    par = aggregate_parity(r.parity) if r.parity else None
    # A row that ran no round errored, unless the run was stopped before its rounds.
    no_rounds = r.status == "ok" and not r.times and run.options["rounds"] > 0 and not run.interrupted
    status = "error" if no_rounds else r.status
    return Record(
        row=r.row.name, case=case.name, variant=r.row.variant.label, variant_code=r.row.variant.code,
        variant_overrides=variant_overrides(r.row), impl=case.impl, backend=case.backend, compiler=case.compiler,
        precision=case.precision, phase=case.phase, preset=workload.preset,
        image_size=image_size_text(case.phase, workload), batch_size=images_per_call, status=status,
        detail=r.detail, median_s=med, iqr_s=iqr, times_s=list(r.times),
        images_per_s=images_per_call / med if measured else NAN,
        latency_per_image_s=med / images_per_call if measured else NAN,
        first_result_s=r.first_result_s, setup_s=r.setup_s,
        compile_s=_delta(start, warm, "compile_s"),
        uncached_compile=_delta(start, warm, "uncached_compile"),
        uncached_compile_rounds=rounds.get("uncached_compile", NAN),
        fallback_ops=warm.get("fallback_ops", r.counters_end.get("fallback_ops", NAN)),
        unique_graphs=_delta(start, warm, "unique_graphs"),
        graph_breaks=_delta(start, warm, "graph_breaks"),
        recompiles=_delta(start, warm, "recompiles") + rounds.get("recompiles", 0),
        unique_graphs_rounds=rounds.get("unique_graphs", NAN),
        counters_end=r.counters_end, reasons=r.reasons, flops=r.flops, gflops_s=gflops,
        frac_peak=gflops / peak if case.backend in ("cpu", "xla") and peak == peak else NAN,
        peak_mem_gb=r.peak_mem_gb, call_mem_gb=r.call_mem_gb,
        parity_matched_ref=par["matched_ref"] if par else NAN,
        parity_matched_other=par["matched_other"] if par else NAN,
        mask_iou_mean=par["mask_iou_mean"] if par else NAN,
        mask_iou_min=par["mask_iou_min"] if par else NAN,
        final_loss=r.losses[-1] if r.losses else NAN,
        box_ap=r.accuracy.get("box_ap", NAN), mask_ap=r.accuracy.get("mask_ap", NAN),
        eval_images=r.accuracy.get("eval_images", 0),
        warmup_s=list(r.warmup_s), first_pass_s=first_pass_seconds(r.warmup_s, case.phase, workload), env=env,
    )


def image_size_text(phase: Phase, workload: Workload) -> str:
    """``HxW``, or for the inference rows of a stream ``stream HxW,HxW,...``: what a row was timed on
    (training steps take ``workload.image_size`` either way)."""
    if workload.sizes and phase == "inference":
        return "stream " + ",".join(f"{h}x{w}" for h, w in workload.sizes)
    return "x".join(map(str, workload.image_size))


def one_pass_calls(phase: Phase, workload: Workload) -> int:
    """Calls that go once over every distinct input: a training step, or images / gcd(batch, images)
    inference calls (call ``i`` takes images ``i*b .. i*b+b-1`` modulo the run's images)."""
    return 1 if phase == "training" else workload.images // math.gcd(workload.batch_size, workload.images)


def first_pass_seconds(warmup_s: list[float], phase: Phase, workload: Workload) -> float:
    """One cold pass over the distinct inputs, compilation included: the first warm-up calls' sum."""
    calls = one_pass_calls(phase, workload)
    return math.fsum(warmup_s[:calls]) if len(warmup_s) >= calls else NAN


def to_document(rows: list[RowResult], run: RunInfo, name: str, env: dict[str, Any]) -> RunDocument:
    """The run file of a finished run."""
    return RunDocument(name, env, run, [make_record(r, run, env) for r in rows])
