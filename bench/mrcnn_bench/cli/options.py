"""What ``mrcnn-bench run`` and ``compare`` take from the command line: their shared arguments, and the
typed options (:class:`~mrcnn_bench.running.runner.RunOptions`, :class:`~mrcnn_bench.gates.ab.CompareOptions`,
:class:`~mrcnn_bench.gates.gate.GateOptions`) built from the parsed arguments. Loads no torch: each
command's own modules are imported when it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from mrcnn.config import PRESETS, get_config
from mrcnn.overrides import parse_override
from mrcnn.progress import add_progress_flag
from mrcnn_bench.base import defaults
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.cli.args import SEED_MAX, THREADS_MAX, bounded, parse_cpus, parse_size, parse_sizes

# The first import of the cases loads the user's case modules; its error (one line naming the module)
# reaches mrcnn_bench.cli.commands, which imports this module.
from mrcnn_bench.running.cases import (
    DEFAULT_TIME_LIMIT,
    DEFAULT_WORKLOADS,
    STREAM_ASPECTS,
    STREAM_IMAGES,
    STREAM_LONG_SIDE,
    Row,
    Workload,
    default_time_limit,
    default_workload,
    parse_cases,
    stream_workload,
)

if TYPE_CHECKING:  # the commands' modules load torch: imported by each command when it runs
    from mrcnn_bench.changes.bisection import BisectOptions
    from mrcnn_bench.gates.ab import CompareOptions
    from mrcnn_bench.gates.gate import GateOptions
    from mrcnn_bench.gates.latency_check import CheckOptions
    from mrcnn_bench.running.runner import RunOptions


def _stream_rule() -> str:
    aspects = ", ".join(f"{w}:{h}" for w, h in STREAM_ASPECTS)
    return (f"{STREAM_IMAGES} sizes by a rule of --seed: each aspect ratio of {aspects} (width:height) once, "
            f"in an order the seed shuffles, the long side drawn from {STREAM_LONG_SIDE[0]}..{STREAM_LONG_SIDE[1]} px")


def _sizes() -> str:
    return ", ".join(f"{w.preset} {w.image_size[0]}x{w.image_size[1]}" for w in DEFAULT_WORKLOADS.values())


def _limits() -> str:
    return ", ".join(f"{seconds:g} for {preset}" for preset, seconds in DEFAULT_TIME_LIMIT.items())


def add_run_arguments(p: argparse.ArgumentParser, rounds: int, cases: str, per: str = "") -> None:
    """Options shared by ``run`` and ``compare`` (live): what to run and how.

    ``rounds``: the command's default number of rounds; ``cases``: its default cases, as help text;
    ``per``: what times the rounds, when not the whole run ("each process pair times").
    """
    p.add_argument("--preset", default="tiny",
                   help=f"config preset: {', '.join(sorted(PRESETS))} (default: %(default)s)")
    p.add_argument("--cases", default=None,
                   help=f"comma list of cases, or all / quick / inference / training (default: {cases}; "
                        "`mrcnn-bench list` shows them)")
    p.add_argument("--image-size", type=parse_size, default=None, metavar="HxW",
                   help="one fixed image size: --images generated textured images of it (compare's default: the "
                        f"preset's, one that fits a canvas exactly: {_sizes()})")
    p.add_argument("--sizes", type=parse_sizes, default=None, metavar="HxW,HxW,...",
                   help="a stream: one synthetic image (varied objects) per size, resized to it, in this order "
                        f"(run's default: a stream of {_stream_rule()})")
    p.add_argument("--batch-size", type=int, default=1, help="images per inference call (default: %(default)s)")
    p.add_argument("--images", type=int, default=None,
                   help=f"distinct images: of a fixed --image-size (default: {defaults.RUN_IMAGES}), or of run's "
                        f"default stream, its first N sizes (default: {STREAM_IMAGES})")
    p.add_argument("--rounds", type=int, default=rounds,
                   help=f"interleaved timed rounds{' ' + per if per else ''} (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=defaults.RUN_WARMUP,
                   help="untimed calls per row, at least one per distinct input; the first is time to first "
                        "result (default: %(default)s)")
    p.add_argument("--threads", type=bounded(int, 1, THREADS_MAX), default=None,
                   help="torch threads (default: usable cores)")
    p.add_argument("--cpus", type=parse_cpus, default=None, metavar="LIST",
                   help="pin the run and its workers to these CPUs, e.g. 0,1 or 2-3 (default: as started)")
    p.add_argument("--seed", type=bounded(int, 0, SEED_MAX), default=0,
                   help="seed of weights and images (default: %(default)s)")
    p.add_argument("--time-limit", type=bounded(float, 0, low_open=True), default=None, metavar="S",
                   help=f"limit of a bounded row's set-up + first call and of each later call (default: {_limits()})")
    p.add_argument("--weights", default=None, help="torchvision Mask R-CNN state_dict instead of synthetic weights")
    p.add_argument("--coco-root", default=None,
                   help="COCO 2017 root (annotations/instances_val2017.json, val2017/): its images instead of "
                        "generated ones")
    p.add_argument("--coco-split", default="val2017",
                   help="split of --coco-root whose first --images images are timed (default: %(default)s)")
    p.add_argument("--eval", dest="eval_images", type=int, default=0, metavar="N",
                   help="also COCO box/mask AP of static/eager and torchvision/eager on N images of the "
                        "evaluation set (--coco-root's --coco-split, else generated synthetic val images; "
                        "default: %(default)s, none)")
    p.add_argument("--eval-root", default=None, help="COCO-layout root of the evaluation set (default: --coco-root)")
    p.add_argument("--eval-split", default=None, help="its split (default: --coco-split, or val for --eval-root)")
    p.add_argument("--set", dest="overrides", action="append", default=[], type=parse_override,
                   metavar="KEY=VALUE", help="config override for every row (repeatable)")
    p.add_argument("--reuse-compile-cache", action="store_true",
                   help="use the machine's inductor cache and temp folder (default: fresh ones, so compiles are cold)")
    p.add_argument("--peak-reps", type=bounded(int, 0), default=5,
                   help="repetitions of each kernel-rate probe (default: %(default)s; 0: skip them and the "
                        "machine's FMA ceiling, so frac_peak is not shown)")
    p.add_argument("--no-flops", action="store_true", help="skip the FLOP count")
    p.add_argument("--profile", action="store_true", help="also time each stage of static and torchvision (eager)")
    p.add_argument("--in-process", action="store_true",
                   help="run the rows that allow it in this process, sharing it (default: each row in a process "
                        "of its own, paused while the others run, so no row's figures depend on its neighbours; "
                        "bounded rows, training rows and other checkouts' rows always get their own)")
    add_progress_flag(p)


def run_options(args: argparse.Namespace, rows: list[Row] | None = None) -> RunOptions:
    """Validated :class:`~mrcnn_bench.running.runner.RunOptions`; UsageError with a message for the user."""
    from mrcnn_bench.running import runner  # lazy, as every command's own modules: they load torch (fast --help)

    if args.rounds < 0 or args.warmup < 1 or (args.images or 1) < 1 or args.batch_size < 1 or args.eval_images < 0:
        raise UsageError("--rounds and --eval must be >= 0, and --warmup, --images and --batch-size >= 1")
    if args.threads is not None and args.threads < 1:
        raise UsageError("--threads must be >= 1")
    if args.time_limit is not None and args.time_limit <= 0:
        raise UsageError("--time-limit must be > 0")
    for flag, path, kind in (("--weights", args.weights, "file"), ("--coco-root", args.coco_root, "folder"),
                             ("--eval-root", args.eval_root, "folder")):
        if path is not None and not (Path(path).is_file() if kind == "file" else Path(path).is_dir()):
            raise UsageError(f"{flag} {path}: no such {kind}")
    overrides = dict(args.overrides)
    try:  # the --set values are the user's: whatever the config makes of them is an input error
        get_config(args.preset, **overrides)  # an unknown preset or field, or a value it refuses
    except ValueError as e:
        raise UsageError(str(e)) from None
    return runner.RunOptions(
        workload=run_workload(args),
        rows=rows if rows is not None else [Row(c) for c in parse_cases(args.cases)],
        rounds=args.rounds,
        warmup=args.warmup,
        threads=args.threads,
        seed=args.seed,
        time_limit=args.time_limit or default_time_limit(args.preset),
        weights=args.weights,
        coco_root=args.coco_root,
        coco_split=args.coco_split,
        overrides=overrides,
        fresh_compile_cache=not args.reuse_compile_cache,
        cpus=args.cpus,
        progress=not args.no_progress,
        peak_reps=args.peak_reps,
        flops=not args.no_flops,
        profile=args.profile,
        isolate=not args.in_process,
        eval_images=args.eval_images,
        eval_root=args.eval_root or args.coco_root,
        eval_split=args.eval_split or ("val" if args.eval_root else args.coco_split),
    )


def run_workload(args: argparse.Namespace) -> Workload:
    """--sizes (a stream), --image-size (one fixed size), or the command's default: ``args.stream`` (run's
    default: the rule's stream; compare's: the preset's fixed size; with --coco-root, its own images)."""
    if args.sizes and args.image_size:
        raise UsageError("give --sizes (a stream) or --image-size (one fixed size), not both")
    if args.sizes and args.coco_root:
        raise UsageError("--sizes resizes generated images; --coco-root times its own images at their own sizes")
    if args.sizes and args.images is not None and args.images != len(args.sizes):
        raise UsageError(f"--images {args.images} with {len(args.sizes)} --sizes: a stream has one image per size")
    if args.sizes or (getattr(args, "stream", False) and args.image_size is None and args.coco_root is None):
        return stream_workload(args.preset, args.sizes, args.batch_size, args.seed, args.images or STREAM_IMAGES)
    return default_workload(args.preset, args.image_size, args.batch_size, args.images or defaults.RUN_IMAGES)


