"""``mrcnn-bench export-db``: records that PyTorch's open-source benchmark database (schema v3) accepts.

The required fields and their types are those of pytorch/test-infra:
- ``clickhouse_db_schema/oss_ci_benchmark_v3/schema.sql``: the table's ``benchmark``, ``model``,
  ``metric``, ``runners`` and ``dependencies`` columns, with ``Map(String, String)`` extra_info,
  ``Array(Float32)`` benchmark_values and a ``Float32`` (not nullable) target_value;
- ``.github/scripts/upload_benchmark_results.py``: ``process_benchmark_results`` skips any record
  without ``metric``, and the upload action adds the CI metadata (timestamp, repo, head_sha...).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mrcnn_bench.cli import commands as cli
from mrcnn_bench.gates.goals import speed_goals
from mrcnn_bench.reports import benchmark_db
from mrcnn_bench.running import store

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "results" / "runs" / "run_tiny.json"

# schema.sql, column by column: the tuple fields a benchmark writes, with their ClickHouse types.
BENCHMARK = {"name": str, "mode": str, "dtype": str, "extra_info": dict}
MODEL = {"name": str, "type": str, "backend": str, "origins": list, "extra_info": dict}
METRIC = {"name": str, "benchmark_values": list, "target_value": float, "extra_info": dict}
RUNNER = {"name": str, "type": str, "cpu_info": str, "cpu_count": int, "mem_info": str, "avail_mem_in_gb": int,
          "gpu_info": str, "gpu_count": int, "gpu_mem_info": str, "avail_gpu_mem_in_gb": int, "extra_info": dict}
DEPENDENCY = {"repo": str, "branch": str, "sha": str, "version": str, "extra_info": dict}
CI_METADATA = ("timestamp", "repo", "head_branch", "head_sha", "workflow_id", "run_attempt", "job_id")


def check_tuple(value: dict, fields: dict[str, type], where: str) -> None:
    assert set(value) == set(fields), (where, set(value) ^ set(fields))
    for name, kind in fields.items():
        assert isinstance(value[name], kind), (where, name, value[name])
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in value["extra_info"].items()), where


def test_every_record_has_the_v3_columns_with_their_types(tmp_path, capsys):
    out = tmp_path / "db.json"
    assert cli.main(["export-db", str(RUN), "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert f"wrote {len(rows)} records" in capsys.readouterr().out
    doc = store.load(RUN)
    measured = [r for r in doc.records if r.status == "ok" and r.times_s]
    assert len(rows) >= 2 * len(measured) - 2  # latency for each, a ratio for each but the two references
    for i, row in enumerate(rows):
        assert "metric" in row and not set(CI_METADATA) & set(row), i  # the uploader adds those
        check_tuple(row["benchmark"], BENCHMARK, f"{i}.benchmark")
        check_tuple(row["model"], MODEL, f"{i}.model")
        check_tuple(row["metric"], METRIC, f"{i}.metric")
        values = row["metric"]["benchmark_values"]
        assert values and all(isinstance(v, float) and math.isfinite(v) for v in values), i
        for runner in row["runners"]:
            check_tuple(runner, RUNNER, f"{i}.runner")
        for name, dep in row["dependencies"].items():
            check_tuple(dep, DEPENDENCY, f"{i}.dependencies.{name}")


def test_latency_keeps_every_round_and_the_ratio_carries_the_goal():
    doc = store.load(RUN)
    rows = benchmark_db.export([doc])
    inductor = next(r for r in doc.records if r.case == "static/inductor")
    latency = next(r for r in rows if r["model"]["extra_info"]["case"] == "static/inductor"
                   and r["metric"]["name"] == "latency_s")
    assert latency["metric"]["benchmark_values"] == inductor.times_s
    assert latency["benchmark"]["extra_info"]["rounds"] == str(len(inductor.times_s))
    def ratio(case):
        return next(r for r in rows if r["model"]["extra_info"]["case"] == case
                    and r["metric"]["name"] == "ratio_to_torchvision")
    # A training row's goal against torchvision's step is exported (static eager's); static inductor's
    # training goal is against static eager, and at a fixed tiny size its inference goal against
    # torchvision inductor: neither is the ratio exported, so no target for them.
    assert ratio("static/train")["metric"]["target_value"] == pytest.approx(
        speed_goals("static/train", inductor.preset)[0].factor) == 1.0
    assert ratio("static/inductor-train")["metric"]["target_value"] == 0.0
    assert ratio("static/inductor")["metric"]["target_value"] == 0.0
    assert not any(r["metric"]["name"] == "ratio_to_torchvision" and r["model"]["extra_info"]["case"]
                   == "torchvision/eager" for r in rows)
