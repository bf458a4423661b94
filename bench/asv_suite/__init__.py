"""asv front end over the harness's cases (``mrcnn_bench.running.cases``): see ``benchmarks.py``.

asv imports this package by its name only. Putting ``bench/`` on the path makes ``mrcnn_bench`` the
harness of this checkout for every commit benchmarked, while ``mrcnn``, the code under test, stays
the one asv installed for that commit.
"""

import sys
from pathlib import Path

_BENCH = str(Path(__file__).resolve().parents[1])
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)
