"""``mrcnn-bench``: run the matrix, compare two runs or two commits, gate a change, rebuild reports.

    mrcnn-bench run [--preset tiny] [--cases all] [--out results/runs]   the main job
    mrcnn-bench compare A B [--cases static/eager]                       A, B: run files, or git refs / checkouts
    mrcnn-bench gate [--baseline baselines/gate_tiny.json]               exit 1 on a regression
    mrcnn-bench accuracy-gate [--recipe ci] ...                          the accuracy gate alone
    mrcnn-bench export-time ...                                          export and AOTInductor build times
    mrcnn-bench steps [--machine NAME | --series FILE.csv] [--json]      change points of the history
    mrcnn-bench report FILE_OR_DIR... [--out out/report]                 tables, plots, dashboard
    mrcnn-bench check-benchmarks out/ci/benchmarks.json [--expect CASES] CI: did the quick cases run?
    mrcnn-bench gpu-check [--out out/gpu-check]                          everything that needs a CUDA GPU
    mrcnn-bench list [--json]                                            cases, presets, backends on this machine
    mrcnn-bench export-db RUN.json... --out FILE                         PyTorch benchmark database (v3) records

This is the only module that reads a command line: it turns arguments into each command's typed
options (:class:`~mrcnn_bench.runner.RunOptions`, :class:`~mrcnn_bench.ab.CompareOptions`,
:class:`~mrcnn_bench.gate.GateOptions`) and calls the command; commands call each other through
those options, never through argv. Defaults shown in ``--help`` are the ones the commands use
(:mod:`mrcnn_bench.defaults`, :mod:`mrcnn_bench.cases`). The parser loads no torch, so ``--help``
and ``--version`` are fast; each command imports what it runs when it runs.

Exit codes, the same for every command (:mod:`mrcnn.exits`): 0 passed; 1 a regression was found or
a gate failed (compare flagged a slowdown, a gate check failed, check-benchmarks found an expected
case that did not run, run had a row that errored); 2 could not decide (a usage or input error, inputs
that cannot be compared, a case that could not run), with one line naming the problem, before any
measuring where it can be known then; 3 internal error (one line, the traceback in a log file named
there, printed too with ``MRCNN_BENCH_DEBUG=1``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from mrcnn.config import PRESETS, get_config
from mrcnn.exits import FAILED, PASSED, debug_variable, guarded, version_text
from mrcnn.overrides import parse_override
from mrcnn.progress import add_progress_flag
from mrcnn_bench import defaults
from mrcnn_bench.cli_args import add_gate_arguments, parse_cpus, parse_size, parse_sizes

USER_CASES_ERROR: ValueError | None = None  # a user's case module that failed to load: main() reports it, exit 2
try:  # the first import of mrcnn_bench.cases loads the user's case modules ($MRCNN_BENCH_CASES, entry points)
    from mrcnn_bench.cases import (
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
except ValueError as e:  # mrcnn_bench.cases.UserCasesError: one line naming the module and its error
    USER_CASES_ERROR = e

if TYPE_CHECKING:  # the commands' modules load torch: imported by each command when it runs
    from mrcnn_bench.ab import CompareOptions
    from mrcnn_bench.gate import GateOptions
    from mrcnn_bench.runner import RunOptions

PROG = "mrcnn-bench"
DEBUG_ENV = debug_variable(PROG)  # =1: also print an internal error's traceback

# Subcommands whose modules load only when used: they pull in the training and export stacks
# (start-up time), and a missing module then fails that subcommand alone.
LAZY_COMMANDS = {
    "accuracy-gate": ("mrcnn_bench.accuracy_gate", "train or evaluate a recipe and gate its box and mask AP"),
    "export-time": ("mrcnn_bench.export_timing", "time torch.export and AOTInductor builds of the model"),
    "gpu-check": ("mrcnn_bench.gpu_check", "the CUDA tests, rows, fp16 training and AOTInductor on a GPU, in one go"),
    "steps": ("mrcnn_bench.steps", "change points of the history across commits (asv results or a CSV of series)"),
}


def _stream_rule() -> str:
    aspects = ", ".join(f"{w}:{h}" for w, h in STREAM_ASPECTS)
    return (f"{STREAM_IMAGES} sizes by a rule of --seed: each aspect ratio of {aspects} (width:height) once, "
            f"in an order the seed shuffles, the long side drawn from {STREAM_LONG_SIDE[0]}..{STREAM_LONG_SIDE[1]} px")


def _sizes() -> str:
    return ", ".join(f"{w.preset} {w.image_size[0]}x{w.image_size[1]}" for w in DEFAULT_WORKLOADS.values())


def _limits() -> str:
    return ", ".join(f"{seconds:g} for {preset}" for preset, seconds in DEFAULT_TIME_LIMIT.items())


def add_run_arguments(p: argparse.ArgumentParser, rounds: int, cases: str) -> None:
    """Options shared by ``run`` and ``compare`` (live): what to run and how.

    ``rounds``: the command's default number of rounds; ``cases``: its default cases, as help text.
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
    p.add_argument("--rounds", type=int, default=rounds, help="interleaved timed rounds (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=defaults.RUN_WARMUP,
                   help="untimed calls per row, at least one per distinct input; the first is time to first "
                        "result (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: usable cores)")
    p.add_argument("--cpus", type=parse_cpus, default=None, metavar="LIST",
                   help="pin the run and its workers to these CPUs, e.g. 0,1 or 2-3 (default: as started)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and images (default: %(default)s)")
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
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
    p.add_argument("--peak-reps", type=int, default=5,
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
    """Validated :class:`~mrcnn_bench.runner.RunOptions`; ValueError with a message for the user."""
    from mrcnn_bench import runner  # lazy, as every command's own modules: they load torch (fast --help)

    if args.rounds < 0 or args.warmup < 1 or (args.images or 1) < 1 or args.batch_size < 1 or args.eval_images < 0:
        raise ValueError("--rounds and --eval must be >= 0, and --warmup, --images and --batch-size >= 1")
    if args.threads is not None and args.threads < 1:
        raise ValueError("--threads must be >= 1")
    if args.time_limit is not None and args.time_limit <= 0:
        raise ValueError("--time-limit must be > 0")
    for flag, path, kind in (("--weights", args.weights, "file"), ("--coco-root", args.coco_root, "folder"),
                             ("--eval-root", args.eval_root, "folder")):
        if path is not None and not (Path(path).is_file() if kind == "file" else Path(path).is_dir()):
            raise ValueError(f"{flag} {path}: no such {kind}")
    overrides = dict(args.overrides)
    get_config(args.preset, **overrides)  # unknown preset or field -> ValueError
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
        raise ValueError("give --sizes (a stream) or --image-size (one fixed size), not both")
    if args.sizes and args.coco_root:
        raise ValueError("--sizes resizes generated images; --coco-root times its own images at their own sizes")
    if args.sizes and args.images is not None and args.images != len(args.sizes):
        raise ValueError(f"--images {args.images} with {len(args.sizes)} --sizes: a stream has one image per size")
    if args.sizes or (getattr(args, "stream", False) and args.image_size is None and args.coco_root is None):
        return stream_workload(args.preset, args.sizes, args.batch_size, args.seed, args.images or STREAM_IMAGES)
    return default_workload(args.preset, args.image_size, args.batch_size, args.images or defaults.RUN_IMAGES)


def compare_options(args: argparse.Namespace) -> CompareOptions:
    """:class:`~mrcnn_bench.ab.CompareOptions`; run options and cases only for a live comparison."""
    from mrcnn_bench import ab, gate, store  # lazy: loads torch

    for side, overrides in (("-a", args.set_a), ("-b", args.set_b)):
        if any(key == "inject_slowdown" for key, _ in overrides):
            new = "--inject-slowdown-a" if side == "-a" else "--inject-slowdown"
            raise ValueError(f"--set{side} inject_slowdown is no longer a Config field: use {new} FRACTION")
    slowdowns = (("--inject-slowdown", args.inject_slowdown), ("--inject-slowdown-a", args.inject_slowdown_a))
    for flag, fraction in slowdowns:
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"{flag} must be in [0, 1), got {fraction}")
    opts = ab.CompareOptions(args.a, args.b, overrides_a=tuple(args.set_a), overrides_b=tuple(args.set_b),
                             slowdown_a=args.inject_slowdown_a, slowdown_b=args.inject_slowdown,
                             threshold=args.threshold, alpha=args.alpha, between_run_sd=args.between_run_sd,
                             out=args.out)
    if not ab.are_run_files(args.a, args.b):
        for spec in (args.a, args.b):
            if not gate.is_code(spec):
                raise ValueError(f"{spec!r} is neither a run file, a checkout directory nor a git ref of {store.REPO}")
        opts.cases = parse_cases(args.cases or defaults.COMPARE_CASES)
        opts.run = run_options(args, rows=[])
    return opts


