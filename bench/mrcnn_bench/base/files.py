"""The project's one atomic write (:mod:`mrcnn.files`), as the harness imports it, and the reading of
a JSON file the harness or asv wrote, which a user may still have damaged (:func:`read_json`).

Harness modules take it from here rather than from :mod:`mrcnn.files` itself: a worker row, asv's
measurement of an old commit and a live compare run this harness beside another checkout's
``mrcnn``, which may predate that module. Then this checkout's own ``mrcnn/files.py`` is loaded by
its path (it needs the standard library only), so there is still one implementation.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from mrcnn_bench.base.errors import UsageError

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

__all__ = ["atomic_open", "atomic_write", "read_json"]


def read_json(path: str | Path, what: str = "JSON", kind: type = object) -> Any:
    """The JSON document in ``path``; UsageError naming the file (and ``what`` it should be) when it is
    not JSON, nests too deep to read, or is not of ``kind`` (e.g. ``dict``)."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, nesting past the stack
        raise UsageError(f"{path}: not {what} ({type(e).__name__}: {str(e)[:120]})") from None
    if not isinstance(value, kind):
        raise UsageError(f"{path}: not {what} (a JSON {type(value).__name__}, not a {kind.__name__})")
    return value
