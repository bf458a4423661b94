"""A run's rounds as they finish: an append-only JSON-lines file that a crash cannot corrupt.

``mrcnn-bench run --out DIR`` writes ``DIR/<name>.rounds.jsonl``: first a ``start`` line with the
run's identity (:func:`run_key`: workload, rows, rounds, seed, threads, settings), then one
``round`` line per finished round with every row's measurement of it. A line is written whole and
flushed to disk before the next round starts, so a run killed at any moment (SIGKILL, a lost
machine) leaves every finished round readable; a torn last line is ignored on reading.

``--resume`` reads the file back (:func:`read`), refuses one written by a different run, and the
runner continues from the next round after setting up and warming up every row again; a torn last
line is cut before the first new line is appended. A run without ``--resume`` refuses to start over
a journal that holds finished rounds unless told to (:func:`check_fresh`), and one process at a time
holds a journal (:func:`hold`): a second run of the same ``--out`` and ``--name`` is refused.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import signal
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mrcnn_bench.base.errors import UsageError

SUFFIX = ".rounds.jsonl"
# A fault hook for the kill tests: the round whose line is written half, then the process SIGKILLs itself.
TEAR_ENV = "MRCNN_BENCH_TEAR_JOURNAL_AT_ROUND"


# A run's name is a file stem inside --out: no folder separators, no "..", nothing hidden.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_name(name: str, what: str = "--name") -> str:
    """``name`` if it is a plain file stem, else ValueError: a name becomes paths inside --out."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or ".." in name:
        raise UsageError(f"{what} must be a file stem of letters, digits, '.', '_' and '-' (it names the files "
                         f"written inside --out), got {name!r}")
    return name


def path_for(out_dir: str | Path, name: str) -> Path:
    return Path(out_dir) / f"{check_name(name)}{SUFFIX}"


def hold(path: Path) -> Any:
    """An exclusive lock on the journal at ``path`` for as long as the returned file stays open (the
    process's life, at most). UsageError when another process has it, or when ``path`` is a symlink.

    The lock is an ``flock`` on the journal itself, created empty here if it does not exist: it lives
    where the journal does, so every run of the same ``--out`` and ``--name`` sees it whatever its
    ``TMPDIR``, and nothing is added to the output folder. The journal is opened without following a
    symlink, so a link planted at its name cannot point the run's writes at another file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UsageError(f"{path} is a symbolic link: a run writes its journal only to a plain file "
                             "(remove the link, or give another --out or --name)") from None
        raise UsageError(f"cannot open the journal {path}: {e.strerror or e}") from None
    f = os.fdopen(fd, "r+b")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise UsageError(f"{path} is not a plain file: give another --out or --name")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(os.fstat(fd).st_ino)
        f.close()
        raise UsageError(f"{path} is being written by {holder}: one run per --out and --name at a time (wait "
                         "for it, or give another --name)") from None
    return f


def _holder(inode: int) -> str:
    """"process PID" holding an flock on the file ``inode``, from Linux's /proc/locks; else "another process"."""
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        return "another process"
    for fields in (line.split() for line in table.splitlines()):
        # "1: FLOCK  ADVISORY  WRITE 2047 00:2e:1234 0 EOF"; a waiter's line has "->" after the number
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode):
            return f"process {fields[4]}"
    return "another process"


def open_for_run(out: str | None, name: str, resume: bool, start_over: bool) -> tuple[Path | None, Any]:
    """The journal of a run with ``--out``/``--name`` (None without --out) and its lock (:func:`hold`),
    checked before anything is measured; ValueError for flags that do not fit together or a journal
    that must not be overwritten (:func:`check_fresh`)."""
    if (resume or start_over) and not out:
        raise UsageError("--resume and --start-over act on a run written with --out: give the same --out (and --name)")
    if resume and start_over:
        raise UsageError("--resume continues the journal, --start-over discards it: give one")
    if not out:
        return None, None
    path = path_for(out, name)
    lock = hold(path)
    if not resume:
        check_fresh(path, start_over)
    return path, lock


def check_fresh(path: Path, start_over: bool) -> None:
    """Before a run without --resume: ValueError if ``path`` holds finished rounds and ``start_over`` is
    false (a forgotten --resume would otherwise destroy them)."""
    finished = sum(1 for line in read_lines(path) if isinstance(line, dict) and line.get("kind") == "round")
    if finished and not start_over:
        raise UsageError(f"{path} holds {finished} finished round(s) of an interrupted run: --resume continues "
                         "it, --start-over discards it")


def run_key(opts: Any, threads: int) -> dict[str, Any]:
    """What must be equal for two processes to be parts of one run (``opts``: RunOptions)."""
    return {
        "workload": opts.workload.to_dict(),
        "rows": [r.name for r in opts.rows],
        "rounds": opts.rounds,
        "warmup": opts.warmup,
        "seed": opts.seed,
        "threads": threads,
        "weights": opts.weights,
        "coco_root": opts.coco_root,
        "coco_split": opts.coco_split,
        "overrides": {k: repr(v) for k, v in sorted(opts.overrides.items())},
        "time_limit": opts.time_limit,
    }


