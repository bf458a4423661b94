"""The harness's usage error: :class:`mrcnn.exits.UsageError`, the one type for bad input from outside (exit 2).

Harness modules take it from here rather than from :mod:`mrcnn.exits` itself: a worker row (or a tool
measuring an old commit) runs with the ``mrcnn`` of another checkout, which may predate UsageError.
There it is ``ValueError``, what that checkout's own checks raise; a row's error is a row's error
either way, and the command lines, which run on this checkout, always get the real class.
"""

from __future__ import annotations

try:
    from mrcnn.exits import UsageError
except ImportError:  # an mrcnn from before UsageError (see the module docstring)
    UsageError = ValueError  # type: ignore[misc,assignment]

__all__ = ["UsageError"]
