"""A/A spread of the tracked figures: the same commit measured N times, as asv measures each commit.

    PYTHONPATH=bench python bench/tools/history_spread.py [--runs 3] [--out results/asv/aa]

What a run measures and what the summary holds: :mod:`mrcnn_bench.aa_spread`. Run it on an
otherwise idle machine, never beside another measurement.
"""

from __future__ import annotations

import sys

from mrcnn_bench.aa_spread import main

if __name__ == "__main__":
    sys.exit(main())
