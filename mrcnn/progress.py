"""One progress convention for every long-running command of the project.

On a terminal (stderr is a TTY and ``CI`` is unset or empty) a tqdm bar that redraws in place.
Anywhere else (a CI log, a file, a pipe) plain lines, one when the work starts, then at most one every
:data:`LINE_INTERVAL_S` seconds, and one at the end, so a log shows progress without a carriage
return or a redraw per step. Every command turns both off with ``--no-progress``
(:func:`add_progress_flag`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from typing import IO, Any

from tqdm import tqdm

LINE_INTERVAL_S = 30.0
NO_PROGRESS_HELP = f"no progress output (default: a bar on a terminal, else a line every {LINE_INTERVAL_S:g} s)"


def interactive(stream: IO[str] | None = None) -> bool:
    """A terminal that can draw a bar: ``stream`` (default stderr) is a TTY and ``CI`` is unset."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and not os.environ.get("CI")


class _Lines:
    """A file for tqdm that turns each redraw (``\\r`` + text + padding) into one line of its own."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        for part in text.split("\r"):
            line = part.strip()
            if line:
                self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress(iterable: Iterable[Any] | None = None, *, enabled: bool = True, stream: IO[str] | None = None,
             **kwargs: Any) -> tqdm:
    """A tqdm over ``iterable`` (or ``total=``) that follows the module's convention.

    ``kwargs`` go to tqdm (``desc``, ``total``, ``unit``, ``initial``...). Disabled, it yields the
    items and accepts ``update`` / ``set_postfix`` / ``close`` but prints nothing.
    """
    stream = sys.stderr if stream is None else stream
    if interactive(stream):
        return tqdm(iterable, file=stream, disable=not enabled, dynamic_ncols=True, **kwargs)
    # tqdm's monitor thread redraws a bar idle for ``maxinterval``; at the same 30 s as the updates'
    # own redraw it raced them and printed the same step twice. At twice that, it speaks only when
    # the work has stalled.
    return tqdm(iterable, file=_Lines(stream), disable=not enabled, mininterval=LINE_INTERVAL_S,
                maxinterval=2 * LINE_INTERVAL_S, ascii=True, ncols=100, **kwargs)  # fmt: skip


def add_progress_flag(parser: argparse.ArgumentParser, *old_spellings: str) -> None:
    """``--no-progress`` (dest ``no_progress``); ``old_spellings`` (e.g. ``--quiet``) still parse, unlisted."""
    parser.add_argument("--no-progress", dest="no_progress", action="store_true", help=NO_PROGRESS_HELP)
    for flag in old_spellings:
        parser.add_argument(flag, dest="no_progress", action="store_true", help=argparse.SUPPRESS)
