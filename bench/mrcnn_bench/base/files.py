"""The project's one atomic write (:mod:`mrcnn.files`), as the harness imports it.

Harness modules take it from here rather than from :mod:`mrcnn.files` itself: a worker row, asv's
measurement of an old commit and a live compare run this harness beside another checkout's
``mrcnn``, which may predate that module. Then this checkout's own ``mrcnn/files.py`` is loaded by
its path (it needs the standard library only), so there is still one implementation.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

try:
    from mrcnn.files import atomic_open, atomic_write
except ImportError:  # an mrcnn from before mrcnn.files (see the module docstring)
    _SOURCE = Path(__file__).resolve().parents[3] / "mrcnn" / "files.py"
    _spec = importlib.util.spec_from_file_location("mrcnn_bench.base._this_checkouts_files", _SOURCE)
    if _spec is None or _spec.loader is None or not _SOURCE.is_file():
        raise ImportError(f"the mrcnn on the path has no mrcnn.files, and {_SOURCE} is missing") from None
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    atomic_open, atomic_write = _module.atomic_open, _module.atomic_write

__all__ = ["atomic_open", "atomic_write"]
