"""Pieces of ``mrcnn-bench``'s argument parsers that need no benchmark case: value parsers (image
sizes, CPU lists, bounded numbers) and the gate's options. Like :mod:`mrcnn_bench.cli.commands`,
nothing here loads torch.
"""

from __future__ import annotations

import argparse
import os

from mrcnn.config import PRESETS
from mrcnn.flags import SEED_MAX, THREADS_MAX, bounded
from mrcnn.progress import add_progress_flag
from mrcnn_bench.base import defaults

__all__ = ["SEED_MAX", "THREADS_MAX", "bounded"]  # re-exported: the harness's parsers take them from here

def parse_size(text: str) -> tuple[int, int]:
    try:
        h, w = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"image size {text!r} is not HxW (e.g. 480x640)") from None
    if h <= 0 or w <= 0:
        raise argparse.ArgumentTypeError(f"image size {text!r} must be positive")
    return h, w


def parse_sizes(text: str) -> tuple[tuple[int, int], ...]:
    """'480x640,640x480' -> ((480, 640), (640, 480)): a stream's image sizes, in order."""
    items = [item.strip() for item in text.split(",")]
    if not any(items) or not all(items):
        raise argparse.ArgumentTypeError(f"sizes {text!r} is not a comma list of HxW (e.g. 480x640,640x480)")
    return tuple(parse_size(item) for item in items)


def parse_cpus(text: str) -> tuple[int, ...]:
    """'0,2-3' -> (0, 2, 3): CPUs this process may use (as taskset takes them)."""
    cpus: set[int] = set()
    try:
        for part in filter(None, text.split(",")):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"CPU list {text!r} is not like 0,1 or 2-3") from None
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        raise argparse.ArgumentTypeError(f"CPU list {text!r}: this process may use only {sorted(allowed)}")
    return tuple(sorted(cpus))


def add_gate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny",
                   help=f"preset of the compile-count cases: {', '.join(sorted(PRESETS))} (default: %(default)s)")
    p.add_argument("--cases", default=None,
                   help="compile-count cases, comma list (default: the baseline's; "
                        f"{', '.join(defaults.GATE_CASES)} with --write-baseline)")
    p.add_argument("--baseline", default=None,
                   help=f"compile baseline (default: {defaults.BASELINES_DIR}/gate_<preset>.json)")
    p.add_argument("--write-baseline", action="store_true",
                   help="record the measured counts as the baseline "
                        f"(from a tree clean outside {defaults.BASELINES_DIR}/)")
    p.add_argument("--skip-compile", action="store_true", help="skip the compile-count check")
    p.add_argument("--accuracy", default="ci", metavar="RECIPE",
                   help="accuracy-gate recipe (default: %(default)s); 'none' to skip")
    p.add_argument("--checkpoint", default=None, help="evaluate this checkpoint instead of training the recipe")
    p.add_argument("--accuracy-out", default=None, metavar="DIR",
                   help="keep the accuracy run's training output here (metrics.jsonl curve, checkpoints)")
    p.add_argument("--accuracy-threads", type=bounded(int, 1, THREADS_MAX), default=1, metavar="N",
                   help="torch threads of the accuracy check's training (default: %(default)s, as the "
                        "baseline's seeds were trained)")
    p.add_argument("--latency-against", default=None, metavar="REF",
                   help="also gate latency: the working tree against this git ref, in process pairs "
                        f"({defaults.PAIR_TEST}, threshold {defaults.PAIR_THRESHOLD:.0%})".replace("%", "%%"))
    p.add_argument("--latency-cases", default=defaults.COMPARE_CASES, metavar="CASES",
                   help="cases of the latency check, comma list (default: %(default)s)")
    p.add_argument("--latency-pairs", type=bounded(int, 1, 1000), default=defaults.COMPARE_PAIRS, metavar="K",
                   help="process pairs of the latency check (default: %(default)s)")
    p.add_argument("--latency-rounds", type=bounded(int, 2, 10_000), default=defaults.COMPARE_ROUNDS, metavar="N",
                   help="interleaved rounds each pair of the latency check times (default: %(default)s)")
    p.add_argument("--inject", choices=defaults.INJECTIONS, default=None,
                   help="test only: inject a fault (recompile: pad images tightly) to show the gate fails")
    p.add_argument("--out", default=None, metavar="FILE", help="write the measurements and verdicts as JSON")
    add_progress_flag(p)
