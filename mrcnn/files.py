"""Files written whole or not at all: the project's one atomic write.

Every file that another process, a later run or a user reads (run files, journals' snapshots,
checkpoints, records of a measurement, cached downloads) goes through here: the bytes go to a
temporary file in the same folder, then a rename puts it in place, so a crash, a full disk or a
kill leaves the old file or none, never half of one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", *, durable: bool = True) -> Iterator[IO]:
    """A file object whose contents replace ``path`` when the block ends without an exception.

    ``mode``: ``"w"`` (text, UTF-8) or ``"wb"``. ``durable``: flush to disk before the rename (off for
    files rewritten many times a second, whose loss in a power cut does not matter). The folder is
    made if it is missing; on an exception the temporary file is removed and ``path`` is untouched.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode {mode!r} is not 'w' or 'wb'")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: str | Path, data: str | bytes, *, durable: bool = True) -> Path:
    """Replace ``path`` with ``data`` (text as UTF-8) in one step; the path."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w", durable=durable) as f:
        f.write(data)
    return Path(path)
