"""Run files on disk: the environment each record carries, JSON out (NaN as null), JSON in.

The file format is :class:`mrcnn_bench.running.records.RunDocument`'s; this module adds where it came from
(:func:`environment`: commit, versions, devices, host) and the reading and writing.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import socket
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

from mrcnn_bench.base import vcs
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.base.text import finite_or_none
from mrcnn_bench.running.records import SCHEMA, RunDocument

# The repository this harness lives in: bench/mrcnn_bench/running/store.py -> the root (git commands, results/).
REPO = Path(__file__).resolve().parents[3]


def environment(threads: int, seed: int) -> dict[str, Any]:
    """Versions, CPU/GPU, threads, seed, commit, host and date: what a result needs to be compared later."""
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
    env.update(cpu_environment())
    env["commit"] = vcs.output(REPO, "rev-parse", "HEAD")
    status = vcs.output(REPO, "status", "--porcelain", "--untracked-files=no")
    env["dirty"] = None if status is None else bool(status)
    return env


def cpu_environment() -> dict[str, Any]:
    """The CPUs this process may use and the frequency governor where the kernel shows it."""
    env: dict[str, Any] = {"cpus": sorted(os.sched_getaffinity(0))}
    with contextlib.suppress(OSError):
        env["governor"] = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").read_text().strip()
    return env


def cpuinfo_fields(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The first processor's fields in ``cpuinfo`` (``model name``, ``cpu family``, ...); {} without it."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text().splitlines():
            if not line.strip():
                break  # the first processor's block ends at the first blank line
            name, sep, value = line.partition(":")
            if sep:
                fields.setdefault(name.strip(), value.strip())
    return fields


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's model name as the kernel reports it (``platform.processor()`` where there is no /proc)."""
    return cpuinfo_fields(cpuinfo).get("model name") or platform.processor() or None


def cpu_label(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The model name, and ``f<family>m<model>`` where ``cpuinfo`` has them: ``AMD EPYC f25m17``.

    A virtual machine may report a bare ``AMD EPYC`` for CPU generations whose speeds and kernels
    differ: the family and model numbers tell them apart (the host kind of asv's machine name and of
    the accuracy baseline's runs).
    """
    fields = cpuinfo_fields(cpuinfo)
    family, model = fields.get("cpu family"), fields.get("model")
    generation = f"f{family}m{model}" if family and model else ""
    return f"{fields.get('model name') or cpu_model(cpuinfo) or 'cpu'} {generation}".strip()


def _json_default(x: Any) -> Any:
    if isinstance(x, (Path, torch.dtype)):
        return str(x)
    if isinstance(x, tuple):
        return list(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def dumps(doc: RunDocument) -> str:
    """The text of a run file."""
    return json.dumps(finite_or_none(doc.to_dict()), indent=1, default=_json_default) + "\n"


def save(doc: RunDocument, path: Path) -> Path:
    """Write the run file whole or not at all: a crash mid-write leaves the previous file in place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, dumps(doc))
    return path


def load(path: str | Path) -> RunDocument:
    """A run file; ValueError naming the file when it is not one."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except OSError as e:
        raise UsageError(f"{path}: cannot read ({e.strerror})") from None
    except ValueError as e:
        raise UsageError(f"{path}: not JSON ({e})") from None
    except RecursionError:
        raise UsageError(f"{path}: not a run file (JSON nested too deeply to read)") from None
    try:
        return RunDocument.from_dict(raw)
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{path}: {e}") from None


def _claims_schema(path: Path) -> bool:
    """Whether ``path`` says it is a run file of today's schema (readable JSON with its ``schema``)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(raw, dict) and raw.get("schema") == SCHEMA


def load_runs(paths: Iterable[str | Path]) -> list[tuple[Path, RunDocument]]:
    """The run files given, or in the folders given (other JSON there is skipped, but a damaged run file of
    today's schema is an error), with their paths."""
    paths = list(paths)
    runs = []
    for p in map(Path, paths):
        files = sorted(p.glob("*.json")) if p.is_dir() else [p]
        for f in files:
            try:
                runs.append((f, load(f)))
            except ValueError:
                if p.is_dir() and not _claims_schema(f):
                    continue  # other JSON in a results folder
                raise  # a run file that is damaged: never skipped without a word
    if not runs:
        raise UsageError(f"no mrcnn-bench run files in {list(map(str, paths))}")
    return runs
