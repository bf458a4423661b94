"""The accuracy gate: box and mask AP of a recipe against its stored baseline.

:func:`check_accuracy` evaluates a checkpoint, or trains the recipe (:mod:`mrcnn.recipes`) with a
fixed seed, on the recipe's synthetic val split, and compares COCO ``bbox/AP`` and ``segm/AP`` with
the baseline in ``results/accuracy/<recipe>.json``. A metric fails when it falls below
``mean - tolerance``; the baseline stores the per-seed values it was measured from and how the
tolerance was derived (:func:`baseline_from_runs`: ``max(k * sample std over seeds, floor)``).
``mrcnn accuracy-gate`` is the command line; it exits 1 with a line per failing metric naming its
value, the baseline, the tolerance and the shortfall, and 2 when the gate cannot run (no
baseline, a malformed baseline, a missing checkpoint). The benchmark harness's ``gate`` command
calls :func:`check_accuracy`; there is one accuracy gate.

Faults (:func:`inject_fault`, ``--inject-fault``) exist to show that the gate has teeth and are
for tests and that demonstration only: each patches one function of the training path in this
process, the way a real bug would change it, for the duration of a ``with`` block:

``box_coder``
    the box head's regression targets are encoded with torchvision's RPN weights (1, 1, 1, 1)
    instead of ``cfg.bbox_reg_weights`` (10, 10, 5, 5), while inference still decodes with the
    right ones: the learned box refinement comes out 5-10 times too small.
``mask_shift``
    the mask targets are shifted by :data:`MASK_SHIFT_PIXELS` pixels right and down inside each
    RoI (zero-filled), i.e. mask targets misaligned with their RoIs.

Command line::

    mrcnn accuracy-gate [--recipe ci] [--checkpoint PATH] [--baseline results/accuracy/ci.json]
                        [--seed 0] [--inject-fault box_coder|mask_shift]
    mrcnn accuracy-gate --recipe ci --write-baseline --from-runs out/ci-s0 out/ci-s1 out/ci-s2
    mrcnn accuracy-gate --recipe ci --write-baseline --seeds 0 1 2 3 4    # trains the seeds first
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

GATED_METRICS: tuple[str, ...] = ("bbox/AP", "segm/AP")
DEFAULT_K_STD = 3.0
# The floor guards against a lucky tight spread: a sample std from 5 seeds can be half the true one,
# and the CI run differs from the baseline's runs in thread count (float summation order) as well.
# Measured on the ci recipe: mask AP std 0.007 over 5 seeds, and a CI run 1.3 std below the mean.
DEFAULT_FLOOR = 0.04
DEFAULT_SEEDS: tuple[int, ...] = (0, 1, 2, 3, 4)  # training seeds a baseline is measured over
MASK_SHIFT_PIXELS = 3
BASELINE_DIR = Path(__file__).resolve().parent.parent / "results" / "accuracy"


class BaselineError(ValueError):
    """The baseline file is missing or malformed; the message names the file and what is wrong."""


@dataclasses.dataclass(frozen=True)
class MetricBaseline:
    mean: float
    tolerance: float

    @property
    def threshold(self) -> float:
        return self.mean - self.tolerance


@dataclasses.dataclass
class AccuracyResult:
    """What :func:`check_accuracy` measured and decided."""

    recipe: str
    metrics: dict[str, float]  # every COCO metric measured
    baseline: dict[str, float]  # mean of each gated metric
    tolerance: dict[str, float]
    passed: bool
    messages: list[str]  # one per gated metric, passing or not
    failures: list[str]  # the messages of the failing metrics (empty when passed)
    source: str  # "checkpoint PATH" or "trained seed N"
    fault: str | None = None
    wall_time: float = 0.0

    def report(self) -> str:
        head = f"accuracy gate, recipe {self.recipe!r} ({self.source}{', fault ' + self.fault if self.fault else ''}): "
        return head + ("PASS" if self.passed else "FAIL") + "".join("\n  " + m for m in self.messages)


# ------------------------------------------------------------------------------------------------
# Baseline


def default_baseline_path(recipe: str) -> Path:
    return BASELINE_DIR / f"{recipe}.json"


def load_baseline(path: str | Path, recipe: str | None = None) -> dict[str, MetricBaseline]:
    """The gated metrics of a baseline file: ``{"bbox/AP": MetricBaseline(mean, tolerance), ...}``.

    Raises:
        BaselineError: the file is missing, not JSON, for another recipe, or lacks a finite mean
            and a non-negative tolerance for each of :data:`GATED_METRICS`.
    """
    path = Path(path)
    if not path.is_file():
        raise BaselineError(
            f"baseline {path} not found; write it with "
            f"`mrcnn accuracy-gate --recipe {recipe or 'NAME'} --write-baseline`"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BaselineError(f"baseline {path} is not valid JSON: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        raise BaselineError(f'baseline {path} must be a JSON object with a "metrics" object')
    if recipe is not None and data.get("recipe") not in (None, recipe):
        raise BaselineError(f"baseline {path} is for recipe {data.get('recipe')!r}, not {recipe!r}")
    if recipe is not None and "recipe_settings" in data:
        _check_recipe_settings(path, recipe, data["recipe_settings"])
    out = {}
    for name in GATED_METRICS:
        entry = data["metrics"].get(name)
        if not isinstance(entry, dict):
            raise BaselineError(f'baseline {path} has no "metrics"["{name}"] object with "mean" and "tolerance"')
        mean, tol = entry.get("mean"), entry.get("tolerance")
        if not _is_number(mean) or not 0.0 <= float(mean) <= 1.0:
            raise BaselineError(
                f'baseline {path}: "metrics"["{name}"]["mean"] must be a number in [0, 1], got {mean!r}'
            )
        if not _is_number(tol) or float(tol) < 0:
            raise BaselineError(f'baseline {path}: "metrics"["{name}"]["tolerance"] must be a number >= 0, got {tol!r}')
        out[name] = MetricBaseline(float(mean), float(tol))
    return out


# Recipe fields that do not change what a run trains to: editing them keeps the baseline valid.
_SETTINGS_NOT_TRAINED = frozenset({"description", "target_box_ap"})


def _check_recipe_settings(path: Path, recipe: str, stored: Any) -> None:
    """Refuse a baseline measured with other recipe settings than the recipe has now.

    A baseline is only meaningful for the schedule it was measured with: after a change to the
    recipe (more steps, another learning rate) the old numbers would gate the new run against the
    wrong curve, so the gate stops and asks for the baseline to be measured again.
    """
    from mrcnn.recipes import get_recipe

    current = json.loads(json.dumps(get_recipe(recipe).as_dict()))  # tuples become lists, as stored
    if not isinstance(stored, dict):
        raise BaselineError(f'baseline {path}: "recipe_settings" must be an object')
    keys = (current.keys() | stored.keys()) - _SETTINGS_NOT_TRAINED
    changed = sorted(k for k in keys if current.get(k) != stored.get(k))
    if changed:
        diffs = "; ".join(f"{k}: baseline {stored.get(k)!r}, recipe now {current.get(k)!r}" for k in changed)
        raise BaselineError(
            f"baseline {path} was measured with other settings of recipe {recipe!r} ({diffs}); measure it "
            f"again with `mrcnn accuracy-gate --recipe {recipe} --write-baseline` (seeds {list(DEFAULT_SEEDS)})"
        )


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _metric_passed(value: float | None, base: MetricBaseline) -> bool:
    return value is not None and math.isfinite(value) and value >= base.threshold


def compare_to_baseline(metrics: dict[str, float], baseline: dict[str, MetricBaseline]) -> tuple[bool, list[str]]:
    """(passed, one message per gated metric). A metric missing from ``metrics`` fails."""
    passed, messages = True, []
    for name, base in baseline.items():
        value = metrics.get(name)
        if _metric_passed(value, base):
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
        raise ValueError(f"the tolerance needs the metric from at least 2 seeds, got {len(values)}")
    return max(k * statistics.stdev(values), floor)


def final_metrics(run_dir: str | Path) -> dict[str, float]:
    """The last evaluation's COCO metrics in ``run_dir/metrics.jsonl``."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics.jsonl in {run_dir}")
    evaluated = [r for r in map(json.loads, path.read_text(encoding="utf-8").splitlines()) if "bbox/AP" in r]
    if not evaluated:
        raise ValueError(f"{path} has no evaluation (no bbox/AP record)")
    last = evaluated[-1]
    return {k: v for k, v in last.items() if k.startswith(("bbox/", "segm/"))} | {"step": last["step"]}


