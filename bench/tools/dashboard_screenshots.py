"""Screenshots of the published asv dashboard in headless Chromium with no network: proof that it renders.

    python bench/tools/dashboard_screenshots.py [--html-dir results/html] [--out results/asv/screenshots]
    python bench/tools/dashboard_screenshots.py --report DIR [--out DIR]

The pages taken, the files written and the exit codes: :mod:`mrcnn_bench.screenshots`.
"""

from __future__ import annotations

import sys

from mrcnn_bench.screenshots import main

if __name__ == "__main__":
    sys.exit(main())