def gate_options(args: argparse.Namespace) -> GateOptions:
    """:class:`~mrcnn_bench.gate.GateOptions` from the flags."""
    from mrcnn_bench import gate  # lazy: loads torch

    opts = gate.GateOptions(
        preset=args.preset, baseline=args.baseline, write_baseline=args.write_baseline,
        skip_compile=args.skip_compile, accuracy=args.accuracy, checkpoint=args.checkpoint,
        accuracy_out=args.accuracy_out, latency_against=args.latency_against, latency_rounds=args.latency_rounds,
        inject=args.inject, out=args.out, progress=not args.no_progress)
    if not args.skip_compile and args.cases:  # parsed only when used, as the check itself would
        opts.cases = parse_cases(args.cases)
    if args.latency_against:
        opts.latency_cases = parse_cases(args.latency_cases)
    return opts


def cmd_run(args: argparse.Namespace) -> int:
    """The main job. With ``--out``, each finished round is journaled, so SIGTERM / SIGINT write what was
    measured (exit 128 + the signal's number) and ``--resume`` finishes the run."""
    from mrcnn_bench import journal, records, report, runner, store  # lazy: loads torch

    opts = run_options(args)
    name = journal.check_name(args.name or f"run_{opts.workload.preset}")
    opts.resume = args.resume
    opts.journal, _lock = journal.open_for_run(args.out, name, args.resume, args.start_over)  # held while it runs
    out = runner.run(opts)
    doc = records.to_document(out.rows, out.info, name, store.environment(out.info.threads, opts.seed))
    if args.out:  # the run file first: a failure below (a plot, printing the table) cannot lose the measurements
        folder = Path(args.out)
        runner.log(f"wrote {store.save(doc, folder / f'{name}.json')}")
        for p in report.write(doc, folder, with_plots=not args.no_plots):
            runner.log(f"wrote {p}")
    print(report.markdown(doc))
    if out.info.interrupted:
        runner.log(f"interrupted by {out.info.interrupted}: the files above hold the rounds that finished; "
                   "the same command with --resume times the rest")
        return 128 + signal.Signals[out.info.interrupted].value
    if opts.journal is not None:
        opts.journal.unlink(missing_ok=True)  # the run file holds every round now
    errored = [r.row for r in doc.records if r.status == "error"]
    if errored:
        runner.log(f"rows that errored: {errored}")
        return FAILED
    return PASSED


