"""Records: one flat dict per row of a run, each carrying its environment; JSON files in, DataFrames out.

A run file (``mrcnn-bench run --out DIR`` writes ``DIR/<name>.json``) is::

    {"schema": 1, "name": ..., "environment": {...}, "run": {peaks, machine load, options},
     "records": [{...one row...}, ...]}

Every record repeats the environment (commit, versions, device names, threads, seed, host), so
records from several machines and commits can be concatenated into one table
(:func:`load_records`) without losing where each came from.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import platform
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from mrcnn_bench.cases import TRAIN_BATCH
from mrcnn_bench.parity import aggregate_parity
from mrcnn_bench.runner import RowResult

SCHEMA = 1
REPO = Path(__file__).resolve().parents[2]


def environment(threads: int, seed: int) -> dict[str, Any]:
    """Versions, CPU/GPU, threads, seed, commit, host and date: what a result needs to be compared later."""
    from importlib.metadata import PackageNotFoundError, version

    env: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": threads,
        "seed": seed,
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "pjrt_device": os.environ.get("PJRT_DEVICE"),
        "cpu": cpu_model(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    for dist in ("torchvision", "torch_xla"):
        try:
            env[dist] = version(dist)
        except PackageNotFoundError:
            env[dist] = None
    env["commit"] = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    env["dirty"] = None if status is None else bool(status)
    return env


def cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def git(*args: str, cwd: Path = REPO) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def median_iqr(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return math.nan, math.nan
    t = torch.tensor(xs, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
    return float(q[1]), float(q[2] - q[0])


def _delta(a: dict[str, float], b: dict[str, float], key: str) -> float:
    if key not in b:
        return math.nan
    return float(b[key]) - float(a.get(key, 0))


def record(r: RowResult, run: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    """One row of a run as a flat, JSON-ready record."""
    case, workload = r.row.case, run["workload"]
    med, iqr = median_iqr(r.times)
    training = case.phase == "training"
    images_per_call = TRAIN_BATCH if training else workload["batch_size"]
    peaks = run.get("peaks") or {}
    tag = "bf16" if case.precision == "bf16" else "fp32"
    peak = max((v for k, v in peaks.items() if k.endswith(tag)), default=math.nan)
    gflops = r.flops / med / 1e9 if med == med else math.nan
    warm, rounds = r.counters_warm, r.counters_rounds
    par = aggregate_parity(r.parity) if r.parity else None
    status = r.status
    if r.status == "ok" and not r.times and run["options"]["rounds"] > 0:
        status = "error"
    return {
        "row": r.row.name,
        "case": case.name,
        "variant": r.row.variant.label,
        "variant_code": r.row.variant.code,
        "variant_overrides": dict(r.row.variant.overrides),
        "impl": case.impl,
        "backend": case.backend,
        "compiler": case.compiler,
        "precision": case.precision,
        "phase": case.phase,
        "preset": workload["preset"],
        "image_size": "x".join(map(str, workload["image_size"])),
        "batch_size": images_per_call,
        "status": status,
        "detail": r.detail,
        "median_s": med,
        "iqr_s": iqr,
        "times_s": list(r.times),
        "images_per_s": images_per_call / med if med == med else math.nan,
        "latency_per_image_s": med / images_per_call if med == med else math.nan,
        "first_result_s": r.first_result_s,
        "setup_s": r.setup_s,
        "compile_s": _delta(r.counters_start, warm, "compile_s"),
        "uncached_compile": _delta(r.counters_start, warm, "uncached_compile"),
        "uncached_compile_rounds": rounds.get("uncached_compile", math.nan),
        "fallback_ops": warm.get("fallback_ops", r.counters_end.get("fallback_ops", math.nan)),
        "unique_graphs": _delta(r.counters_start, warm, "unique_graphs"),
        "graph_breaks": _delta(r.counters_start, warm, "graph_breaks"),
        "recompiles": _delta(r.counters_start, warm, "recompiles") + rounds.get("recompiles", 0),
        "unique_graphs_rounds": rounds.get("unique_graphs", math.nan),
        "counters_end": r.counters_end,
        "reasons": r.reasons,
        "flops": r.flops,
        "gflops_s": gflops,
        "frac_peak": gflops / peak if case.backend in ("cpu", "xla") and peak == peak else math.nan,
        "peak_mem_gb": r.peak_mem_gb,
        "call_mem_gb": r.call_mem_gb,
        "parity_matched_ref": par["matched_ref"] if par else math.nan,
        "parity_matched_other": par["matched_other"] if par else math.nan,
        "mask_iou_mean": par["mask_iou_mean"] if par else math.nan,
        "mask_iou_min": par["mask_iou_min"] if par else math.nan,
        "final_loss": r.losses[-1] if r.losses else math.nan,
        "box_ap": r.accuracy.get("box_ap", math.nan),
        "mask_ap": r.accuracy.get("mask_ap", math.nan),
        "eval_images": r.accuracy.get("eval_images", 0),
        **{f"env_{k}": v for k, v in env.items()},
    }


def to_document(run: dict[str, Any], name: str, env: dict[str, Any]) -> dict[str, Any]:
    records = [record(r, run, env) for r in run["rows"]]
    meta = {k: v for k, v in run.items() if k != "rows"}
    return {"schema": SCHEMA, "name": name, "environment": env, "run": meta, "records": records}


def _json_default(x: Any) -> Any:
    if isinstance(x, (Path, torch.dtype)):
        return str(x)
    if isinstance(x, tuple):
        return list(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_nan_to_none(v) for v in x]
    return x


def save(doc: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_nan_to_none(doc), indent=1, default=_json_default) + "\n")
    return path


def load(path: str | Path) -> dict[str, Any]:
    """A run file; ValueError naming the file when it is not one."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror})") from None
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("records"), list):
        raise ValueError(f"{path}: not an mrcnn-bench run file (schema {SCHEMA} with 'records')")
    return doc


def load_records(paths: Iterable[str | Path]):
    """All records of the given run files (or folders of them) as one pandas DataFrame, one row each."""
    import pandas as pd

    frames = []
    for p in paths:
        p = Path(p)
        files = sorted(p.glob("*.json")) if p.is_dir() else [p]
        for f in files:
            try:
                doc = load(f)
            except ValueError:
                if p.is_dir():
                    continue  # other JSON in a results folder
                raise
            df = pd.DataFrame.from_records(doc["records"])
            df["run"] = doc["name"]
            df["file"] = str(f)
            frames.append(df)
    if not frames:
        raise ValueError(f"no mrcnn-bench run files in {list(map(str, paths))}")
    return pd.concat(frames, ignore_index=True)