def baseline_from_runs(
    recipe: str,
    runs: dict[int, dict[str, float]],
    *,
    k: float = DEFAULT_K_STD,
    floor: float = DEFAULT_FLOOR,
    commands: Sequence[str] = (),
    notes: str = "",
) -> dict[str, Any]:
    """The baseline document of ``runs`` (seed -> final metrics) of ``recipe``."""
    from mrcnn.recipes import get_recipe

    seeds = sorted(runs)
    metrics = {}
    for name in GATED_METRICS:
        values = [float(runs[s][name]) for s in seeds]
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        metrics[name] = {
            "mean": statistics.fmean(values),
            "std": std,
            "min": min(values),
            "max": max(values),
            "tolerance": tolerance_from_spread(values, k, floor),
            "per_seed": dict(zip((str(s) for s in seeds), values)),
        }
    return {
        "recipe": recipe,
        "recipe_settings": get_recipe(recipe).as_dict(),
        "metrics": metrics,
        "tolerance_rule": f"max({k:g} * sample std over {len(seeds)} seeds, {floor:g} absolute AP)",
        "seeds": seeds,
        "all_metrics_per_seed": {str(s): runs[s] for s in seeds},
        "commands": list(commands),
        "environment": environment(),
        "notes": notes,
    }


def environment() -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=Path(__file__).parent
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    import torchvision

    return {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "commit": commit,
    }


