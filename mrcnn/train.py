"""Train the static model (or torchvision's) from the command line: SGD + warm-up, AMP, DDP, exact resume.

Flags become a model config and a :class:`mrcnn.engine.TrainConfig` for :func:`mrcnn.engine.train`.

Settings come from three layers: :class:`mrcnn.engine.TrainConfig`'s defaults (and the ``tiny``
preset), then the recipe's (``--recipe``, :mod:`mrcnn.recipes`: preset, config overrides,
synthetic data generated under ``--data``, default ``data/``, schedule and evaluation cadence),
then every flag given explicitly. The recipe's batch size is the global one: with N ranks each
takes batch_size / N images; ``--batch-size`` is per rank.

Exit status: 0 done; 1 a non-finite loss stopped the run; 2 bad flags or bad input (unknown
recipe, missing data or checkpoint, malformed annotations), with one line naming the problem.

Command line::

    python -m mrcnn.train --preset tiny --data DIR --out DIR --steps 200 [--synth-count 200] ...
    python -m mrcnn.train --recipe tiny --out out/tiny [--impl torchvision] [--seed 1]
    torchrun --nproc_per_node 2 -m mrcnn.train ...
    mrcnn train ...            (the same flags)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from mrcnn.config import Config, get_config
from mrcnn.data.coco import CocoFormatError, ImageDecodeError
from mrcnn.engine import AMP_MODES, IMPLS, INITS, OPTIMIZERS, NonFiniteLossError, TrainConfig, TrainSetupError, train
from mrcnn.engine.config import field_default
from mrcnn.engine.distributed import env_rank, env_world_size
from mrcnn.exits import UsageError, guarded
from mrcnn.flags import SEED_MAX, THREADS_MAX, bounded
from mrcnn.overrides import parse_override
from mrcnn.progress import add_progress_flag
from mrcnn.recipes import RECIPES, Recipe, get_recipe

DEFAULT_PRESET = "tiny"
# Flags that set the TrainConfig field of the same name (dest) when given.
_OPTION_FLAGS = tuple(f.name for f in dataclasses.fields(TrainConfig))
# Failures of the input rather than of the code: one line and exit 2, no traceback.
_BAD_INPUT = (TrainSetupError, FileNotFoundError, CocoFormatError, ImageDecodeError)


@dataclass(frozen=True)
class TrainJob:
    """Parsed flags: what :func:`mrcnn.engine.train` is called with, and the recipe whose data it needs."""

    cfg: Config
    data_root: Path
    out_dir: Path
    options: TrainConfig
    recipe: Recipe | None = None
    data_base: Path = Path("data")  # the recipe's data set is generated under this folder
    resume: str | None = None
    weights: str | None = None
    synth_count: int | None = None
    progress: bool = True


def _default(name: str) -> str:
    return f"default {field_default(name)!r}"


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Training options (shared with the ``mrcnn train`` subcommand); None: not given."""
    parser.set_defaults(train_parser=parser)  # run() reports usage errors through it
    add = parser.add_argument
    add("--recipe", help=f"named recipe ({', '.join(sorted(RECIPES))}): preset, overrides, data, schedule")
    add("--impl", choices=IMPLS, help=f"static model or torchvision's MaskRCNN ({_default('impl')})")
    add("--preset", help=f"config preset (default {DEFAULT_PRESET!r})")
    add("--set", dest="overrides", action="append", default=[], type=parse_override, metavar="KEY=VALUE",
        help="config override, Python literal values, e.g. --set min_size=256 (repeatable)")  # fmt: skip
    add("--data", type=Path, help="COCO-layout data root (with --recipe: where its synthetic set goes, default data)")
    add("--synth-count", type=bounded(int, 1, 10_000_000),
        help="generate the synthetic set (this many train images, a quarter val) if missing")
    add("--train-split", help=_default("train_split"))
    add("--val-split", help="evaluated if present (default: the recipe's, else 'val'); '' for none")
    add("--out", required=True, type=Path, help="checkpoints and metrics.jsonl go here")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--steps", type=bounded(int, 1), help="optimiser steps (required without --recipe)")
    length.add_argument("--epochs", type=bounded(int, 1), help="epochs (turned into steps)")
    add("--batch-size", type=bounded(int, 1, 4096),
        help=f"images per rank and step ({_default('batch_size')}; a recipe's is global)")
    add("--lr", type=bounded(float, 0, low_open=True), help=_default("lr"))
    add("--momentum", type=bounded(float, 0, 1), help=_default("momentum"))
    add("--weight-decay", type=bounded(float, 0), help=_default("weight_decay"))
    add("--optimizer", choices=OPTIMIZERS, help=_default("optimizer"))
    add("--init", choices=INITS, help=f"init scheme ({_default('init')})")
    add("--clip-grad-norm", type=bounded(float, 0),
        help=f"clip the gradient norm ({_default('clip_grad_norm')}; 0 is off)")
    add("--warmup-iters", type=bounded(int, 0), help=_default("warmup_iters"))
    add("--warmup-factor", type=bounded(float, 0, 1, low_open=True), help=_default("warmup_factor"))
    add("--lr-steps", type=bounded(int, 1), nargs="*", help="milestones, in steps")
    add("--gamma", type=bounded(float, 0, 1, low_open=True), help=_default("gamma"))
    add("--amp", choices=AMP_MODES, help=_default("amp"))
    add("--device", help="cpu or cuda (default: cuda when present)")
    add("--seed", type=bounded(int, 0, SEED_MAX), help=_default("seed"))
    add("--workers", dest="num_workers", type=bounded(int, 0, 256),
        help=f"DataLoader workers per rank ({_default('num_workers')})")
    add("--threads", type=bounded(int, 1, THREADS_MAX), default=None, help="torch.set_num_threads")
    add("--checkpoint-every", type=bounded(int, 0), help=f"{_default('checkpoint_every')}: only at the end")
    add("--eval-every", type=bounded(int, 0), help=f"{_default('eval_every')}: only at the end")
    add("--no-final-eval", dest="eval_at_end", action="store_false", default=None)
    add("--resume", help="checkpoint file, or a folder (its latest checkpoint)")
    add("--weights", help="torchvision-format state_dict to start from")
    add_progress_flag(parser, "--quiet")
    return parser


