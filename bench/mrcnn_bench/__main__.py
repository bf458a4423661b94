"""``python -m mrcnn_bench``: the same command line as ``mrcnn-bench`` (for a checkout that is not installed)."""

import sys

from mrcnn_bench.cli.commands import main

sys.exit(main())