# ------------------------------------------------------------------------------------------------
# Faults (tests and the teeth demonstration only)


def _box_coder_fault(module: Any) -> Callable[..., torch.Tensor]:
    original = module.encode_boxes

    def encode_with_rpn_weights(targets: torch.Tensor, reference: torch.Tensor, weights: Any) -> torch.Tensor:
        return original(targets, reference, (1.0, 1.0, 1.0, 1.0))

    return encode_with_rpn_weights


def _mask_shift_fault(module: Any) -> Callable[..., torch.Tensor]:
    original = module.mask_targets

    def shifted_mask_targets(*args: Any, **kwargs: Any) -> torch.Tensor:
        target = original(*args, **kwargs)
        s = MASK_SHIFT_PIXELS
        shifted = torch.zeros_like(target)
        shifted[..., s:, s:] = target[..., :-s, :-s]
        return shifted

    return shifted_mask_targets


# fault name -> (attribute of mrcnn.roi_heads it replaces, factory of the replacement)
FAULTS: dict[str, tuple[str, Callable[[Any], Callable[..., torch.Tensor]]]] = {
    "box_coder": ("encode_boxes", _box_coder_fault),
    "mask_shift": ("mask_targets", _mask_shift_fault),
}


@contextlib.contextmanager
def inject_fault(name: str | None) -> Iterator[None]:
    """Test-only: patch the training path with fault ``name`` (module docstring) inside the block.

    Only the box head's training targets change (``mrcnn.roi_heads``'s references to
    ``encode_boxes`` or ``mask_targets``); inference and the RPN are untouched. ``None`` is no fault.
    """
    if name is None:
        yield
        return
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; choose one of {sorted(FAULTS)}")
    import mrcnn.roi_heads as module

    attr, factory = FAULTS[name]
    original = getattr(module, attr)
    setattr(module, attr, factory(module))
    try:
        yield
    finally:
        setattr(module, attr, original)


# ------------------------------------------------------------------------------------------------
# The check