def compare_options(args: argparse.Namespace) -> CompareOptions:
    """:class:`~mrcnn_bench.gates.ab.CompareOptions`; run options and cases only for a live comparison."""
    # lazy: loads torch
    from mrcnn_bench.gates import ab, gate
    from mrcnn_bench.running import store

    for side, overrides in (("-a", args.set_a), ("-b", args.set_b)):
        if any(key == "inject_slowdown" for key, _ in overrides):
            new = "--inject-slowdown-a" if side == "-a" else "--inject-slowdown"
            raise UsageError(f"--set{side} inject_slowdown is no longer a Config field: use {new} FRACTION")
    slowdowns = (("--inject-slowdown", args.inject_slowdown), ("--inject-slowdown-a", args.inject_slowdown_a))
    for flag, fraction in slowdowns:
        if not 0.0 <= fraction < 1.0:
            raise UsageError(f"{flag} must be in [0, 1), got {fraction}")
    opts = ab.CompareOptions(args.a, args.b, overrides_a=tuple(args.set_a), overrides_b=tuple(args.set_b),
                             slowdown_a=args.inject_slowdown_a, slowdown_b=args.inject_slowdown,
                             pairs=args.pairs, threshold=args.threshold, alpha=args.alpha,
                             between_run_sd=args.between_run_sd, out=args.out)
    if 1 < args.pairs < defaults.MIN_PAIRS:
        raise UsageError(f"--pairs {args.pairs}: a test across pairs needs {defaults.MIN_PAIRS} or more; 1 times one "
                         "process per side")
    if not ab.are_run_files(args.a, args.b):
        for spec in (args.a, args.b):
            if not gate.is_code(spec):
                raise UsageError(f"{spec!r} is neither a run file, a checkout directory nor a git ref of {store.REPO}")
        opts.cases = parse_cases(args.cases or defaults.COMPARE_CASES)
        opts.run = run_options(args, rows=[])
    return opts


