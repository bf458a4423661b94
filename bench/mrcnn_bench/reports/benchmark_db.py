"""Run files as records of PyTorch's open-source benchmark database, schema v3.

The schema is the ClickHouse table ``benchmark.oss_ci_benchmark_v3`` defined in pytorch/test-infra
(``clickhouse_db_schema/oss_ci_benchmark_v3/schema.sql``). A benchmark writes the parts it owns, one
JSON record per metric: ``benchmark`` (name, mode, dtype, extra_info), ``model`` (name, type,
backend, origins, extra_info), ``metric`` (name, benchmark_values, target_value, extra_info),
``runners`` and ``dependencies``. test-infra's ``upload-benchmark-results`` action adds the CI
metadata (timestamp, repo, head_sha, workflow_id, job_id...) to each record when it uploads the
folder, so those are left out here; ``metric`` is the one key the uploader requires.

Every ``extra_info`` is a ClickHouse ``Map(String, String)``: values are written as strings.
``target_value`` is a ``Float32`` that cannot be null: 0 means "no target".

    mrcnn-bench export-db RUN.json... --out results/benchmark_db.json
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from mrcnn_bench.gates.goals import speed_goals
from mrcnn_bench.reports.report import table_frame
from mrcnn_bench.running.cases import REFERENCE, TRAIN_REFERENCE
from mrcnn_bench.running.records import Record, RunDocument

BENCHMARK_NAME = "mrcnn-bench"
# Where each implementation comes from: this repository's static model, torchvision's reference; a
# user's implementation (cases.register_implementation) is named by itself.
ORIGINS = {"static": "mrcnn", "torchvision": "torchvision"}
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}

# (record field, metric name, unit) of the single-valued metrics each record may carry.
SCALAR_METRICS = (
    ("first_result_s", "time_to_first_result_s", "s"),
    ("peak_mem_gb", "peak_memory_gb", "GB"),
    ("uncached_compile", "xla_compiles", "count"),
    ("fallback_ops", "xla_cpu_fallbacks", "count"),
    ("unique_graphs", "dynamo_graphs", "count"),
    ("graph_breaks", "dynamo_graph_breaks", "count"),
    ("recompiles", "dynamo_recompiles", "count"),
    ("box_ap", "coco_box_ap", "AP"),
    ("mask_ap", "coco_mask_ap", "AP"),
)


def _strings(d: dict[str, Any]) -> dict[str, str]:
    """A ``Map(String, String)``: missing values dropped, the rest as strings."""
    return {k: str(v) for k, v in d.items() if v is not None and v == v}


def runner(env: dict[str, Any]) -> dict[str, Any]:
    """The ``runners`` entry of the machine a run file was measured on."""
    gpu = env.get("gpu")
    return {
        "name": str(env.get("host") or ""),
        "type": str(env.get("platform") or ""),
        "cpu_info": str(env.get("cpu") or ""),
        "cpu_count": int(env.get("affinity") or env.get("cpu_count") or 0),
        "mem_info": "",
        "avail_mem_in_gb": 0,
        "gpu_info": str(gpu or ""),
        "gpu_count": 1 if gpu else 0,
        "gpu_mem_info": "",
        "avail_gpu_mem_in_gb": 0,
        "extra_info": _strings({"threads": env.get("threads"), "pjrt_device": env.get("pjrt_device")}),
    }


def dependencies(env: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """torch, torchvision and torch_xla at the versions the run used; the project at its commit."""
    deps = {name: {"repo": f"pytorch/{'xla' if name == 'torch_xla' else name}", "branch": "", "sha": "",
                   "version": str(env.get(name) or ""), "extra_info": {}}
            for name in ("torch", "torchvision", "torch_xla") if env.get(name)}
    deps["mrcnn"] = {"repo": "", "branch": "", "sha": str(env.get("commit") or ""), "version": "",
                     "extra_info": _strings({"dirty": env.get("dirty")})}
    return deps


def _target(rec: Record, overrides: dict[str, Any]) -> float:
    """The row's first speed goal set against torchvision (eager, or its training step) as a time
    ratio, the one the table's ``x tv`` column is compared with; 0: none."""
    factors = [g.factor for g in speed_goals(rec.case, rec.preset, rec.image_size, overrides)
               if g.base in (REFERENCE, TRAIN_REFERENCE)]
    return factors[0] if factors else 0.0


def records(doc: RunDocument) -> Iterator[dict[str, Any]]:
    """One v3 record per (row, metric) of a run file; rows that were not measured give none."""
    ratios = table_frame(doc.records, doc.run.overrides).set_index("row")["ratio_vs_tv"]
    for rec in doc.records:
        if rec.status != "ok" or not rec.times_s:
            continue
        env = {**doc.environment, **rec.env}
        base = {
            "benchmark": {"name": BENCHMARK_NAME, "mode": rec.phase, "dtype": DTYPES.get(rec.precision, rec.precision),
                          "extra_info": _strings({"preset": rec.preset, "image_size": rec.image_size,
                                                  "batch_size": rec.batch_size, "run": doc.name,
                                                  "rounds": len(rec.times_s), "variant": rec.variant})},
            "model": {"name": f"maskrcnn_{rec.impl}", "type": "detection",
                      "backend": rec.backend if rec.compiler == "eager" else f"{rec.backend}_{rec.compiler}",
                      "origins": [ORIGINS.get(rec.impl, rec.impl)],
                      "extra_info": _strings({"case": rec.case, "row": rec.row, "compiler": rec.compiler})},
            "runners": [runner(env)],
            "dependencies": dependencies(env),
        }
        unit = "s per training step" if rec.phase == "training" else "s per call"
        yield {**base, "metric": {"name": "latency_s", "benchmark_values": [float(t) for t in rec.times_s],
                                  "target_value": 0.0, "extra_info": {"unit": unit, "statistic": "every round"}}}
        ratio = float(ratios.get(rec.row, math.nan))
        reference = TRAIN_REFERENCE if rec.phase == "training" else REFERENCE
        if ratio == ratio and rec.case != reference:
            extra = {"reference": reference, "statistic": "median over the reference's median, same run"}
            yield {**base, "metric": {"name": "ratio_to_torchvision", "benchmark_values": [ratio],
                                      "target_value": _target(rec, doc.run.overrides), "extra_info": extra}}
        for field, name, unit in SCALAR_METRICS:
            value = getattr(rec, field)
            if isinstance(value, (int, float)) and value == value:
                yield {**base, "metric": {"name": name, "benchmark_values": [float(value)], "target_value": 0.0,
                                          "extra_info": {"unit": unit}}}


def export(docs: list[RunDocument]) -> list[dict[str, Any]]:
    """Every record of every run file, in the order given."""
    return [r for doc in docs for r in records(doc)]