def evaluate_checkpoint(checkpoint: str | Path, recipe_name: str, data_base: str | Path = "data") -> dict[str, float]:
    """COCO metrics of a static-model checkpoint (a file, or a folder: its latest) on the recipe's val split."""
    from mrcnn.data.coco import CocoDataset
    from mrcnn.model import MaskRCNN
    from mrcnn.recipes import get_recipe
    from mrcnn.train import evaluate, load_checkpoint

    recipe = get_recipe(recipe_name)
    path = Path(checkpoint)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    state = load_checkpoint(path)
    if state.get("impl", "static") != "static":
        raise ValueError(
            f"checkpoint {path} is of the {state['impl']!r} implementation; the gate checks the static model"
        )
    cfg = recipe.config()
    model = MaskRCNN(cfg)
    try:
        model.load_state_dict(state.get("model", state), strict=True)
    except RuntimeError as e:
        raise ValueError(f"checkpoint {path} does not fit recipe {recipe_name!r}'s model: {e}") from None
    root = recipe.prepare_data(data_base)
    val = CocoDataset.from_config(root, recipe.eval_split, cfg)
    return evaluate(model, val, cfg, recipe.batch_size, torch.device("cpu"))


def train_recipe(
    recipe_name: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    data_base: str | Path = "data",
    impl: str = "static",
    progress: bool = False,
    **overrides: Any,
) -> dict[str, Any]:
    """Train ``recipe_name`` with ``seed`` in one process; :func:`mrcnn.train.train`'s result."""
    from mrcnn.recipes import get_recipe
    from mrcnn.train import train

    recipe = get_recipe(recipe_name)
    root = recipe.prepare_data(data_base)
    kwargs = {**recipe.train_kwargs(), **overrides}
    return train(recipe.config(), root, out_dir, seed=seed, device="cpu", impl=impl, progress=progress, **kwargs)


def check_accuracy(
    recipe: str = "ci",
    checkpoint: str | Path | None = None,
    baseline_path: str | Path | None = None,
    fault: str | None = None,
    *,
    seed: int = 0,
    out_dir: str | Path | None = None,
    data_base: str | Path = "data",
    progress: bool = False,
) -> AccuracyResult:
    """Evaluate ``checkpoint``, or train ``recipe`` with ``seed`` (under ``fault``), and gate its APs.

    Raises:
        BaselineError: the baseline is missing or malformed (checked before any work).
        FileNotFoundError: ``checkpoint`` does not exist.
        ValueError: an unknown recipe or fault, or a fault together with a checkpoint.
    """
    from mrcnn.recipes import get_recipe

    get_recipe(recipe)
    baseline_path = Path(baseline_path) if baseline_path is not None else default_baseline_path(recipe)
    baseline = load_baseline(baseline_path, recipe)
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; choose one of {sorted(FAULTS)}")
    start = time.perf_counter()
    if checkpoint is not None:
        if fault is not None:
            raise ValueError("a fault changes training; it cannot apply to an existing checkpoint")
        metrics = evaluate_checkpoint(checkpoint, recipe, data_base)
        source = f"checkpoint {checkpoint}"
    else:
        with contextlib.ExitStack() as stack:
            if out_dir is None:
                out_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"accuracy-{recipe}-"))
            with inject_fault(fault):
                result = train_recipe(recipe, out_dir, seed=seed, data_base=data_base, progress=progress)
        metrics = result["metrics"]
        source = f"trained seed {seed}"
    passed, messages = compare_to_baseline(metrics, baseline)
    failures = [m for m, name in zip(messages, baseline) if not _metric_passed(metrics.get(name), baseline[name])]
    return AccuracyResult(
        recipe=recipe,
        metrics={k: float(v) for k, v in metrics.items()},
        baseline={k: b.mean for k, b in baseline.items()},
        tolerance={k: b.tolerance for k, b in baseline.items()},
        passed=passed,
        messages=messages,
        failures=failures,
        source=source,
        fault=fault,
        wall_time=time.perf_counter() - start,
    )


