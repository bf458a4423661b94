"""``mrcnn-bench``: run the matrix, compare two runs or two commits, gate a change, rebuild reports.

    mrcnn-bench run [--preset tiny] [--cases all] [--out results/runs]   the main job
    mrcnn-bench compare A B [--cases static/eager] [--pairs K]           A, B: run files, or git refs / checkouts
    mrcnn-bench bisect GOOD BAD [--cases static/eager]                   the first commit confirmed slower
    mrcnn-bench gate [--baseline baselines/gate_tiny.json]               exit 1 on a regression
    mrcnn-bench latency-check [--against REF]                            CI: is this change slower?
    mrcnn-bench accuracy-gate [--recipe ci] ...                          the accuracy gate alone
    mrcnn-bench export-time ...                                          export and AOTInductor build times
    mrcnn-bench steps [--machine NAME | --series FILE.csv] [--json]      change points of the history
    mrcnn-bench asv TOOL ...                                             the tools around asv's history
    mrcnn-bench report FILE_OR_DIR... [--out out/report]                 tables, plots, dashboard
    mrcnn-bench check-benchmarks out/ci/benchmarks.json [--expect CASES] CI: did the quick cases run?
    mrcnn-bench gpu-check [--out out/gpu-check]                          everything that needs a CUDA GPU
    mrcnn-bench list [--json]                                            cases, presets, backends on this machine
    mrcnn-bench export-db RUN.json... --out FILE                         PyTorch benchmark database (v3) records

This is the only module that reads a command line: it turns arguments into each command's typed
options (:class:`~mrcnn_bench.running.runner.RunOptions`, :class:`~mrcnn_bench.gates.ab.CompareOptions`,
:class:`~mrcnn_bench.gates.gate.GateOptions`) and calls the command; commands call each other through
those options, never through argv. Defaults shown in ``--help`` are the ones the commands use
(:mod:`mrcnn_bench.base.defaults`, :mod:`mrcnn_bench.running.cases`). The parser loads no torch, so ``--help``
and ``--version`` are fast; each command imports what it runs when it runs.

Exit codes, the same for every command (:mod:`mrcnn.exits`): 0 passed; 1 a regression was found or
a gate failed (compare flagged a slowdown, a gate check failed, check-benchmarks found an expected
case that did not run, run had a row that errored); 2 could not decide (a usage or input error, inputs
that cannot be compared, a case that could not run: a :class:`~mrcnn.exits.UsageError` or an ``OSError``),
with one line naming the problem, before any measuring where it can be known then; 3 internal error, a bug
(any other exception, a plain ``ValueError`` included: one line, the traceback in a log file named there,
printed too with ``MRCNN_BENCH_DEBUG=1``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
from pathlib import Path

from mrcnn.exits import FAILED, PASSED, debug_variable, guarded, version_text
from mrcnn_bench.base import defaults
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.cli.args import add_gate_arguments

USER_CASES_ERROR: ValueError | None = None  # a user's case module that failed to load: main() raises it, exit 2
try:  # the first import of mrcnn_bench.running.cases loads the user's case modules ($MRCNN_BENCH_CASES, entry points)
    from mrcnn_bench.cli.options import (
        add_bisect_arguments,
        add_compare_arguments,
        add_latency_check_arguments,
        add_run_arguments,
        bisect_options,
        compare_options,
        gate_options,
        latency_check_options,
        run_options,
    )
    from mrcnn_bench.running.cases import parse_cases
except ValueError as e:  # UserCasesError (a UsageError, exit 2); anything else is a bug, exit 3, once main() raises it
    USER_CASES_ERROR = e

PROG = "mrcnn-bench"
DEBUG_ENV = debug_variable(PROG)  # =1: also print an internal error's traceback

# Subcommands whose modules load only when used: they pull in the training and export stacks
# (start-up time), and a missing module then fails that subcommand alone.
LAZY_COMMANDS = {
    "asv": ("mrcnn_bench.cli.asv", "the tools around asv's history: machine, fixture, scratch, spread, table, "
            "flags, report, offline-html, screenshots"),
    "accuracy-gate": ("mrcnn_bench.gates.accuracy_gate", "train or evaluate a recipe and gate its box and mask AP"),
    "export-time": ("mrcnn_bench.running.export_timing", "time torch.export and AOTInductor builds of the model"),
    "gpu-check": ("mrcnn_bench.running.gpu_check",
                  "the CUDA tests, rows, fp16 training and AOTInductor on a GPU, in one go"),
    "steps": ("mrcnn_bench.changes.steps",
              "change points of the history across commits (asv results or a CSV of series)"),
}


def cmd_run(args: argparse.Namespace) -> int:
    """The main job. With ``--out``, each finished round is journaled, so SIGTERM / SIGINT write what was
    measured (exit 128 + the signal's number) and ``--resume`` finishes the run."""
    # lazy: loads torch
    from mrcnn_bench.reports import report
    from mrcnn_bench.running import journal, records, runner, store

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
    from mrcnn_bench.reports import dashboard  # lazy: loads torch

    for p in dashboard.build(args.paths, Path(args.out)):
        print(p)
    return PASSED


def cmd_compare(args: argparse.Namespace) -> int:
    from mrcnn_bench.gates import ab  # lazy: loads torch

    return ab.compare(compare_options(args))


def cmd_bisect(args: argparse.Namespace) -> int:
    from mrcnn_bench.changes import bisection  # lazy: loads torch

    return bisection.bisect(bisect_options(args))


def cmd_gate(args: argparse.Namespace) -> int:
    from mrcnn_bench.gates import gate  # lazy: loads torch

    return gate.run_gate(gate_options(args))


def cmd_latency_check(args: argparse.Namespace) -> int:
    from mrcnn_bench.gates import latency_check  # lazy: loads torch

    return latency_check.check(latency_check_options(args))


def cmd_check_benchmarks(args: argparse.Namespace) -> int:
    """Fail unless the pytest-benchmark JSON holds every expected case (``--expect``; default: all quick ones)."""
    expected = {c.name for c in parse_cases(args.expect)}  # unknown case -> UsageError
    try:
        data = json.loads(Path(args.json).read_text())
        ran = {b.get("extra_info", {}).get("case") for b in data["benchmarks"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise UsageError(f"{args.json}: no pytest-benchmark JSON ({type(e).__name__}: {e})") from None
    missing = sorted(expected - ran)
    print(f"benchmarks that ran: {len(expected & ran)} of the {len(expected)} expected cases")
    if missing:
        print(f"error: these expected cases did not run: {missing}", file=sys.stderr)
        return FAILED
    return PASSED


def cmd_export_db(args: argparse.Namespace) -> int:
    # lazy: loads torch
    from mrcnn_bench.reports import benchmark_db
    from mrcnn_bench.running import store

    rows = benchmark_db.export([doc for _, doc in store.load_runs(args.paths)])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, json.dumps(rows, indent=1) + "\n")
    print(f"wrote {len(rows)} records to {out}")
    return PASSED


def cmd_list(args: argparse.Namespace) -> int:
    from mrcnn_bench.running import inventory  # lazy: checking the backends loads torch

    print(json.dumps(inventory.inventory(), indent=1) if args.json else inventory.text())
    return PASSED


def run_lazy(command: str, argv: list[str]) -> int:
    """A subcommand of :data:`LAZY_COMMANDS`: import its module now, parse ``argv`` with its arguments."""
    module_name, help_text = LAZY_COMMANDS[command]
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UsageError(f"{module_name} cannot be imported ({type(e).__name__}: {e})") from None
    if hasattr(module, "run_argv"):  # a group of tools, each with its own parser
        return module.run_argv(f"{PROG} {command}", argv)
    parser = argparse.ArgumentParser(prog=f"{PROG} {command}", description=help_text)
    module.add_arguments(parser)
    return int(module.run(parser.parse_args(argv)) or PASSED)


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

    about = (f"B against A, flagged when slower by more than the threshold, Holm-corrected over the cases. Live: "
             f"K pairs of fresh processes, {defaults.PAIR_TEST}; with --pairs 1, {defaults.TEST}. Run files: "
             "a z-test of the runs' mean log ratios that allows for the spread between runs")
    p = sub.add_parser("compare", help="A against B: ratios with intervals, live in process pairs, regressions "
                       "flagged", description=about)
    add_compare_arguments(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("bisect", help="the first commit between GOOD and BAD that a live compare confirms slower",
                       description="Each verdict a live compare of GOOD against one commit in process pairs; a binary "
                       "search measures only the commits it needs; a commit that cannot be measured is skipped and "
                       "named. Exit 1: a first slower commit named; 0: BAD is not slower; 2: could not tell")
    add_bisect_arguments(p)
    p.set_defaults(func=cmd_bisect)

    p = sub.add_parser("gate", help="compile counts exact, accuracy gate, optional latency gate in process pairs")
    add_gate_arguments(p)
    p.set_defaults(func=cmd_gate)

    p = sub.add_parser("latency-check", help="CI: the working tree against the commit it starts from, on the cases "
                       "its diff can affect, live in process pairs sized for five minutes; a markdown summary",
                       description="Exit 1: a case confirmed slower than the threshold; 2: could not measure; "
                       "0: not slower, or the diff changes nothing under mrcnn/ (the only code that differs "
                       "between the sides)")
    add_latency_check_arguments(p)
    p.set_defaults(func=cmd_latency_check)

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
