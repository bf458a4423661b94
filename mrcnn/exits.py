"""The exit codes of every command line in the project (``mrcnn`` and ``mrcnn-bench``), and the guard that keeps them.

    0  PASSED     the command did what was asked, and any check it makes passed
    1  FAILED     a regression was found, a gate or check failed, a run had a row that errored,
                  or training stopped on a non-finite loss
    2  UNDECIDED  could not decide: a usage or input error (an unknown name, a missing file, a bad
                  value), inputs that cannot be compared, or a case that cannot run here; one line
                  on stderr names the problem, before any measuring where it can be known then.
                  It is a :class:`UsageError` (bad input from outside) or an ``OSError`` (a missing
                  or unwritable file, a full disk: the environment's refusal)
    3  INTERNAL   an unexpected exception, a bug (a plain ``ValueError`` included: a check that only
                  a caller inside the project can fail): one line with the exception's type and message
                  and where to report it; the traceback goes to a log file named in that line, and
                  to stderr too when the ``<PROG>_DEBUG`` variable (for example ``MRCNN_BENCH_DEBUG``)
                  is ``1``
  128 + N         stopped by signal N (130 SIGINT / Ctrl-C, 143 SIGTERM): the shell's convention,
                  after a line saying so; ``mrcnn-bench run --out`` first writes what it measured.
                  SIGTERM unwinds the command as Ctrl-C does, so what it made on the way (a git
                  worktree, a temporary folder) is removed before it exits

This module imports nothing beyond the standard library, so a command's ``--help`` and
``--version`` stay fast.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version

PASSED, FAILED, UNDECIDED, INTERNAL = 0, 1, 2, 3

REPORT_BUG = "this is a bug: report it to the mrcnn maintainers with the full command and this message"

# Versions ``--version`` names besides the project's: the pins that decide what a measurement means.
VERSION_PACKAGES = ("torch", "torchvision", "torch_xla")


class UsageError(ValueError):
    """Bad input from outside: a flag, a file, an annotation, an environment variable, a config override, a
    git ref, a user's case module. Its message is the one line the user sees (exit 2, :data:`UNDECIDED`).

    Raise it where a condition can be reached from such input; a check that only a caller inside the
    project can fail stays a ``ValueError`` (exit 3: a bug). It subclasses ValueError so that library
    callers catching ValueError keep working.
    """


class Stopped(BaseException):
    """SIGTERM, raised in the main thread as Ctrl-C raises ``KeyboardInterrupt`` (a BaseException, so no
    ``except Exception`` swallows it), so that ``finally`` blocks and context managers run before exit."""


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`Stopped`: where nothing else handles it (the default
    action would end the process without any cleanup) and only in the main thread (the one signals reach).

    A process forked inside the block (a DataLoader worker) inherits the handler but not the block:
    there SIGTERM keeps its default action, so its parent's shutdown ends it quietly, as before.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    owner = os.getpid()

    def stop(signum: int, frame: object) -> None:
        if os.getpid() == owner:
            raise Stopped(signum)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def debug_variable(prog: str) -> str:
    """``mrcnn-bench`` -> ``MRCNN_BENCH_DEBUG``: set to 1 to print an internal error's traceback."""
    return prog.upper().replace("-", "_") + "_DEBUG"


def version_text(prog: str) -> str:
    """``mrcnn-bench 0.1.0 (torch 2.9.1, torchvision 0.24.1, torch_xla 2.9.0)``, from package metadata only."""

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    pins = ", ".join(f"{name} {installed(name)}" for name in VERSION_PACKAGES)
    return f"{prog} {installed('mrcnn')} ({pins})"


def guarded(prog: str, run: Callable[[], int], command: Callable[[], str] = lambda: "") -> int:
    """``run()``'s exit code, with every way out mapped onto the table above.

    ``command()`` names the subcommand for messages once it is known (empty before parsing).
    argparse's own exits (2 for usage errors, 0 for ``--help``) pass through. A :class:`UsageError` or an
    ``OSError`` is one line and :data:`UNDECIDED`; any other exception, a plain ``ValueError`` included,
    is a bug (:func:`internal_error`).
    """
    try:
        with sigterm_unwinds():
            return int(run() or PASSED)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (PASSED if e.code is None else UNDECIDED)
    except KeyboardInterrupt:
        print(f"{_where(prog, command())}: interrupted", file=sys.stderr)
        return 130  # the shell's convention for SIGINT
    except Stopped:
        print(f"{_where(prog, command())}: stopped by SIGTERM", file=sys.stderr)
        return 128 + signal.SIGTERM
    except (UsageError, OSError) as e:  # input or environment, not a bug: one line
        print(f"{_where(prog, command())}: error: {e}", file=sys.stderr)
        return UNDECIDED
    except Exception as e:  # anything else is a bug
        return internal_error(prog, command(), e)


def _where(prog: str, command: str) -> str:
    return f"{prog} {command}" if command else prog


def internal_error(prog: str, command: str, e: BaseException) -> int:
    """Report an unexpected exception in two lines (the traceback goes to a log file); :data:`INTERNAL`."""
    text = traceback.format_exc()
    fd, log = tempfile.mkstemp(prefix=f"{prog}-error-", suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    if os.environ.get(debug_variable(prog)) == "1":
        print(text, file=sys.stderr, end="")
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    where = _where(prog, command)
    print(f"{where}: internal error: {type(e).__name__}: {first} (traceback in {log})", file=sys.stderr)
    print(f"{prog}: {REPORT_BUG}", file=sys.stderr)
    return INTERNAL