# ------------------------------------------------------------------------------------------------
# Command line


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--recipe", default="ci", help="recipe to gate (default ci)")
    parser.add_argument("--checkpoint", default=None, help="evaluate this checkpoint instead of training")
    parser.add_argument("--baseline", default=None, type=Path, help="default results/accuracy/<recipe>.json")
    parser.add_argument("--seed", type=int, default=0, help="training seed (default 0)")
    parser.add_argument("--data", default=Path("data"), type=Path, help="folder the recipe's data set is made under")
    parser.add_argument("--out", default=None, type=Path, help="training output folder (default: a temporary one)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument(
        "--inject-fault", choices=sorted(FAULTS), default=None, help="test only: train with a deliberate bug"
    )
    parser.add_argument("--json", default=None, type=Path, help="also write the result as JSON here")
    parser.add_argument("--progress", action="store_true", help="progress bar while training")
    group = parser.add_argument_group("writing the baseline")
    group.add_argument("--write-baseline", action="store_true", help="write --baseline from seed runs, then exit")
    group.add_argument(
        "--from-runs", nargs="*", type=Path, default=None, help="finished run folders, each named <anything>-s<seed>"
    )
    seeds = " ".join(map(str, DEFAULT_SEEDS))
    group.add_argument(
        "--seeds", nargs="*", type=int, default=None, help=f"train these seeds (without --from-runs; default {seeds})"
    )
    group.add_argument("--k-std", type=float, default=DEFAULT_K_STD, help=f"default {DEFAULT_K_STD:g}")
    group.add_argument("--floor", type=float, default=DEFAULT_FLOOR, help=f"default {DEFAULT_FLOOR:g} absolute AP")
    group.add_argument("--notes", default="", help="free text stored in the baseline")
    return parser


def _run_seed(path: Path) -> int:
    """The training seed of a run folder, from its name ``<anything>-s<seed>``."""
    tail = path.name.rsplit("-s", 1)
    if len(tail) == 2 and tail[1].isdigit():
        return int(tail[1])
    raise ValueError(f"run folder {path} must be named <anything>-s<seed> (e.g. out/ci-s0) for --from-runs")


def _write_baseline(args: argparse.Namespace, baseline_path: Path) -> int:
    runs: dict[int, dict[str, float]] = {}
    commands = []
    if args.from_runs:
        for run_dir in args.from_runs:
            seed = _run_seed(run_dir)
            runs[seed] = final_metrics(run_dir)
            commands.append(f"mrcnn train --recipe {args.recipe} --seed {seed} --out {run_dir} --threads N")
    else:
        seeds = args.seeds if args.seeds else list(DEFAULT_SEEDS)
        for seed in seeds:
            out = (args.out or Path("out")) / f"{args.recipe}-s{seed}"
            train_recipe(args.recipe, out, seed=seed, data_base=args.data, progress=args.progress)
            runs[seed] = final_metrics(out)
            commands.append(f"mrcnn train --recipe {args.recipe} --seed {seed} --out {out}")
    commands.append(shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]))  # the command that wrote this file
    doc = baseline_from_runs(args.recipe, runs, k=args.k_std, floor=args.floor, commands=commands, notes=args.notes)
    baseline_path.parent.mkdir(parents=True, exist_ok=True)
    baseline_path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    for name, m in doc["metrics"].items():
        print(
            f"{name}: mean {m['mean']:.4f}, std {m['std']:.4f}, tolerance {m['tolerance']:.4f}, "
            f"per seed {m['per_seed']}"
        )
    print(f"wrote {baseline_path}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    baseline_path = args.baseline or default_baseline_path(args.recipe)
    try:
        if args.write_baseline:
            return _write_baseline(args, baseline_path)
        result = check_accuracy(
            args.recipe,
            args.checkpoint,
            baseline_path,
            args.inject_fault,
            seed=args.seed,
            out_dir=args.out,
            data_base=args.data,
            progress=args.progress,
        )
    except (BaselineError, FileNotFoundError, ValueError) as e:
        print(f"accuracy gate: error: {e}", file=sys.stderr)
        return 2
    print(result.report())
    print(f"  wall time {result.wall_time:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(dataclasses.asdict(result), indent=2) + "\n", encoding="utf-8")
    return 0 if result.passed else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mrcnn accuracy-gate", description=__doc__.split("\n")[0])
    return run(add_arguments(parser).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