def gate_options(args: argparse.Namespace) -> GateOptions:
    """:class:`~mrcnn_bench.gates.gate.GateOptions` from the flags."""
    from mrcnn_bench.gates import gate  # lazy: loads torch

    opts = gate.GateOptions(
        preset=args.preset, baseline=args.baseline, write_baseline=args.write_baseline,
        skip_compile=args.skip_compile, accuracy=args.accuracy, checkpoint=args.checkpoint,
        accuracy_out=args.accuracy_out, accuracy_threads=args.accuracy_threads,
        latency_against=args.latency_against, latency_rounds=args.latency_rounds,
        latency_pairs=args.latency_pairs,
        inject=args.inject, out=args.out, progress=not args.no_progress)
    if not args.skip_compile and args.cases:  # parsed only when used, as the check itself would
        opts.cases = parse_cases(args.cases)
    if args.latency_against:
        opts.latency_cases = parse_cases(args.latency_cases)
    return opts


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="run file (.json), or git ref / checkout directory to run live")
    p.add_argument("b", help="run file (.json), or git ref / checkout directory to run live")
    add_run_arguments(p, rounds=defaults.COMPARE_ROUNDS, cases=f"{defaults.COMPARE_CASES} when live, "
                      "every row both run files hold", per="each process pair times")
    p.add_argument("--set-a", action="append", default=[], type=parse_override, metavar="KEY=VALUE",
                   help="config override for A only (live)")
    p.add_argument("--set-b", action="append", default=[], type=parse_override, metavar="KEY=VALUE",
                   help="config override for B only (live)")
    p.add_argument("--inject-slowdown", type=bounded(float, 0, 1, high_open=True), default=0.0, metavar="FRACTION",
                   help="B only (live): about this fraction of extra inference work, outputs unchanged "
                        "(e.g. 0.1; tests the latency gate; default: %(default)s)")
    p.add_argument("--inject-slowdown-a", type=bounded(float, 0, 1, high_open=True), default=0.0, metavar="FRACTION",
                   help="the same for A (default: %(default)s)")
    p.add_argument("--pairs", type=bounded(int, 1, 1000), default=defaults.COMPARE_PAIRS, metavar="K",
                   help="live: pairs of fresh processes, the unit of the test; 1 times one process per side and "
                        "tests its rounds, blind to each process's level (default: %(default)s)")
    p.add_argument("--threshold", type=bounded(float, 0), default=None,
                   help=f"relative slowdown that counts (default: {defaults.PAIR_THRESHOLD:g} across process pairs, "
                        f"{defaults.THRESHOLD:g} with --pairs 1 and for run files)")
    p.add_argument("--alpha", type=bounded(float, 0, 1, low_open=True, high_open=True), default=defaults.ALPHA,
                   help="family-wise error rate over the cases (Holm; default: %(default)s)")
    p.add_argument("--between-run-sd", type=bounded(float, 0), default=defaults.BETWEEN_RUN_SD, metavar="SD",
                   help="run files only: the sd of log(B/A) between separate runs of the same code beyond "
                        "their rounds' noise, allowed for by the test (measure your machine's with "
                        "bench/studies/stored_compare_false_alarms/stored_compare_aa.py; "
                        "default: %(default)s, measured here)")
    p.add_argument("--out", default=None, metavar="FILE", help="write the comparison as JSON")


