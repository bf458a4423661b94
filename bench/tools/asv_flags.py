"""Every regression asv flagged, by commit, and whether the scratch range's verdict holds.

    PYTHONPATH=bench python bench/tools/asv_flags.py [--html results/html] [--out results/asv/regressions.md]

How flags are read and the verdict judged: :mod:`mrcnn_bench.asv_regressions`. Exit 0 when the
verdict holds, 1 when it does not, 2 when there is nothing to read.
"""

from __future__ import annotations

import sys

from mrcnn_bench.asv_regressions import main

if __name__ == "__main__":
    sys.exit(main())
