"""The accuracy gate: box and mask AP of a recipe against its stored baseline.

:func:`check_accuracy` evaluates a checkpoint, or trains the recipe (:mod:`mrcnn.recipes`) with a
fixed seed in one CPU process, on the recipe's evaluation split, and compares COCO ``bbox/AP`` and
``segm/AP`` with the baseline (:mod:`mrcnn_bench.gates.accuracy_baseline`). The harness's ``gate``
command calls it; ``mrcnn-bench accuracy-gate`` is its command line.

Exit status: 0 passed; 1 a metric is below its baseline (a line per gated metric naming its
value, the baseline, the tolerance and the shortfall); 2 the gate could not decide (missing or
malformed baseline, missing checkpoint, bad flags), with one line naming the problem.

Command line::

    mrcnn-bench accuracy-gate [--recipe ci] [--checkpoint PATH] [--baseline baselines/accuracy/ci.json]
                              [--seed 0] [--inject-fault box_coder|mask_shift]
    mrcnn-bench accuracy-gate --recipe ci --write-baseline --from-runs out/ci-s0 out/ci-s1 out/ci-s2
    mrcnn-bench accuracy-gate --recipe ci --write-baseline --keep-runs --from-runs out/ci-s10 out/ci-s11
    mrcnn-bench accuracy-gate --recipe ci --write-baseline --seeds 0 1 2 3 4 5 6 7 8 9    # trains the seeds first
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mrcnn.data.coco import CocoDataset
from mrcnn.engine import TrainResult, evaluate, load_checkpoint, train
from mrcnn.exits import guarded
from mrcnn.flags import SEED_MAX, THREADS_MAX, bounded
from mrcnn.model import MaskRCNN
from mrcnn.progress import add_progress_flag
from mrcnn.recipes import get_recipe
from mrcnn_bench.base import timing
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.files import atomic_write, read_json
from mrcnn_bench.gates.accuracy_baseline import (
    DEFAULT_FLOOR,
    DEFAULT_K_STD,
    DEFAULT_SEEDS,
    ISA_ENV,
    BaselineRun,
    baseline_from_runs,
    baseline_runs,
    compare_to_baseline,
    default_baseline_path,
    final_metrics,
    host_kind,
    host_record,
    load_baseline,
    measured_kinds,
    metric_passed,
    read_host,
    run_name_seed,
    write_host,
)
from mrcnn_bench.gates.faults import FAULTS, check_fault, inject_fault


@dataclasses.dataclass(frozen=True)
class AccuracyOptions:
    """What :func:`check_accuracy` checks; ``baseline`` None: :func:`default_baseline_path` of the recipe."""

    recipe: str = "ci"
    checkpoint: str | Path | None = None  # evaluate this (a file, or a folder: its latest) instead of training
    baseline: str | Path | None = None
    fault: str | None = None  # train under this fault (mrcnn_bench.gates.faults); not with a checkpoint
    seed: int = 0  # training seed
    out_dir: str | Path | None = None  # training output (default: a temporary folder)
    data_base: str | Path = "data"  # the recipe's data set is generated under this folder
    progress: bool = False
    threads: int | None = None  # torch threads while training (None: the process's)


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
    kind: str = ""  # the host kind it trained on (accuracy_baseline.host_kind); "" for a checkpoint
    kind_measured: bool = True  # whether the baseline has runs of that kind (its false-fail rate is known)

    def report(self) -> str:
        where = (f" on {self.kind}" if self.kind else "") + (f", fault {self.fault}" if self.fault else "")
        head = f"accuracy gate, recipe {self.recipe!r} ({self.source}{where}): "
        note = ("" if self.kind_measured else
                f"\n  note: the baseline has no run on {self.kind}, so the false-fail rate on it is not known "
                "(results/accuracy/README.md: how to add that kind's runs)")
        return head + ("PASS" if self.passed else "FAIL") + "".join("\n  " + m for m in self.messages) + note


def evaluate_checkpoint(checkpoint: str | Path, recipe_name: str, data_base: str | Path = "data") -> dict[str, float]:
    """COCO metrics of a static-model checkpoint (a file, or a folder: its latest) on the recipe's eval split."""
    recipe = get_recipe(recipe_name)
    path = Path(checkpoint)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    state = load_checkpoint(path)
    if state.get("impl", "static") != "static":
        raise UsageError(
            f"checkpoint {path} is of the {state['impl']!r} implementation; the gate checks the static model"
        )
    cfg = recipe.config()
    model = MaskRCNN(cfg)
    try:
        model.load_state_dict(state.get("model", state), strict=True)
    except RuntimeError as e:
        raise UsageError(f"checkpoint {path} does not fit recipe {recipe_name!r}'s model: {e}") from None
    root = recipe.prepare_data(data_base)
    val = CocoDataset.from_config(root, recipe.train.val_split, cfg)
    return evaluate(model, val, cfg, recipe.train.batch_size, torch.device("cpu"))