def add_bisect_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("good", help="a git ref not slower (the baseline every commit is compared with)")
    p.add_argument("bad", help="a later git ref on the same line, slower")
    add_run_arguments(p, rounds=defaults.COMPARE_ROUNDS, cases=defaults.COMPARE_CASES,
                      per="each process pair times")
    p.add_argument("--pairs", type=bounded(int, defaults.MIN_PAIRS, 1000), default=defaults.COMPARE_PAIRS,
                   metavar="K", help="process pairs of each compare (default: %(default)s)")
    p.add_argument("--threshold", type=bounded(float, 0), default=defaults.PAIR_THRESHOLD,
                   help="relative slowdown against GOOD that counts (default: %(default)s)")
    p.add_argument("--alpha", type=bounded(float, 0, 1, low_open=True, high_open=True), default=defaults.ALPHA,
                   help="family-wise error rate over the cases of each compare (Holm; default: %(default)s)")
    p.add_argument("--out", default=None, metavar="FILE", help="write every compare's verdict as JSON")


def bisect_options(args: argparse.Namespace) -> BisectOptions:
    """:class:`~mrcnn_bench.changes.bisection.BisectOptions` from the flags; UsageError before anything is measured."""
    from mrcnn_bench.changes import bisection  # lazy: loads torch

    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha must be in (0, 1), got {args.alpha}")
    if args.rounds % 2:
        raise UsageError(f"--rounds must be even (each side first in half of a pair's rounds), got {args.rounds}")
    bisection.commits_between(args.good, args.bad)  # the refs and the line checked before anything is built
    return bisection.BisectOptions(args.good, args.bad, cases=parse_cases(args.cases or defaults.COMPARE_CASES),
                                run=run_options(args, rows=[]), pairs=args.pairs, threshold=args.threshold,
                                alpha=args.alpha, out=args.out)