def resolve_arguments(args: argparse.Namespace) -> TrainJob:
    """Parsed flags -> :class:`TrainJob`: defaults < recipe < explicit flags. Generates no data.

    Raises:
        UsageError: no run length, or no data, without a recipe; an unknown preset or config field.
        TrainSetupError: an unknown recipe, or settings TrainConfig refuses.
    """
    recipe = get_recipe(args.recipe) if args.recipe else None
    if recipe is None and args.steps is None and args.epochs is None:
        raise UsageError("give --steps or --epochs (or a --recipe)")
    if recipe is None and args.data is None:
        raise UsageError("--data is required without --recipe")
    settings = dataclasses.asdict(recipe.train_config(env_world_size())) if recipe else {}
    if args.epochs is not None:
        settings["steps"] = None  # --epochs replaces the recipe's length
    settings.update({name: getattr(args, name) for name in _OPTION_FLAGS if getattr(args, name, None) is not None})
    if settings.get("val_split") == "":
        settings["val_split"] = None
    overrides = {**dict(recipe.overrides if recipe else ()), **dict(args.overrides)}
    try:
        cfg = get_config(args.preset or (recipe.preset if recipe else DEFAULT_PRESET), **overrides)
    except ValueError as e:
        raise UsageError(str(e)) from None
    data_base = args.data if args.data is not None else Path("data")
    return TrainJob(
        cfg=cfg,
        data_root=recipe.data_root(data_base) if recipe else args.data,
        out_dir=args.out,
        options=TrainConfig(**settings),
        recipe=recipe,
        data_base=data_base,
        resume=args.resume,
        weights=args.weights,
        synth_count=args.synth_count,
        progress=not args.no_progress,
    )


def run(args: argparse.Namespace) -> int:
    """Train as the flags say; prints a JSON summary (rank 0). Exit status: module docstring."""
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        job = resolve_arguments(args)
    except TrainSetupError as e:  # first: a UsageError too, but of the settings, not of the flags
        print(f"error: {e}", file=sys.stderr)
        return 2
    except UsageError as e:
        parser = getattr(args, "train_parser", None)
        if parser is not None:
            parser.error(str(e))  # exits 2 after the usage line
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        if job.recipe is not None and env_rank() == 0:
            job.recipe.prepare_data(job.data_base)  # other ranks wait for it at train()'s first barrier
        result = train(job.cfg, job.data_root, job.out_dir, job.options, resume=job.resume, weights=job.weights,
                       synth_count=job.synth_count, progress=job.progress)  # fmt: skip
    except NonFiniteLossError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except _BAD_INPUT as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if env_rank() == 0:
        summary = {"step": result.step, **result.losses, **result.metrics}
        print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in summary.items()}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mrcnn.train", description=__doc__.split("\n")[0])
    return guarded("mrcnn", lambda: run(add_arguments(parser).parse_args(argv)), lambda: "train")


if __name__ == "__main__":
    sys.exit(main())
