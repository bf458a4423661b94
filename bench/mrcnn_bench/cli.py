"""``mrcnn-bench``: run the matrix, compare two runs or two commits, gate a change, rebuild reports.

    mrcnn-bench run [--preset tiny] [--cases all] [--out results/runs]   the main job
    mrcnn-bench compare A B [--cases static/eager]                       A, B: run files, or git refs / checkouts
    mrcnn-bench gate [--baseline results/baselines/gate_tiny.json]       exit 1 on a regression
    mrcnn-bench accuracy-gate [--recipe ci] ...                          the accuracy gate alone
    mrcnn-bench export-time ...                                          export and AOTInductor build times
    mrcnn-bench report FILE_OR_DIR... [--out DIR]                        tables, plots, dashboard
    mrcnn-bench check-benchmarks out/ci/benchmarks.json [--expect CASES] CI: did the quick cases run?

This is the only module that reads a command line: it turns arguments into each command's typed
options (:class:`~mrcnn_bench.runner.RunOptions`, :class:`~mrcnn_bench.ab.CompareOptions`,
:class:`~mrcnn_bench.gate.GateOptions`) and calls the command; commands call each other through
those options, never through argv.

Exit codes, the same for every command:

    0  passed: the command did what was asked, and any check it makes passed
    1  a regression was found or a gate failed (compare flagged a slowdown, a gate check failed,
       check-benchmarks found an expected case that did not run, run had a row that errored)
    2  could not decide: a usage or input error (an unknown case, a missing file, a bad value),
       inputs that cannot be compared, or a case that could not run; one line on stderr names
       the problem, before any measuring where it can be known then
    3  internal error: an unexpected exception, a bug in mrcnn-bench; one line with the exception's
       type and message, and where to report it (the traceback is written to a log file, named there,
       and printed too with MRCNN_BENCH_DEBUG=1)
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

from mrcnn.config import get_config
from mrcnn.overrides import parse_override
from mrcnn_bench import ab, dashboard, gate, records, report, runner, stats, store
from mrcnn_bench.cases import Row, default_time_limit, default_workload, parse_cases
from mrcnn_bench.compile_probe import INJECTIONS

# Subcommands whose modules load only when used: they pull in the training and export stacks
# (start-up time), and a missing module then fails that subcommand alone.
LAZY_COMMANDS = {
    "accuracy-gate": ("mrcnn_bench.accuracy_gate", "train or evaluate a recipe and gate its box and mask AP"),
    "export-time": ("mrcnn_bench.export_timing", "time torch.export and AOTInductor builds of the model"),
}


def parse_size(text: str) -> tuple[int, int]:
    try:
        h, w = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"image size {text!r} is not HxW (e.g. 480x640)") from None
    if h <= 0 or w <= 0:
        raise argparse.ArgumentTypeError(f"image size {text!r} must be positive")
    return h, w


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by ``run`` and ``compare`` (live): what to run and how."""
    p.add_argument("--preset", default="tiny", help="config preset (default: tiny)")
    p.add_argument("--cases", default=None, help="comma list of cases, or all / quick / inference / training")
    p.add_argument("--image-size", type=parse_size, default=None, metavar="HxW",
                   help="image size (default: one that fits a canvas exactly: tiny 240x320, coco 480x640)")
    p.add_argument("--batch-size", type=int, default=1, help="images per inference call (default: 1)")
    p.add_argument("--images", type=int, default=3, help="distinct generated images (default: 3)")
    p.add_argument("--rounds", type=int, default=10, help="interleaved timed rounds (default: 10)")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls per row; the first is time to first result")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: usable cores)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and images (default: 0)")
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="limit of a bounded row's set-up + first call and of each later call "
                        "(default: 120 for tiny, 300 for coco_r50_fpn)")
    p.add_argument("--weights", default=None, help="torchvision Mask R-CNN state_dict instead of synthetic weights")
    p.add_argument("--coco-root", default=None,
                   help="COCO 2017 root (annotations/instances_val2017.json, val2017/): its images instead of "
                        "generated ones")
    p.add_argument("--coco-split", default="val2017",
                   help="split of --coco-root whose first --images images are timed (default: val2017)")
    p.add_argument("--eval", dest="eval_images", type=int, default=0, metavar="N",
                   help="also COCO box/mask AP of static/eager and torchvision/eager on N images of the "
                        "evaluation set (--coco-root's --coco-split, else generated synthetic val images)")
    p.add_argument("--eval-root", default=None, help="COCO-layout root of the evaluation set (default: --coco-root)")
    p.add_argument("--eval-split", default=None, help="its split (default: --coco-split, or val for --eval-root)")
    p.add_argument("--set", dest="overrides", action="append", default=[], type=parse_override,
                   metavar="KEY=VALUE", help="config override for every row (repeatable)")
    p.add_argument("--reuse-compile-cache", action="store_true",
                   help="use the usual inductor cache (default: a fresh one, so compile times are cold)")
    p.add_argument("--peak-reps", type=int, default=5, help="repetitions of each peak-rate kernel (0: skip)")
    p.add_argument("--no-flops", action="store_true", help="skip the FLOP count")
    p.add_argument("--profile", action="store_true", help="also time each stage of static and torchvision (eager)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_options(args: argparse.Namespace, rows: list[Row] | None = None) -> runner.RunOptions:
    """Validated :class:`~mrcnn_bench.runner.RunOptions`; ValueError with a message for the user."""
    if args.rounds < 0 or args.warmup < 1 or args.images < 1 or args.batch_size < 1 or args.eval_images < 0:
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
        workload=default_workload(args.preset, args.image_size, args.batch_size, args.images),
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
        progress=not args.no_progress,
        peak_reps=args.peak_reps,
        flops=not args.no_flops,
        profile=args.profile,
        eval_images=args.eval_images,
        eval_root=args.eval_root or args.coco_root,
        eval_split=args.eval_split or ("val" if args.eval_root else args.coco_split),
    )