@dataclass
class RowRound:
    """One row's measurement in one round (``seconds`` None: the row did not complete a call)."""

    status: str
    seconds: float | None = None
    detail: str = ""
    loss: float | None = None
    parity: list[dict[str, Any]] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)  # what the call changed


@dataclass
class Journal:
    """The rounds read back from a file: ``rounds[k][row name]``, and the machine state per round."""

    key: dict[str, Any]
    rounds: list[dict[str, RowRound]] = field(default_factory=list)
    machine: list[dict[str, float]] = field(default_factory=list)


class Writer:
    """Appends whole lines and syncs each to disk; the file is created with its ``start`` line."""

    def __init__(self, path: Path, key: dict[str, Any], fresh: bool) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if fresh:
            path.write_text("")
            self._append({"kind": "start", "key": key})
        else:
            cut_torn_tail(path)

    def _append(self, line: dict[str, Any]) -> None:
        text = json.dumps(line, default=_plain) + "\n"
        with self.path.open("a") as f:
            if line.get("round") is not None and os.environ.get(TEAR_ENV) == str(line["round"]):
                f.write(text[: len(text) // 2])  # the kill tests' fault: a crash in the middle of a line
                f.flush()
                os.fsync(f.fileno())
                os.kill(os.getpid(), signal.SIGKILL)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    def round(self, index: int, rows: dict[str, RowRound], machine: dict[str, float]) -> None:
        self._append({"kind": "round", "round": index, "machine": machine,
                      "rows": {name: vars(r) for name, r in rows.items()}})

    def remove(self) -> None:
        """The finished run file holds everything: the journal would only invite a stale ``--resume``."""
        self.path.unlink(missing_ok=True)


def cut_torn_tail(path: Path) -> None:
    """Drop a last line that a crash left without its newline, so the next line starts on its own."""
    with path.open("rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def _plain(x: Any) -> Any:
    return float(x) if hasattr(x, "__float__") else str(x)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every whole JSON line of an append-only file ([] when it does not exist), up to the first line a
    crash tore: the journal's, and the resumable studies' under ``bench/``."""
    lines: list[dict[str, Any]] = []
    for number, text in enumerate(path.read_text().splitlines() if path.is_file() else [], 1):
        if not text.strip():
            continue
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            break  # a line torn by a crash: everything before it is whole
        except RecursionError:  # no crash writes this: the file was made to break its reader
            raise UsageError(f"{path} line {number}: JSON nested too deeply to read") from None
    return lines


def read(path: Path, key: dict[str, Any]) -> Journal:
    """The journal at ``path``; ValueError if it is missing, unreadable, or of another run than ``key``."""
    if not path.is_file() or path.stat().st_size == 0:  # empty: created by the lock of a run that measured nothing
        raise UsageError(f"--resume: no journal {path} (it is written by a run with the same --out and --name)")
    lines = read_lines(path)
    if not lines or not isinstance(lines[0], dict) or lines[0].get("kind") != "start" \
            or not isinstance(lines[0].get("key"), dict):
        raise UsageError(f"--resume: {path} is not a run journal")
    theirs, key = lines[0]["key"], json.loads(json.dumps(key, default=_plain))  # tuples as JSON lists
    differ = sorted(k for k in {*theirs, *key} if theirs.get(k) != key.get(k))
    if differ:
        raise UsageError(f"--resume: {path} is from a different run ({', '.join(differ)} differ); "
                         "give the same options as the interrupted run")
    journal = Journal(theirs)
    for number, line in enumerate(lines[1:], start=2):
        if isinstance(line, dict) and line.get("kind") == "round" and line.get("round") == len(journal.rounds):
            rows, machine = _round(line), line.get("machine", {})
            if rows is None or not isinstance(machine, dict):
                raise UsageError(f"--resume: {path} line {number} is not a round of this harness")
            wrong = [n for n, r in rows.items() if r.seconds is not None and not (
                isinstance(r.seconds, (int, float)) and 0 <= r.seconds < float("inf"))]
            if wrong:
                raise UsageError(f"--resume: {path} line {number}: seconds of {', '.join(wrong)} are not a time "
                                 "(finite, >= 0)")
            journal.rounds.append(rows)
            journal.machine.append(machine)
    return journal


def _round(line: dict[str, Any]) -> dict[str, RowRound] | None:
    """A round line's rows, or None when they do not have RowRound's fields and types."""
    rows = line.get("rows")
    if not isinstance(rows, dict) or not all(isinstance(r, dict) for r in rows.values()):
        return None
    try:
        out = {str(name): RowRound(**r) for name, r in rows.items()}
    except TypeError:
        return None
    ok = all(isinstance(r.status, str) and isinstance(r.detail, str) and isinstance(r.parity, list)
             and isinstance(r.counters, dict) and (r.loss is None or isinstance(r.loss, (int, float)))
             for r in out.values())
    return out if ok else None