def train_recipe(
    recipe_name: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    data_base: str | Path = "data",
    impl: str = "static",
    progress: bool = False,
) -> TrainResult:
    """Train ``recipe_name`` with ``seed`` in one CPU process."""
    recipe = get_recipe(recipe_name)
    root = recipe.prepare_data(data_base)
    options = recipe.train_config(seed=seed, device="cpu", impl=impl)
    return train(recipe.config(), root, out_dir, options, progress=progress)


def check_accuracy(opts: AccuracyOptions) -> AccuracyResult:
    """Evaluate ``opts.checkpoint``, or train ``opts.recipe`` with ``opts.seed`` (under ``opts.fault``); gate its APs.

    Raises:
        BaselineError: the baseline is missing or malformed (checked before any work).
        FileNotFoundError: the checkpoint does not exist.
        ValueError: an unknown recipe or fault, or a fault together with a checkpoint.
    """
    get_recipe(opts.recipe)
    baseline_path = opts.baseline or default_baseline_path(opts.recipe)
    baseline = load_baseline(baseline_path, opts.recipe)
    check_fault(opts.fault)
    kind = ""
    wall = timing.Stopwatch()
    if opts.checkpoint is not None:
        if opts.fault is not None:
            raise UsageError("a fault changes training; it cannot apply to an existing checkpoint")
        metrics = evaluate_checkpoint(opts.checkpoint, opts.recipe, opts.data_base)
        source = f"checkpoint {opts.checkpoint}"
    else:
        with contextlib.ExitStack() as stack:
            out_dir = opts.out_dir
            if out_dir is None:
                out_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"accuracy-{opts.recipe}-"))
            if opts.threads:
                stack.callback(torch.set_num_threads, torch.get_num_threads())
                torch.set_num_threads(opts.threads)
            host = host_record()
            kind = host_kind(host)
            write_host(out_dir, host)
            with inject_fault(opts.fault):
                result = train_recipe(
                    opts.recipe, out_dir, seed=opts.seed, data_base=opts.data_base, progress=opts.progress
                )
        metrics = result.metrics
        source = f"trained seed {opts.seed}"
    passed, messages = compare_to_baseline(metrics, baseline)
    failures = [m for m, name in zip(messages, baseline) if not metric_passed(metrics.get(name), baseline[name])]
    return AccuracyResult(
        recipe=opts.recipe,
        metrics={k: float(v) for k, v in metrics.items()},
        baseline={k: b.mean for k, b in baseline.items()},
        tolerance={k: b.tolerance for k, b in baseline.items()},
        passed=passed,
        messages=messages,
        failures=failures,
        source=source,
        fault=opts.fault,
        wall_time=wall.elapsed(),
        kind=kind,
        kind_measured=not kind or kind in measured_kinds(baseline_path),
    )


# ------------------------------------------------------------------------------------------------
# Command line


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--recipe", default="ci", help="recipe to gate (default ci)")
    parser.add_argument("--checkpoint", default=None, help="evaluate this checkpoint instead of training")
    parser.add_argument(
        "--baseline",
        default=None,
        type=Path,
        help="default $MRCNN_BASELINES_DIR or ./baselines, /accuracy/<recipe>.json",
    )
    parser.add_argument("--seed", type=bounded(int, 0, SEED_MAX), default=0, help="training seed (default 0)")
    parser.add_argument(
        "--data", default=Path("data"), type=Path, help="where the recipe's data set is made (default: %(default)s)"
    )
    parser.add_argument("--out", default=None, type=Path, help="training output folder (default: a temporary one)")
    parser.add_argument("--threads", type=bounded(int, 1, THREADS_MAX), default=None, help="torch.set_num_threads")
    parser.add_argument(
        "--inject-fault", choices=sorted(FAULTS), default=None, help="test only: train with a deliberate bug"
    )
    parser.add_argument("--json", default=None, type=Path, help="also write the result as JSON here")
    add_progress_flag(parser)
    # The old opt-in spelling: progress is on by default now (mrcnn.progress); still accepted.
    parser.add_argument("--progress", dest="old_progress", action="store_true", help=argparse.SUPPRESS)
    group = parser.add_argument_group("writing the baseline")
    group.add_argument("--write-baseline", action="store_true", help="write --baseline from seed runs, then exit")
    group.add_argument(
        "--from-runs", nargs="*", type=Path, default=None, help="finished run folders, each named <anything>-s<seed>"
    )
    group.add_argument(
        "--keep-runs", action="store_true",
        help="keep the runs the baseline file already holds and add these (a new run of the same seed and "
             "host kind replaces the stored one)",
    )
    seeds = " ".join(map(str, DEFAULT_SEEDS))
    group.add_argument(
        "--seeds", nargs="*", type=bounded(int, 0, SEED_MAX), default=None,
        help=f"train these seeds (without --from-runs; default {seeds})"
    )
    group.add_argument("--k-std", type=bounded(float, 0), default=DEFAULT_K_STD, help=f"default {DEFAULT_K_STD:g}")
    group.add_argument("--floor", type=bounded(float, 0, 1), default=DEFAULT_FLOOR,
                       help=f"default {DEFAULT_FLOOR:g} absolute AP")
    group.add_argument("--notes", default="", help="free text stored in the baseline")
    return parser