def compare_options(args: argparse.Namespace) -> ab.CompareOptions:
    """:class:`~mrcnn_bench.ab.CompareOptions`; run options and cases only for a live comparison."""
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
                             threshold=args.threshold, alpha=args.alpha, out=args.out)
    if not ab.are_run_files(args.a, args.b):
        for spec in (args.a, args.b):
            if not gate.is_code(spec):
                raise ValueError(f"{spec!r} is neither a run file, a checkout directory nor a git ref of {store.REPO}")
        opts.cases = parse_cases(args.cases or ab.DEFAULT_COMPARE_CASES)
        if args.rounds is None:
            args.rounds = ab.DEFAULT_COMPARE_ROUNDS
        opts.run = run_options(args, rows=[])
    return opts


def gate_options(args: argparse.Namespace) -> gate.GateOptions:
    opts = gate.GateOptions(
        preset=args.preset, baseline=args.baseline, write_baseline=args.write_baseline,
        skip_compile=args.skip_compile, accuracy=args.accuracy, checkpoint=args.checkpoint,
        accuracy_out=args.accuracy_out, latency_against=args.latency_against, latency_rounds=args.latency_rounds,
        inject=args.inject, out=args.out)
    if not args.skip_compile and args.cases:  # parsed only when used, as the check itself would
        opts.cases = parse_cases(args.cases)
    if args.latency_against:
        opts.latency_cases = parse_cases(args.latency_cases)
    return opts


def cmd_run(args: argparse.Namespace) -> int:
    opts = run_options(args)
    out = runner.run(opts)
    name = args.name or f"run_{opts.workload.preset}"
    doc = records.to_document(out.rows, out.info, name, store.environment(out.info.threads, opts.seed))
    print(report.markdown(doc))
    if args.out:
        folder = Path(args.out)
        paths = [store.save(doc, folder / f"{name}.json"), *report.write(doc, folder, with_plots=not args.no_plots)]
        for p in paths:
            runner.log(f"wrote {p}")
    errored = [r.row for r in doc.records if r.status == "error"]
    if errored:
        runner.log(f"rows that errored: {errored}")
        return 1
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    for p in dashboard.build(args.paths, Path(args.out)):
        print(p)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    return ab.compare(compare_options(args))


def cmd_gate(args: argparse.Namespace) -> int:
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
        return 1
    return 0


def run_lazy(command: str, argv: list[str]) -> int:
    """A subcommand of :data:`LAZY_COMMANDS`: import its module now, parse ``argv`` with its arguments."""
    module_name, help_text = LAZY_COMMANDS[command]
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{module_name} cannot be imported ({type(e).__name__}: {e})") from None
    parser = argparse.ArgumentParser(prog=f"mrcnn-bench {command}", description=help_text)
    module.add_arguments(parser)
    return int(module.run(parser.parse_args(argv)) or 0)


