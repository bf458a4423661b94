"""A deterministic scratch commit range for asv's regression detection: ``asv-scratch``.

    python bench/tools/asv_scratch.py [--repo PATH]           build the range, set the branch, print it
    python bench/tools/asv_scratch.py [--repo PATH] --check   exit 1 unless the branch is the expected tip
    python bench/tools/asv_scratch.py [--repo PATH] --list    the expected commits as JSON

The commits, their edits and how they are built: :mod:`mrcnn_bench.scratch_range`. ``--repo``
defaults to the checkout this script lies in.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mrcnn_bench.scratch_range import main

if __name__ == "__main__":
    sys.exit(main(default_repo=Path(__file__).resolve().parents[2]))
