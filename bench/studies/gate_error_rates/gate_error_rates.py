"""The latency gate's error rates, measured through the gate's own code path, resumably.

    PYTHONPATH=bench python bench/studies/gate_error_rates/gate_error_rates.py run --out results/latency_gate_live
        [--hours 2]
    PYTHONPATH=bench python bench/studies/gate_error_rates/gate_error_rates.py summary --out results/latency_gate_live

Each trial is one live ``compare`` as ``mrcnn-bench gate --latency-against`` runs it
(:func:`mrcnn_bench.gates.ab.run_live`): A and B each in a worker subprocess importing its checkout (here
this working tree for both), the whole inference pipeline at the machine's thread count, the
compare defaults (``static/eager``, the tiny preset's 240x320 image, ``ROUNDS`` interleaved
rounds). An A/A trial leaves B unchanged; an A/B trial injects a slowdown of 10% or 5% into B
(:mod:`mrcnn_bench.running.slowdown`: real extra compute, outputs unchanged). The kind of each next trial
is the one furthest behind its target (``TARGETS``: at least 72 A/A, which is what a claimed
false-alarm rate of at most 5% needs with a two-sided 95% Clopper-Pearson bound and no false alarm,
and 30 at each slowdown), so load changes during the study hit every kind alike.

Every finished trial is appended to ``OUT/trials.jsonl`` (the raw per-round times included), so
the study resumes where it stopped. A round count N below ``ROUNDS`` is judged on each trial's
first N rounds, exactly what an N-round compare would have timed. ``summary`` writes
``OUT/error_rates.md``: per round count, the false-alarm and detection rates with their two-sided
95% Clopper-Pearson intervals and the number of trials each rests on. The logic, and ``ROUNDS``,
``TARGETS`` and ``GOALS``: :mod:`studies.gate_error_rates.live_error_rates`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the studies' shared modules (studies.*)

from studies.gate_error_rates.live_error_rates import run, summary

from mrcnn.progress import add_progress_flag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="append trials until every target is reached or --hours pass")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--hours", type=float, default=24.0, help="stop after this long (default: %(default)s)")
    add_progress_flag(p)
    p = sub.add_parser("summary", help="the rates per round count, from the trials so far")
    p.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    return run(args.out, args.hours, not args.no_progress) if args.command == "run" else summary(args.out)


if __name__ == "__main__":
    sys.exit(main())
