"""asv benchmarks: every figure the harness tracks across commits, read from one measurement per commit.

asv calls ``setup_cache`` of :class:`_Commit` once per commit (every class below inherits it, and
asv keys the cache by the method's source line, so they all share it). It runs
:func:`mrcnn_bench.history.commit.measure_commit`: each tracked case timed against the ruler in processes
of its own (several per inference case, pooled), the compile probes, and the fixed checkpoint's
AP. The ``track_`` methods only read that record, so no benchmark recompiles the model and no
compilation can fall inside a timed sample.

asv treats larger as worse, so each metric is in its lower-is-better form and its unit says so.
The ratios to the ruler are the figures to read across commits; raw seconds drift with the machine
and are kept for reference only. Why rounds, repeat and processes are set as they are:
results/asv/README.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mrcnn_bench.history.commit import COUNTERS, Part, compiled, measure_commit
from mrcnn_bench.history.fixed_accuracy import DEFAULT_ROOT, FIXTURE_ENV
from mrcnn_bench.history.shared_rounds import staged
from mrcnn_bench.running.cases import CASES, TRACKED
from mrcnn_bench.running.stages import STAGE_KEYS

REPO = Path(__file__).resolve().parents[2]

INFERENCE = [n for n in TRACKED if CASES[n].phase == "inference"]
TRAINING = [n for n in TRACKED if CASES[n].phase == "training"]
COMPILED = [n for n in TRACKED if compiled(n)]
STAGED = [n for n in INFERENCE if staged(CASES[n])]
SERIES = "shared-rounds-1"  # the version of the series measured by mrcnn_bench.history.shared_rounds
RATIO_UNIT = "ratio to the ruler (torchvision eager, fixed across commits) in the same rounds; lower is better"
CASES_ENV = "MRCNN_ASV_CASES"

Cache = dict[str, Any]


def _part(cache: Cache, kind: str, case: str = "") -> Part:
    d = cache[kind] if kind == "accuracy" else cache[kind].get(case)
    if d is None:
        raise NotImplementedError(f"{case}: not measured")
    return Part(**d)


def _skip_unless_measured(cache: Cache, kind: str, case: str = "") -> None:
    """asv reports a benchmark whose ``setup`` raises NotImplementedError as skipped, not failed."""
    reason = CASES[case].skip_reason() if case else None
    if reason:
        raise NotImplementedError(f"{case}: {reason}")
    part = _part(cache, kind, case)
    if part.skipped:
        raise NotImplementedError(part.error)


def measured_cases() -> tuple[str, ...]:
    """The tracked cases a commit's measurement times: all of them, or those ``$MRCNN_ASV_CASES``
    names (a comma list), so that ``asv find`` bisecting one case's metric measures that case only
    (the others' benchmarks are then skipped, never given a number; run it with ``--skip-save`` so
    that a partial record does not replace a commit's full one in the results)."""
    names = tuple(n.strip() for n in os.environ.get(CASES_ENV, "").split(",") if n.strip())
    unknown = [n for n in names if n not in TRACKED]
    if unknown:
        raise ValueError(f"${CASES_ENV} names case(s) that are not tracked: {unknown}; tracked: {', '.join(TRACKED)}")
    return names or TRACKED


class _Commit:
    """The one measurement of a commit. Its own repetition is inside: 20 to 200 interleaved rounds
    per case (:data:`mrcnn_bench.history.interleaved.DEFAULT_BUDGET_S` seconds of them); asv runs each
    ``track_`` once."""

    timeout = 3600  # setup_cache: every part of the commit, one after another
    repeat = 1
    rounds = 1
    number = 1
    processes = 1
    warmup_time = 0

    def setup_cache(self) -> Cache:
        # asv runs this in a temporary folder: the fixture's default path is the repository's.
        os.environ.setdefault(FIXTURE_ENV, str(REPO / DEFAULT_ROOT))
        return measure_commit(cases=measured_cases()).to_dict()


class Latency(_Commit):
    """Inference, one image per call (tiny preset, the ruler's 240x320 images)."""

    params = INFERENCE
    param_names = ("case",)
    # A new series: the cases share the ruler's rounds in a few processes since this version (one
    # process and one ruler per case before). asv draws only results of the suite's version, so
    # results measured the old way stay in their files but leave the graphs until re-measured.
    version = SERIES

    def setup(self, cache: Cache, case: str) -> None:
        _skip_unless_measured(cache, "timing", case)

    def track_ratio(self, cache: Cache, case: str) -> float:
        return _part(cache, "timing", case).value("ratio_median")

    track_ratio.unit = RATIO_UNIT

    def track_seconds(self, cache: Cache, case: str) -> float:
        return _part(cache, "timing", case).value("seconds_median")

    track_seconds.unit = "seconds per image, raw median (drifts with the machine: read the ratio)"

    def track_first_result(self, cache: Cache, case: str) -> float:
        return _part(cache, "timing", case).value("first_result_s")

    track_first_result.unit = "seconds to the first result (first call, compilation included)"

    def track_peak_memory(self, cache: Cache, case: str) -> float:
        return _part(cache, "timing", case).value("peak_memory_gb")

    track_peak_memory.unit = (
        "GB peak memory over the case's calls after warm-up, every case's model resident (RSS on CPU/XLA:CPU, "
        "allocated on CUDA)"
    )

    def track_flops(self, cache: Cache, case: str) -> float:
        return _part(cache, "timing", case).value("flops")

    track_flops.unit = "FLOPs per call (FlopCounterMode, eager CPU model)"

    def track_load(self, cache: Cache, case: str) -> float:
        return _part(cache, "timing", case).value("loadavg_after")

    track_load.unit = "load average (1 min) after the rounds: context for the raw seconds, not a metric"


class Stages(_Commit):
    """Inference stage by stage (backbone, RPN, heads, ...: mrcnn_bench.running.stages.STAGE_KEYS), for the
    eager cases, timed in the same calls as the whole: when a ratio steps, the stages that stepped
    with it say where."""

    params = (STAGED, list(STAGE_KEYS.values()))
    param_names = ("case", "stage")
    version = SERIES

    def setup(self, cache: Cache, case: str, stage: str) -> None:
        _skip_unless_measured(cache, "timing", case)
        record = _part(cache, "timing", case).record
        if record is not None and stage not in record.get("stage_ratio_median", {}):
            raise NotImplementedError(f"{case}: stage {stage} not measured")

    def track_ratio(self, cache: Cache, case: str, stage: str) -> float:
        part = _part(cache, "timing", case)
        if part.record is None:  # the measurement failed: asv shows it failed, never a number
            raise RuntimeError(part.error or "no record")
        return float(part.record["stage_ratio_median"][stage])

    track_ratio.unit = RATIO_UNIT.replace("in the same rounds", "same stage, same calls")


WORK_UNIT = ("exact: any change is a step. {what} in one call of the first ruler image, per stage "
             "(mrcnn_bench.running.work_counters); a compiled case is counted on the eager fp32 CPU model of "
             "its config; lower is better")


class StageWork(_Commit):
    """The work of an inference call, stage by stage, counted exactly (FLOPs, aten operators, bytes
    written), once per commit outside every timed process: more work (an extra convolution, a copy,
    a dtype round trip, a larger canvas) steps these series with no noise. What they cannot see, the
    latency ratios can: threads, memory bandwidth, caches, the work inside one operator."""

    params = (INFERENCE, list(STAGE_KEYS.values()))
    param_names = ("case", "stage")
    # What the counters count: a change to a rule of mrcnn_bench.running.work_counters is a new
    # version, so that counts made under the old rule are never read as a step of the new series.
    version = "work-counters-1"

    def setup(self, cache: Cache, case: str, stage: str) -> None:
        reason = CASES[case].skip_reason()
        if reason:
            raise NotImplementedError(f"{case}: {reason}")
        part = _work(cache, case)
        if stage not in (part.record or {}):
            raise NotImplementedError(f"{case}: stage {stage} not counted")

    def _count(self, cache: Cache, case: str, stage: str, counter: str) -> float:
        return float(_work(cache, case).record[stage][counter])

    def track_flops(self, cache: Cache, case: str, stage: str) -> float:
        return self._count(cache, case, stage, "flops")

    track_flops.unit = WORK_UNIT.format(what="FLOPs (FlopCounterMode, 2 per multiply-add)")

    def track_ops(self, cache: Cache, case: str, stage: str) -> float:
        return self._count(cache, case, stage, "ops")

    track_ops.unit = WORK_UNIT.format(what="aten operators dispatched (views included)")

    def track_bytes(self, cache: Cache, case: str, stage: str) -> float:
        return self._count(cache, case, stage, "bytes")

    track_bytes.unit = WORK_UNIT.format(what="bytes written by operators (outputs, in-place included, views not)")


def _work(cache: Cache, case: str) -> Part:
    """The case's work counts; NotImplementedError (asv: skipped) when there are none: a commit
    measured before the counters, or a count that failed, is never a number and never a failure."""
    d = cache.get("work", {}).get(case)
    part = Part(**d) if d is not None else None
    if part is None or part.record is None:
        raise NotImplementedError(f"{case}: work not counted" + (f" ({part.error})" if part and part.error else ""))
    return part


class Training(_Commit):
    """One SGD step on two images (tiny preset)."""

    params = TRAINING
    param_names = ("case",)

    def setup(self, cache: Cache, case: str) -> None:
        _skip_unless_measured(cache, "timing", case)

    def track_ratio(self, cache: Cache, case: str) -> float:
        return _part(cache, "timing", case).value("ratio_median")

    track_ratio.unit = RATIO_UNIT.replace("eager", "training step")

    def track_seconds_per_image(self, cache: Cache, case: str) -> float:
        part = _part(cache, "timing", case)
        return part.value("seconds_median") / part.value("images_per_call")

    track_seconds_per_image.unit = "seconds per training image, raw median step / batch (1 / throughput)"

    def track_first_result(self, cache: Cache, case: str) -> float:
        return _part(cache, "timing", case).value("first_result_s")

    track_first_result.unit = "seconds to the first step (compilation included)"

    def track_peak_memory(self, cache: Cache, case: str) -> float:
        return _part(cache, "timing", case).value("peak_memory_gb")

    track_peak_memory.unit = "GB peak memory over steps after warm-up (RSS on CPU, allocated on CUDA)"


class Compiles(_Commit):
    """The backends' own compile counters after one call per gate size (seven sizes, two canvases)."""

    params = (COMPILED, list(COUNTERS))
    param_names = ("case", "counter")

    def setup(self, cache: Cache, case: str, counter: str) -> None:
        _skip_unless_measured(cache, "compiles", case)
        record = _part(cache, "compiles", case).record
        if record is not None and COUNTERS[counter] not in record:
            raise NotImplementedError(f"{case} has no {counter} counter")

    def track_count(self, cache: Cache, case: str, counter: str) -> float:
        return _part(cache, "compiles", case).value(COUNTERS[counter])

    track_count.unit = "count (exact; any increase is a regression)"


class Accuracy(_Commit):
    """The fixed checkpoint (torchvision's model trained once on the ci recipe) through the commit's
    static inference, scored by pycocotools on the fixed images."""

    def setup(self, cache: Cache) -> None:
        _skip_unless_measured(cache, "accuracy")

    def track_box_error(self, cache: Cache) -> float:
        return 1.0 - _part(cache, "accuracy").value("box_ap")

    track_box_error.unit = "1 - box AP@[.5:.95]"

    def track_mask_error(self, cache: Cache) -> float:
        return 1.0 - _part(cache, "accuracy").value("mask_ap")

    track_mask_error.unit = "1 - mask AP@[.5:.95]"