def add_gate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", help="preset of the compile-count cases (default: tiny)")
    p.add_argument("--cases", default=None,
                   help=f"compile-count cases (default: the baseline's; {gate.GATE_CASES} with --write-baseline)")
    p.add_argument("--baseline", default=None, help="compile baseline (default: results/baselines/gate_<preset>.json)")
    p.add_argument("--write-baseline", action="store_true",
                   help="record the measured counts as the baseline (from a tree clean outside results/)")
    p.add_argument("--skip-compile", action="store_true", help="skip the compile-count check")
    p.add_argument("--accuracy", default="ci", metavar="RECIPE",
                   help="accuracy-gate recipe (default: ci); 'none' to skip")
    p.add_argument("--checkpoint", default=None, help="evaluate this checkpoint instead of training the recipe")
    p.add_argument("--accuracy-out", default=None, metavar="DIR",
                   help="keep the accuracy run's training output here (metrics.jsonl curve, checkpoints)")
    p.add_argument("--latency-against", default=None, metavar="REF",
                   help="also gate latency: the working tree against this git ref, interleaved")
    p.add_argument("--latency-cases", default="static/eager")
    p.add_argument("--latency-rounds", type=int, default=None)
    p.add_argument("--inject", choices=INJECTIONS, default=None,
                   help="test only: inject a fault (recompile: pad images tightly) to show the gate fails")
    p.add_argument("--out", default=None, metavar="FILE", help="write the measurements and verdicts as JSON")


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="run file (.json), or git ref / checkout directory to run live")
    p.add_argument("b", help="run file (.json), or git ref / checkout directory to run live")
    add_run_arguments(p)
    p.add_argument("--set-a", action="append", default=[], type=parse_override, metavar="KEY=VALUE",
                   help="config override for A only (live)")
    p.add_argument("--set-b", action="append", default=[], type=parse_override, metavar="KEY=VALUE",
                   help="config override for B only (live)")
    p.add_argument("--inject-slowdown", type=float, default=0.0, metavar="FRACTION",
                   help="B only (live): about this fraction of extra inference work, outputs unchanged "
                        "(e.g. 0.1; tests the latency gate)")
    p.add_argument("--inject-slowdown-a", type=float, default=0.0, metavar="FRACTION",
                   help="the same for A")
    p.add_argument("--threshold", type=float, default=None,
                   help=f"relative slowdown that counts (default: {stats.DEFAULT_THRESHOLD:g})")
    p.add_argument("--alpha", type=float, default=ab.DEFAULT_ALPHA,
                   help="family-wise error rate over the cases (Holm); default %(default)s")
    p.set_defaults(rounds=None)
    p.add_argument("--out", default=None, metavar="FILE", help="write the comparison as JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mrcnn-bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run the matrix interleaved; print the table; write JSON/MD/CSV/HTML")
    add_run_arguments(p)
    p.add_argument("--out", default=None, metavar="DIR", help="write DIR/<name>.json, .md, .csv, .html, .png")
    p.add_argument("--name", default=None, help="file stem (default: run_<preset>)")
    p.add_argument("--no-plots", action="store_true")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("compare", help="A against B: ratios, Mann-Whitney, regressions flagged")
    add_compare_arguments(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("gate", help="compile counts exact, accuracy gate, optional interleaved latency gate")
    add_gate_arguments(p)
    p.set_defaults(func=cmd_gate)

    for command, (_, help_text) in LAZY_COMMANDS.items():
        # Their arguments are the module's own, parsed by run_lazy once it is imported.
        sub.add_parser(command, help=help_text, add_help=False)

    p = sub.add_parser("check-benchmarks", help="fail unless `pytest bench --benchmark-only` ran every expected case")
    p.add_argument("json", help="the file written by --benchmark-json")
    p.add_argument("--expect", default="quick", metavar="CASES",
                   help="comma list of the cases that must have run (default: quick, all of them; "
                        "never only those this machine can run)")
    p.set_defaults(func=cmd_check_benchmarks)

    p = sub.add_parser("report", help="tables and plots of run files, and the HTML dashboard over them")
    p.add_argument("paths", nargs="+", help="run files or folders of them (several machines merge)")
    p.add_argument("--out", default="results/report",
                   help="output folder (default: results/report; not under results/html, which asv publish empties)")
    p.set_defaults(func=cmd_report)
    return parser


REPORT_BUG = "this is a bug in mrcnn-bench: report it to the mrcnn maintainers with the full command and this message"
DEBUG_ENV = "MRCNN_BENCH_DEBUG"  # =1: also print an internal error's traceback


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run the command; the exit code of the module docstring's table."""
    command = "?"
    try:
        parser = build_parser()
        args, rest = parser.parse_known_args(argv)
        command = args.command
        if rest and command not in LAZY_COMMANDS:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        if command in LAZY_COMMANDS:
            return run_lazy(command, rest)
        return int(args.func(args) or 0)
    except SystemExit as e:  # argparse: usage errors (2, its message printed) and --help (0)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except (ValueError, OSError) as e:
        print(f"mrcnn-bench {command}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # anything else is a bug: one line, and where the traceback went
        return internal_error(command, e)


def internal_error(command: str, e: Exception) -> int:
    """Report an unexpected exception in two lines (the traceback goes to a log file); exit code 3."""
    text = traceback.format_exc()
    fd, log = tempfile.mkstemp(prefix="mrcnn-bench-error-", suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    if os.environ.get(DEBUG_ENV) == "1":
        print(text, file=sys.stderr, end="")
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    print(f"mrcnn-bench {command}: internal error: {type(e).__name__}: {first} (traceback in {log})", file=sys.stderr)
    print(f"mrcnn-bench: {REPORT_BUG}", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