def cmd_report(args: argparse.Namespace) -> int:
    from mrcnn_bench import dashboard  # lazy: loads torch

    for p in dashboard.build(args.paths, Path(args.out)):
        print(p)
    return PASSED


def cmd_compare(args: argparse.Namespace) -> int:
    from mrcnn_bench import ab  # lazy: loads torch

    return ab.compare(compare_options(args))


def cmd_gate(args: argparse.Namespace) -> int:
    from mrcnn_bench import gate  # lazy: loads torch

    return gate.run_gate(gate_options(args))


def cmd_check_benchmarks(args: argparse.Namespace) -> int:
    """Fail unless the pytest-benchmark JSON holds every expected case (``--expect``; default: all quick ones)."""
    expected = {c.name for c in parse_cases(args.expect)}  # unknown case -> ValueError
    try:
        data = json.loads(Path(args.json).read_text())
        ran = {b.get("extra_info", {}).get("case") for b in data["benchmarks"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{args.json}: no pytest-benchmark JSON ({type(e).__name__}: {e})") from None
    missing = sorted(expected - ran)
    print(f"benchmarks that ran: {len(expected & ran)} of the {len(expected)} expected cases")
    if missing:
        print(f"error: these expected cases did not run: {missing}", file=sys.stderr)
        return FAILED
    return PASSED


def cmd_export_db(args: argparse.Namespace) -> int:
    from mrcnn_bench import benchmark_db, store  # lazy: loads torch

    rows = benchmark_db.export([doc for _, doc in store.load_runs(args.paths)])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {len(rows)} records to {out}")
    return PASSED


def cmd_list(args: argparse.Namespace) -> int:
    from mrcnn_bench import inventory  # lazy: checking the backends loads torch

    print(json.dumps(inventory.inventory(), indent=1) if args.json else inventory.text())
    return PASSED


def run_lazy(command: str, argv: list[str]) -> int:
    """A subcommand of :data:`LAZY_COMMANDS`: import its module now, parse ``argv`` with its arguments."""
    module_name, help_text = LAZY_COMMANDS[command]
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{module_name} cannot be imported ({type(e).__name__}: {e})") from None
    parser = argparse.ArgumentParser(prog=f"{PROG} {command}", description=help_text)
    module.add_arguments(parser)
    return int(module.run(parser.parse_args(argv)) or PASSED)


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="run file (.json), or git ref / checkout directory to run live")
    p.add_argument("b", help="run file (.json), or git ref / checkout directory to run live")
    add_run_arguments(p, rounds=defaults.COMPARE_ROUNDS, cases=f"{defaults.COMPARE_CASES} when live, "
                      "every row both run files hold")
    p.add_argument("--set-a", action="append", default=[], type=parse_override, metavar="KEY=VALUE",
                   help="config override for A only (live)")
    p.add_argument("--set-b", action="append", default=[], type=parse_override, metavar="KEY=VALUE",
                   help="config override for B only (live)")
    p.add_argument("--inject-slowdown", type=float, default=0.0, metavar="FRACTION",
                   help="B only (live): about this fraction of extra inference work, outputs unchanged "
                        "(e.g. 0.1; tests the latency gate; default: %(default)s)")
    p.add_argument("--inject-slowdown-a", type=float, default=0.0, metavar="FRACTION",
                   help="the same for A (default: %(default)s)")
    p.add_argument("--threshold", type=float, default=defaults.THRESHOLD,
                   help="relative slowdown that counts (default: %(default)s)")
    p.add_argument("--alpha", type=float, default=defaults.ALPHA,
                   help="family-wise error rate over the cases (Holm; default: %(default)s)")
    p.add_argument("--between-run-sd", type=float, default=defaults.BETWEEN_RUN_SD, metavar="SD",
                   help="run files only: the sd of log(B/A) between separate runs of the same code beyond "
                        "their rounds' noise, allowed for by the test (measure your machine's with "
                        "bench/studies/stored_compare_false_alarms/stored_compare_aa.py; "
                        "default: %(default)s, measured here)")
    p.add_argument("--out", default=None, metavar="FILE", help="write the comparison as JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=version_text(PROG))
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run the matrix interleaved; print the table; write JSON/MD/CSV/HTML")
    add_run_arguments(p, rounds=defaults.RUN_ROUNDS, cases="all")
    p.add_argument("--out", default=None, metavar="DIR", help="write DIR/<name>.json, .md, .csv, .html, .png")
    p.add_argument("--name", default=None, help="file stem (default: run_<preset>)")
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots (the tables and HTML still)")
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted run of the same --out, --name and options: every row is set "
                        "up and warmed up again, then the remaining rounds are timed")
    p.add_argument("--start-over", action="store_true", help="discard the finished rounds of an interrupted run "
                   "of the same --out and --name (without it, or --resume, such a run is refused)")
    p.set_defaults(func=cmd_run, stream=True)  # run's default workload: a stream (run_workload)

    about = (f"B against A, flagged when slower by more than the threshold: {defaults.TEST}, Holm-corrected "
             "over the cases")
    p = sub.add_parser("compare", help=f"A against B: ratios, {defaults.TEST}, regressions flagged",
                       description=about)
    add_compare_arguments(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("gate", help="compile counts exact, accuracy gate, optional interleaved latency gate")
    add_gate_arguments(p)
    p.set_defaults(func=cmd_gate)

    for command, (_, help_text) in LAZY_COMMANDS.items():
        # Their arguments are the module's own, parsed by run_lazy once it is imported.
        sub.add_parser(command, help=help_text, add_help=False)

    p = sub.add_parser("check-benchmarks",
                       help="fail unless `pytest bench/pytest_suite --benchmark-only` ran every expected case")
    p.add_argument("json", help="the file written by --benchmark-json")
    p.add_argument("--expect", default="quick", metavar="CASES",
                   help="comma list of the cases that must have run (default: quick, all of them; "
                        "never only those this machine can run)")
    p.set_defaults(func=cmd_check_benchmarks)

    p = sub.add_parser("report", help="tables and plots of run files, and the HTML dashboard over them")
    p.add_argument("paths", nargs="+", help="run files or folders of them (several machines merge)")
    p.add_argument("--out", default=defaults.REPORT_OUT,
                   help="output folder (default: %(default)s; not under results/html, which asv publish empties)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("export-db", help="run files as records of PyTorch's open-source benchmark database (v3)")
    p.add_argument("paths", nargs="+", help="run files or folders of them")
    p.add_argument("--out", required=True, metavar="FILE", help="the JSON list of records to write")
    p.set_defaults(func=cmd_export_db)

    p = sub.add_parser("list", help="cases, presets and backends, and which of them run on this machine")
    p.add_argument("--json", action="store_true", help="as JSON")
    p.set_defaults(func=cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run the command; the exit code of the module docstring's table."""
    state = {"command": ""}

    def run() -> int:
        if USER_CASES_ERROR is not None:  # before parsing: the parser's help needs the cases
            raise USER_CASES_ERROR
        parser = build_parser()
        args, rest = parser.parse_known_args(argv)
        state["command"] = args.command
        if args.command in LAZY_COMMANDS:
            return run_lazy(args.command, rest)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return args.func(args)

    return guarded(PROG, run, lambda: state["command"])


if __name__ == "__main__":
    sys.exit(main())