def _run_seed(path: Path) -> int:
    """The training seed of a run folder, from its name ``<anything>-s<seed>``."""
    named = run_name_seed(path)
    if named is not None:
        return named[1]
    raise UsageError(f"run folder {path} must be named <anything>-s<seed> (e.g. out/ci-s0) for --from-runs")


def _train_command(recipe: str, seed: int, out: Path, host: dict[str, Any]) -> str:
    """The command that retrains one run as its host record says it was trained: ISA cap and threads."""
    words = ["mrcnn", "train", "--recipe", recipe, "--seed", str(seed), "--out", str(out)]
    if host.get("threads"):
        words += ["--threads", str(host["threads"])]
    isa = host.get("onednn_max_cpu_isa")
    return shlex.join(words) if not isa else f"{ISA_ENV}={shlex.quote(str(isa))} {shlex.join(words)}"


def _write_baseline(args: argparse.Namespace, baseline_path: Path) -> int:
    runs: list[BaselineRun] = []
    commands = []
    # Read (and so checked) before any training: a baseline that cannot be kept stops the command first.
    stored = baseline_runs(baseline_path, args.recipe) if args.keep_runs else []
    if args.from_runs is not None:  # none given, with --keep-runs: the stored runs under the rule as it is now
        for run_dir in args.from_runs:
            seed = _run_seed(run_dir)
            # A folder the studies trained records its host; any other was trained here, as far as we know.
            host = read_host(run_dir) or {**host_record(), "threads": None,
                                          "assumed": "the host that wrote the baseline"}
            runs.append(BaselineRun(seed, host, final_metrics(run_dir)))
            commands.append(_train_command(args.recipe, seed, run_dir, host))
    else:
        for seed in args.seeds or DEFAULT_SEEDS:
            out = (args.out or Path("out")) / f"{args.recipe}-s{seed}"
            host = host_record()
            write_host(out, host)
            train_recipe(args.recipe, out, seed=seed, data_base=args.data, progress=not args.no_progress)
            runs.append(BaselineRun(seed, host, final_metrics(out)))
            commands.append(f"mrcnn train --recipe {args.recipe} --seed {seed} --out {out}")
    if args.keep_runs:
        new = {(r.kind, r.seed) for r in runs}
        runs = sorted([r for r in stored if (r.kind, r.seed) not in new] + runs, key=lambda r: (r.kind, r.seed))
        old = read_json(baseline_path, "an accuracy baseline", dict).get("commands")
        commands = [c for c in old if isinstance(c, str)] + commands if isinstance(old, list) else commands
    if len(runs) < 2:
        raise UsageError(f"a baseline needs the metrics of at least 2 runs, got {len(runs)}")
    commands.append(shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]))  # the command that wrote this file
    doc = baseline_from_runs(args.recipe, runs, k=args.k_std, floor=args.floor, commands=commands, notes=args.notes)
    baseline_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(baseline_path, json.dumps(doc, indent=2) + "\n")
    for name, m in doc["metrics"].items():
        kinds = "; ".join(f"{kind}: {k['runs']} runs, mean {k['mean']:.4f}" for kind, k in m["per_kind"].items())
        print(f"{name}: mean {m['mean']:.4f}, std {m['std']:.4f}, tolerance {m['tolerance']:.4f} ({kinds})")
    print(f"wrote {baseline_path}")
    return 0


def run(args: argparse.Namespace) -> int:
    """The gate from parsed flags; the exit status of the module docstring."""
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.write_baseline:
            return _write_baseline(args, args.baseline or default_baseline_path(args.recipe))
        opts = AccuracyOptions(
            recipe=args.recipe,
            checkpoint=args.checkpoint,
            baseline=args.baseline,
            fault=args.inject_fault,
            seed=args.seed,
            out_dir=args.out,
            data_base=args.data,
            progress=not args.no_progress,
        )
        result = check_accuracy(opts)
    except (UsageError, FileNotFoundError) as e:  # BaselineError is one
        print(f"accuracy gate: error: {e}", file=sys.stderr)
        return 2
    print(result.report())
    print(f"  wall time {result.wall_time:.0f} s")
    if args.json:
        atomic_write(args.json, json.dumps(dataclasses.asdict(result), indent=2) + "\n")
    return 0 if result.passed else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mrcnn-bench accuracy-gate", description=__doc__.split("\n")[0])
    return guarded("mrcnn-bench", lambda: run(add_arguments(parser).parse_args(argv)), lambda: "accuracy-gate")

