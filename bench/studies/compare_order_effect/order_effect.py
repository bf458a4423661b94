"""Does a live compare favour a row for its position? A/A runs with the rows' order swapped.

    PYTHONPATH=bench python bench/studies/compare_order_effect/order_effect.py run [--trials 20]
        [--out results/latency_gate_live]
    PYTHONPATH=bench python bench/studies/compare_order_effect/order_effect.py summary [--out results/latency_gate_live]

The live error-rate study (``gate_error_rates.py``) found B, the second row of the compare, faster
than A in its A/A trials, and the row that runs first in a round faster than the one that runs
second (the order rotates every round). Each trial here is the compare's A/A run (``static/eager``,
the tiny preset, 30 rounds, each row in its own worker) built directly with :func:`runner.run`,
every other trial with the rows listed B first: a bias that follows the position swaps sign, one
that follows the variant does not. Trials are appended to ``OUT/order_effect.jsonl`` (resumable);
``summary`` writes ``OUT/order_effect.md``: per order, the mean over trials of log(B/A) as a ratio
with its 95% t-interval, and the ratio over the rounds in which A, or B, ran first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the studies' shared modules (studies.*)

from studies.compare_order_effect.order_trials import run, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("run", "summary"))
    parser.add_argument("--trials", type=int, default=20, help="total, alternating the order (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("results/latency_gate_live"))
    args = parser.parse_args()
    if args.what == "run":
        run(args.out, args.trials)
    return summary(args.out)


if __name__ == "__main__":
    sys.exit(main())