def add_latency_check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--against", default=None, metavar="REF",
                   help="the base commit (default: where HEAD's branch leaves origin/main or main, else HEAD's "
                        "parent)")
    p.add_argument("--cases", default=None,
                   help="comma list of cases (default: the ones the diff from the base can affect: static/eager "
                        "for any file under mrcnn/; static/train, named for its losses and matching, is measured "
                        "only when named here)")
    p.add_argument("--pairs", type=bounded(int, defaults.MIN_PAIRS + 1, 1000), default=defaults.CHECK_PAIRS,
                   metavar="K", help="pairs of fresh processes, the unit of the test (default: %(default)s)")
    p.add_argument("--rounds", type=bounded(int, 2, 10_000), default=defaults.CHECK_ROUNDS,
                   help="interleaved rounds each pair times, even (default: %(default)s)")
    p.add_argument("--threshold", type=bounded(float, 0), default=defaults.PAIR_THRESHOLD,
                   help="relative slowdown that counts (default: %(default)s)")
    p.add_argument("--alpha", type=bounded(float, 0, 1, low_open=True, high_open=True), default=defaults.ALPHA,
                   help="family-wise error rate over the cases (Holm; default: %(default)s)")
    p.add_argument("--inject-slowdown", type=bounded(float, 0, 1, high_open=True), default=0.0, metavar="FRACTION",
                   help="the working tree's side only: about this fraction of extra inference work, to show "
                        "that the check catches it; needs --cases (default: %(default)s)")
    p.add_argument("--out", default=defaults.CHECK_OUT, metavar="DIR",
                   help="write DIR/summary.md and DIR/check.json (default: %(default)s)")
    add_progress_flag(p)


def latency_check_options(args: argparse.Namespace) -> CheckOptions:
    """:class:`~mrcnn_bench.gates.latency_check.CheckOptions`; UsageError before anything is measured."""
    from mrcnn_bench.gates import latency_check  # lazy: loads torch

    return latency_check.CheckOptions(
        against=args.against, cases=parse_cases(args.cases) if args.cases else None, pairs=args.pairs,
        rounds=args.rounds, threshold=args.threshold, alpha=args.alpha, slowdown=args.inject_slowdown,
        out=args.out, progress=not args.no_progress)
