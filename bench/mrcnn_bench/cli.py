"""``mrcnn-bench``: run the matrix, compare two runs or two commits, gate a change, rebuild reports.

    mrcnn-bench run [--preset tiny] [--cases all] [--out results/runs]   the main job
    mrcnn-bench compare A B [--cases static/eager]                       A, B: run files, or git refs / checkouts
    mrcnn-bench gate [--baseline results/baselines/gate_tiny.json]       exit 1 on a regression
    mrcnn-bench report FILE_OR_DIR... [--out DIR]                        tables, plots, dashboard
    mrcnn-bench check-benchmarks out/ci/benchmarks.json                  CI: did the quick cases run?
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mrcnn_bench.cases import DEFAULT_TIME_LIMIT, DEFAULT_WORKLOADS, Workload, parse_cases


def parse_size(text: str) -> tuple[int, int]:
    try:
        h, w = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"image size {text!r} is not HxW (e.g. 480x640)") from None
    if h <= 0 or w <= 0:
        raise argparse.ArgumentTypeError(f"image size {text!r} must be positive")
    return h, w


def parse_override(text: str) -> tuple[str, object]:
    import ast

    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--set expects key=value, got {text!r}")
    try:
        return key.strip(), ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key.strip(), value


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by ``run``, ``compare`` (live) and ``gate``: what to run and how."""
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


def run_options(args: argparse.Namespace, rows=None):
    """Validated :class:`~mrcnn_bench.runner.RunOptions`; ValueError with a message for the user."""
    from mrcnn.config import get_config
    from mrcnn_bench.runner import Row, RunOptions

    if args.rounds < 0 or args.warmup < 1 or args.images < 1 or args.batch_size < 1 or args.eval_images < 0:
        raise ValueError("--rounds and --eval must be >= 0, and --warmup, --images and --batch-size >= 1")
    if args.threads is not None and args.threads < 1:
        raise ValueError("--threads must be >= 1")
    if args.time_limit is not None and args.time_limit <= 0:
        raise ValueError("--time-limit must be > 0")
    overrides = dict(args.overrides)
    get_config(args.preset, **overrides)  # unknown preset or field -> ValueError
    default = DEFAULT_WORKLOADS.get(args.preset, Workload(args.preset))
    workload = Workload(args.preset, args.image_size or default.image_size, args.batch_size, args.images)
    return RunOptions(
        workload=workload,
        rows=rows if rows is not None else [Row(c) for c in parse_cases(args.cases)],
        rounds=args.rounds,
        warmup=args.warmup,
        threads=args.threads,
        seed=args.seed,
        time_limit=args.time_limit or DEFAULT_TIME_LIMIT.get(args.preset, 300.0),
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


def cmd_run(args: argparse.Namespace) -> int:
    from mrcnn_bench import report, runner, store

    opts = run_options(args)
    raw = runner.run(opts)
    name = args.name or f"run_{opts.workload.preset}"
    doc = store.to_document(raw, name, store.environment(raw["threads"], opts.seed))
    print(report.markdown(doc))
    if args.out:
        out = Path(args.out)
        paths = [store.save(doc, out / f"{name}.json"), *report.write(doc, out, with_plots=not args.no_plots)]
        for p in paths:
            runner.log(f"wrote {p}")
    errored = [r["row"] for r in doc["records"] if r["status"] == "error"]
    if errored:
        runner.log(f"rows that errored: {errored}")
        return 1
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from mrcnn_bench import dashboard

    paths = dashboard.build(args.paths, Path(args.out))
    for p in paths:
        print(p)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from mrcnn_bench import ab

    return ab.main(args)


def cmd_gate(args: argparse.Namespace) -> int:
    from mrcnn_bench import gate

    return gate.main(args)


def cmd_check_benchmarks(args: argparse.Namespace) -> int:
    """Fail unless the pytest-benchmark JSON holds every quick case that can run here."""
    import json

    from mrcnn_bench.cases import CASES, QUICK

    try:
        data = json.loads(Path(args.json).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{args.json}: no pytest-benchmark JSON ({e})") from None
    ran = {b.get("extra_info", {}).get("case") for b in data.get("benchmarks", [])}
    expected = {n for n in QUICK if CASES[n].skip_reason() is None}
    missing = sorted(expected - ran)
    print(f"benchmarks that ran: {len(ran)} of the {len(expected)} quick cases available here")
    if missing:
        print(f"error: these quick cases did not run: {missing}", file=sys.stderr)
        return 1
    return 0


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
    p.add_argument("a", help="run file (.json), or git ref / checkout directory to run live")
    p.add_argument("b", help="run file (.json), or git ref / checkout directory to run live")
    add_run_arguments(p)
    p.add_argument("--set-a", action="append", default=[], type=parse_override, metavar="KEY=VALUE",
                   help="config override for A only (live)")
    p.add_argument("--set-b", action="append", default=[], type=parse_override, metavar="KEY=VALUE",
                   help="config override for B only (live), e.g. inject_slowdown=0.1")
    p.add_argument("--threshold", type=float, default=None, help="relative slowdown that counts (default: stats)")
    p.set_defaults(rounds=None)
    p.add_argument("--out", default=None, metavar="FILE", help="write the comparison as JSON")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("gate", help="compile counts exact, accuracy gate, optional interleaved latency gate")
    from mrcnn_bench.gate import add_arguments as add_gate_arguments

    add_gate_arguments(p)
    p.set_defaults(func=cmd_gate)

    p = sub.add_parser("check-benchmarks", help="fail unless `pytest bench --benchmark-only` ran every quick case")
    p.add_argument("json", help="the file written by --benchmark-json")
    p.set_defaults(func=cmd_check_benchmarks)

    p = sub.add_parser("report", help="tables and plots of run files, and the HTML dashboard over them")
    p.add_argument("paths", nargs="+", help="run files or folders of them (several machines merge)")
    p.add_argument("--out", default="results/html/report", help="output folder (default: results/html/report)")
    p.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValueError as e:
        print(f"mrcnn-bench {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
