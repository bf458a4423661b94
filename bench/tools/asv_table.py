"""The held metrics of every commit one asv machine has results for, oldest first, as one table.

    PYTHONPATH=bench python bench/tools/asv_table.py MACHINE [--revs REVS] [--steps] [--results results/asv] [--repo .]
        [--out FILE.md]

What each column is, and the options: :mod:`mrcnn_bench.asv_results_table`.
"""

from __future__ import annotations

import sys

from mrcnn_bench.asv_results_table import main

if __name__ == "__main__":
    sys.exit(main())
