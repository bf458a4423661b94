"""The accuracy gate's baseline file: where it is, how it is read and checked, how it is written.

A baseline (``baselines/accuracy/<recipe>.json`` in the repository) stores, for each gated metric,
the mean over its runs and a tolerance, plus every run (its seed, its host kind and its metrics), the
recipe's settings, the commands and the environment it was written in. A metric fails when it falls
below ``mean - tolerance``. How the committed baseline was measured: ``results/accuracy/README.md``.

A run's host kind is what changes the trained numbers on the same seed: the CPU (model, family and
model numbers: oneDNN picks its convolution kernels by instruction set and cache) and a cap on
oneDNN's instruction set (``ONEDNN_MAX_CPU_ISA``, which makes one host run the kernels of a host
without the wider ones). Two kinds give two trajectories from the first optimiser step on, so the
tolerance (:func:`tolerance_across_kinds`) is sized on seeds and kinds together: a CI run on any
measured kind must fail at most :data:`FALSE_FAIL_TARGET` of the time, and the upper 95% bound on
that rate, from the kind's runs, must be at most :data:`FALSE_FAIL_BOUND`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torchvision
from scipy import stats

from mrcnn.recipes import get_recipe
from mrcnn_bench.base import defaults, vcs
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.files import atomic_write, read_json
from mrcnn_bench.running.store import cpu_label

GATED_METRICS: tuple[str, ...] = ("bbox/AP", "segm/AP")
DEFAULT_K_STD = 3.0
# The floor guards against a lucky tight spread: a sample std from a few seeds can be half the true
# one, and the CI run differs from the baseline's runs in thread count (float summation order) as
# well. Why this value: results/accuracy/README.md.
DEFAULT_FLOOR = 0.04
# The false-fail rate the tolerance holds on every host kind with runs enough to estimate it
# (KIND_MIN_RUNS: with two, Student's t at 1% is 31.8 sds, a tolerance that no longer gates).
FALSE_FAIL_TARGET = 0.01
# ...and the upper 95% confidence bound on that rate it holds there too: a kind with few runs has an
# uncertain sd, and a 1% point estimate from 10 runs can mean 10% (results/accuracy/flake.md).
FALSE_FAIL_BOUND = 0.05
KIND_MIN_RUNS = 3
ISA_ENV = "ONEDNN_MAX_CPU_ISA"  # oneDNN's cap on its kernels' instruction set: part of a run's host kind
HOST_FILE = "host.json"  # beside a training run's metrics.jsonl: where it ran (write_host)
DEFAULT_SEEDS: tuple[int, ...] = tuple(range(10))  # training seeds a baseline is measured over (why 10: flake.md)
BASELINES_ENV = "MRCNN_BASELINES_DIR"  # the repository's baselines folder, when not ./baselines
# Its name while the baselines lived under results/: refused when set alone, naming the new one, since
# the folder it names no longer holds accuracy/<recipe>.json.
OLD_RESULTS_ENV = "MRCNN_RESULTS_DIR"
# Recipe fields that do not change what a run trains to: editing them keeps the baseline valid.
_SETTINGS_NOT_TRAINED = frozenset({"description", "target_box_ap"})


class BaselineError(UsageError):
    """The baseline file is missing or malformed; the message names the file and what is wrong."""


@dataclasses.dataclass(frozen=True)
class MetricBaseline:
    mean: float
    tolerance: float

    @property
    def threshold(self) -> float:
        return self.mean - self.tolerance


def default_baseline_path(recipe: str) -> Path:
    """``$MRCNN_BASELINES_DIR/accuracy/<recipe>.json`` if that is set, else ``./baselines/accuracy/<recipe>.json``.

    Relative to the working directory (the repository's root), never to this package's files,
    which an installed harness does not keep next to the repository.

    Raises:
        BaselineError: ``$MRCNN_RESULTS_DIR`` (the old name) is set and ``$MRCNN_BASELINES_DIR`` is not.
    """
    if os.environ.get(OLD_RESULTS_ENV) and not os.environ.get(BASELINES_ENV):
        raise BaselineError(
            f"${OLD_RESULTS_ENV} is no longer read: the accuracy baselines moved from results/accuracy/ to "
            f"{defaults.BASELINES_DIR}/accuracy/; set ${BASELINES_ENV} to the folder holding accuracy/<recipe>.json"
        )
    return Path(os.environ.get(BASELINES_ENV) or defaults.BASELINES_DIR) / "accuracy" / f"{recipe}.json"


def load_baseline(path: str | Path, recipe: str | None = None) -> dict[str, MetricBaseline]:
    """The gated metrics of a baseline file: ``{"bbox/AP": MetricBaseline(mean, tolerance), ...}``.

    Raises:
        BaselineError: the file is missing, not JSON, for another recipe or other recipe settings,
            or lacks a finite mean and a non-negative tolerance for each of :data:`GATED_METRICS`.
    """
    path = Path(path)
    if not path.is_file():
        raise BaselineError(
            f"baseline {path} not found (run from the repository root, or set --baseline or ${BASELINES_ENV}); "
            f"write it with `mrcnn-bench accuracy-gate --recipe {recipe or 'NAME'} --write-baseline`"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:  # bad JSON, bad UTF-8, nesting past the stack
        raise BaselineError(f"baseline {path} is not valid JSON: {type(e).__name__}: {str(e)[:120]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        raise BaselineError(f'baseline {path} must be a JSON object with a "metrics" object')
    if recipe is not None and data.get("recipe") not in (None, recipe):
        raise BaselineError(f"baseline {path} is for recipe {data.get('recipe')!r}, not {recipe!r}")
    if recipe is not None and "recipe_settings" in data:
        _check_recipe_settings(path, recipe, data["recipe_settings"])
    return {name: _metric(path, data["metrics"].get(name), name) for name in GATED_METRICS}


def measured_kinds(path: str | Path) -> list[str]:
    """The host kinds a (loadable) baseline file has runs of; none for a file written before kinds were."""
    kinds = read_json(path, "an accuracy baseline", dict).get("kinds")
    return [k for k in kinds if isinstance(k, str)] if isinstance(kinds, list) else []


def _metric(path: Path, entry: Any, name: str) -> MetricBaseline:
    if not isinstance(entry, dict):
        raise BaselineError(f'baseline {path} has no "metrics"["{name}"] object with "mean" and "tolerance"')
    mean, tol = entry.get("mean"), entry.get("tolerance")
    if not _is_number(mean) or not 0.0 <= float(mean) <= 1.0:
        raise BaselineError(f'baseline {path}: "metrics"["{name}"]["mean"] must be a number in [0, 1], got {mean!r}')
    if not _is_number(tol) or float(tol) < 0:
        raise BaselineError(f'baseline {path}: "metrics"["{name}"]["tolerance"] must be a number >= 0, got {tol!r}')
    return MetricBaseline(float(mean), float(tol))


def _check_recipe_settings(path: Path, recipe: str, stored: Any) -> None:
    """Refuse a baseline measured with other recipe settings than the recipe has now.

    A baseline is only meaningful for the schedule it was measured with: after a change to the
    recipe (more steps, another learning rate) the old numbers would gate the new run against the
    wrong curve, so the gate stops and asks for the baseline to be measured again.
    """
    current = json.loads(json.dumps(get_recipe(recipe).as_dict()))  # tuples become lists, as stored
    if not isinstance(stored, dict):
        raise BaselineError(f'baseline {path}: "recipe_settings" must be an object')
    keys = (current.keys() | stored.keys()) - _SETTINGS_NOT_TRAINED
    changed = sorted(k for k in keys if current.get(k) != stored.get(k))
    if changed:
        diffs = "; ".join(f"{k}: baseline {stored.get(k)!r}, recipe now {current.get(k)!r}" for k in changed)
        raise BaselineError(
            f"baseline {path} was measured with other settings of recipe {recipe!r} ({diffs}); measure it "
            f"again with `mrcnn-bench accuracy-gate --recipe {recipe} --write-baseline` (seeds {list(DEFAULT_SEEDS)})"
        )


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def metric_passed(value: float | None, base: MetricBaseline) -> bool:
    return value is not None and math.isfinite(value) and value >= base.threshold


def compare_to_baseline(metrics: dict[str, float], baseline: dict[str, MetricBaseline]) -> tuple[bool, list[str]]:
    """(passed, one message per gated metric). A metric missing from ``metrics`` fails."""
    passed, messages = True, []
    for name, base in baseline.items():
        value = metrics.get(name)
        if metric_passed(value, base):
            messages.append(
                f"{name} = {value:.4f} ok (baseline {base.mean:.4f}, tolerance {base.tolerance:.4f}, "
                f"threshold {base.threshold:.4f}, margin {value - base.threshold:.4f})"
            )
            continue
        passed = False
        if value is None or not math.isfinite(value):
            messages.append(f"{name}: not measured (got {value!r}); baseline {base.mean:.4f}")
        else:
            messages.append(
                f"{name} = {value:.4f} is below the baseline {base.mean:.4f} minus its tolerance "
                f"{base.tolerance:.4f} (threshold {base.threshold:.4f}); short by {base.threshold - value:.4f}"
            )
    return passed, messages


def tolerance_from_spread(values: Sequence[float], k: float = DEFAULT_K_STD, floor: float = DEFAULT_FLOOR) -> float:
    """``max(k * sample standard deviation, floor)``; needs at least two values."""
    if len(values) < 2:
        raise UsageError(f"the tolerance needs the metric from at least 2 runs, got {len(values)}")
    return max(k * statistics.stdev(values), floor)


def _mean_sd(values: Sequence[float], what: str) -> tuple[int, float, float]:
    n = len(values)
    if n < 2:
        raise UsageError(f"{what} needs at least 2 of a host kind's runs, got {n}")
    return n, statistics.fmean(values), statistics.stdev(values)


def _mean_lo_sd_hi(n: int, m: float, s: float) -> tuple[float, float]:
    """The kind's true mean at its lower 97.5% bound (t) and its true sd at its upper 97.5% bound (chi-square)."""
    return (m - float(stats.t.ppf(0.975, n - 1)) * s / math.sqrt(n),
            s * math.sqrt((n - 1) / float(stats.chi2.ppf(0.025, n - 1))))


def false_fail_upper_bound(values: Sequence[float], threshold: float) -> float:
    """An upper 95% bound on the rate at which one more run of the kind whose runs are ``values`` falls
    below ``threshold``: the normal rate with the kind's mean at its lower 97.5% bound and its sd at its
    upper 97.5% bound together, so that the pair is covered 95% of the time or more."""
    mean_lo, sd_hi = _mean_lo_sd_hi(*_mean_sd(values, "a false-fail bound"))
    return float(stats.norm.cdf((threshold - mean_lo) / sd_hi))


def kind_tolerance(
    mean: float, values: Sequence[float], target: float = FALSE_FAIL_TARGET, bound: float | None = FALSE_FAIL_BOUND,
) -> float:
    """The tolerance below ``mean`` at which one more run of the kind whose runs are ``values`` fails
    with probability ``target`` (point estimate) and, unless ``bound`` is None, the upper 95% bound
    on that probability (:func:`false_fail_upper_bound`) is ``bound``, whichever needs more room.

    The point estimate is Student's t predictive, ``(mean - m) + t_(1-target, n-1) * s * sqrt(1 + 1/n)``:
    the kind's mean ``m`` and sd ``s`` are themselves estimated from its ``n`` runs. The bound's room,
    ``(mean - m_lo) + z_(1-bound) * s_hi``, sets the tolerance for a kind with few runs; with many the
    point estimate does. A kind whose runs sit below the pooled ``mean`` needs that much more room.
    """
    n, m, s = _mean_sd(values, "a host kind's tolerance")
    room = (mean - m) + float(stats.t.ppf(1 - target, n - 1)) * s * math.sqrt(1 + 1 / n)
    if bound is None:
        return room
    mean_lo, sd_hi = _mean_lo_sd_hi(n, m, s)
    return max(room, (mean - mean_lo) + float(stats.norm.ppf(1 - bound)) * sd_hi)


def tolerance_across_kinds(
    by_kind: dict[str, Sequence[float]], k: float = DEFAULT_K_STD, floor: float = DEFAULT_FLOOR,
    target: float = FALSE_FAIL_TARGET, bound: float | None = FALSE_FAIL_BOUND,
) -> float:
    """The tolerance of a baseline whose runs are ``by_kind`` (host kind -> one metric's values).

    The largest of: ``floor``; ``k`` sample sds of all runs together; and, for every kind with
    :data:`KIND_MIN_RUNS` runs or more, :func:`kind_tolerance` below the mean of all runs. So a CI run
    on any kind the baseline measured that often fails at most ``target`` of the time (point
    estimate), with an upper 95% bound of at most ``bound``, whether the kinds differ in spread or in
    level; a kind with fewer runs counts in the mean and the sd only.
    """
    values = [v for vs in by_kind.values() for v in vs]
    tol = tolerance_from_spread(values, k, floor)
    mean = statistics.fmean(values)
    rooms = [kind_tolerance(mean, vs, target, bound) for vs in by_kind.values() if len(vs) >= KIND_MIN_RUNS]
    return max([tol, *rooms])


def host_record(threads: int | None = None, isa: str | None = None) -> dict[str, Any]:
    """A host kind as a baseline run records it: CPU, oneDNN's cap, threads, architecture.

    ``threads`` and ``isa`` are those of the process that trains, where it is a child started with
    its own ``--threads`` or cap; by default this process's (and the cap it passes to its children).
    """
    return {"cpu": cpu_label(), "onednn_max_cpu_isa": isa or os.environ.get(ISA_ENV) or None,
            "threads": threads or torch.get_num_threads(), "machine": platform.machine()}


def host_kind(host: dict[str, Any]) -> str:
    """The kind a host record names: ``Intel(R) Xeon(R) Processor f6m207``, plus ``, oneDNN <= AVX2`` under a cap."""
    isa = host.get("onednn_max_cpu_isa")
    return f"{host.get('cpu') or 'unknown CPU'}{f', oneDNN <= {isa}' if isa else ''}"


def write_host(run_dir: str | Path, host: dict[str, Any] | None = None) -> None:
    """Record in ``run_dir`` the host kind a training run runs on (this process's by default)."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    atomic_write(Path(run_dir) / HOST_FILE, json.dumps(host or host_record(), indent=1) + "\n")


def run_name_seed(run_dir: str | Path) -> tuple[str, int] | None:
    """``(name, seed)`` of a run folder named ``<name>-s<seed>`` (``out/ci-s0``), else None."""
    name, _, seed = Path(run_dir).name.rpartition("-s")
    return (name, int(seed)) if name and seed.isdigit() else None


def read_host(run_dir: str | Path) -> dict[str, Any] | None:
    """The host record of a run folder, or None where it has none (a run made without the studies)."""
    path = Path(run_dir) / HOST_FILE
    return read_json(path, "a training run's host record", dict) if path.is_file() else None


def final_metrics(run_dir: str | Path) -> dict[str, float]:
    """The last evaluation's COCO metrics in ``run_dir/metrics.jsonl``."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics.jsonl in {run_dir}")
    try:
        evaluated = [r for r in map(json.loads, path.read_text(encoding="utf-8").splitlines()) if "bbox/AP" in r]
    except ValueError as e:  # a damaged file, or not one mrcnn train wrote
        raise UsageError(f"{path}: a line is not JSON ({e})") from None
    if not evaluated:
        raise UsageError(f"{path} has no evaluation (no bbox/AP record)")
    last = evaluated[-1]
    return {k: v for k, v in last.items() if k.startswith(("bbox/", "segm/"))} | {"step": last["step"]}


@dataclasses.dataclass(frozen=True)
class BaselineRun:
    """One finished training run a baseline rests on: its seed, where it ran, its final COCO metrics."""

    seed: int
    host: dict[str, Any]  # host_record()'s fields
    metrics: dict[str, float]

    @property
    def kind(self) -> str:
        return host_kind(self.host)


def baseline_runs(path: str | Path, recipe: str) -> list[BaselineRun]:
    """The runs a baseline file of ``recipe`` rests on, as written there (seed, host record, metrics).

    A baseline can then grow by new seeds or kinds without the old run folders, which a fresh clone
    does not have.

    Raises:
        BaselineError: the file does not load as a baseline of ``recipe`` (:func:`load_baseline`), or a
            run entry lacks an integer seed, a host object or a number for each gated metric.
    """
    load_baseline(path, recipe)
    runs = []
    for i, entry in enumerate(read_json(path, "an accuracy baseline", dict).get("runs") or []):
        seed = entry.get("seed") if isinstance(entry, dict) else None
        host, metrics = (entry.get(k) if isinstance(entry, dict) else None for k in ("host", "metrics"))
        if (not isinstance(seed, int) or isinstance(seed, bool) or not isinstance(host, dict)
                or not isinstance(metrics, dict) or not all(_is_number(metrics.get(m)) for m in GATED_METRICS)):
            raise BaselineError(f'baseline {path}: "runs"[{i}] needs an integer "seed", a "host" object and '
                                f'"metrics" with {" and ".join(GATED_METRICS)}')
        runs.append(BaselineRun(seed, host, metrics))
    return runs


def baseline_from_runs(
    recipe: str,
    runs: Sequence[BaselineRun],
    *,
    k: float = DEFAULT_K_STD,
    floor: float = DEFAULT_FLOOR,
    commands: Sequence[str] = (),
    notes: str = "",
) -> dict[str, Any]:
    """The baseline document of ``runs`` of ``recipe``: per gated metric the mean over all runs and
    :func:`tolerance_across_kinds`, per kind its runs' mean and sd, and every run with its kind."""
    kinds = sorted({r.kind for r in runs})
    metrics = {}
    for name in GATED_METRICS:
        values = [float(r.metrics[name]) for r in runs]
        by_kind = {kind: [float(r.metrics[name]) for r in runs if r.kind == kind] for kind in kinds}
        metrics[name] = {
            "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values),
            "max": max(values),
            "tolerance": tolerance_across_kinds(by_kind, k, floor),
            "per_kind": {kind: {"runs": len(vs), "mean": statistics.fmean(vs),
                                "std": statistics.stdev(vs) if len(vs) > 1 else None} for kind, vs in by_kind.items()},
        }
    return {
        "recipe": recipe,
        "recipe_settings": get_recipe(recipe).as_dict(),
        "metrics": metrics,
        "tolerance_rule": (f"max({floor:g} absolute AP, {k:g} * sample std over all {len(runs)} runs, and per "
                           f"host kind with {KIND_MIN_RUNS} runs or more the room for a {FALSE_FAIL_TARGET:.0%} "
                           f"false fail there: (mean - kind's mean) + t_{1 - FALSE_FAIL_TARGET:g} * kind's sd "
                           f"* sqrt(1 + 1/n), and the room for that rate's upper 95% bound at {FALSE_FAIL_BOUND:.0%}: "
                           f"(mean - kind's mean at its lower 97.5% bound) + z_{1 - FALSE_FAIL_BOUND:g} * kind's sd "
                           "at its upper 97.5% bound)"),
        "kinds": kinds,
        "runs": [{"seed": r.seed, "kind": r.kind, "host": r.host, "metrics": r.metrics} for r in runs],
        "commands": list(commands),
        "environment": environment(),
        "notes": notes,
    }


def environment() -> dict[str, Any]:
    """Versions, threads, machine and the commit of the working directory's repository."""
    commit = vcs.output(Path.cwd(), "rev-parse", "HEAD")
    return {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "commit": commit,
    }
