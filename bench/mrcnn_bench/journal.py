"""A run's rounds as they finish: an append-only JSON-lines file that a crash cannot corrupt.

``mrcnn-bench run --out DIR`` writes ``DIR/<name>.rounds.jsonl``: first a ``start`` line with the
run's identity (:func:`run_key`: workload, rows, rounds, seed, threads, settings), then one
``round`` line per finished round with every row's measurement of it. A line is written whole and
flushed to disk before the next round starts, so a run killed at any moment (SIGKILL, a lost
machine) leaves every finished round readable; a torn last line is ignored on reading.

``--resume`` reads the file back (:func:`read`), refuses one written by a different run, and the
runner continues from the next round after setting up and warming up every row again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUFFIX = ".rounds.jsonl"


def path_for(out_dir: str | Path, name: str) -> Path:
    return Path(out_dir) / f"{name}{SUFFIX}"


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

    def _append(self, line: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(line, default=_plain) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def round(self, index: int, rows: dict[str, RowRound], machine: dict[str, float]) -> None:
        self._append({"kind": "round", "round": index, "machine": machine,
                      "rows": {name: vars(r) for name, r in rows.items()}})

    def remove(self) -> None:
        """The finished run file holds everything: the journal would only invite a stale ``--resume``."""
        self.path.unlink(missing_ok=True)


def _plain(x: Any) -> Any:
    return float(x) if hasattr(x, "__float__") else str(x)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every whole JSON line of an append-only file ([] when it does not exist), up to the first line a
    crash tore: the journal's, and the resumable studies' under ``bench/``."""
    lines: list[dict[str, Any]] = []
    for text in path.read_text().splitlines() if path.is_file() else []:
        if not text.strip():
            continue
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            break  # a line torn by a crash: everything before it is whole
    return lines


def read(path: Path, key: dict[str, Any]) -> Journal:
    """The journal at ``path``; ValueError if it is missing, unreadable, or of another run than ``key``."""
    if not path.is_file():
        raise ValueError(f"--resume: no journal {path} (it is written by a run with the same --out and --name)")
    lines = read_lines(path)
    if not lines or lines[0].get("kind") != "start":
        raise ValueError(f"--resume: {path} is not a run journal")
    theirs, key = lines[0]["key"], json.loads(json.dumps(key, default=_plain))  # tuples as JSON lists
    differ = sorted(k for k in {*theirs, *key} if theirs.get(k) != key.get(k))
    if differ:
        raise ValueError(f"--resume: {path} is from a different run ({', '.join(differ)} differ); "
                         "give the same options as the interrupted run")
    journal = Journal(theirs)
    for line in lines[1:]:
        if line.get("kind") == "round" and line.get("round") == len(journal.rounds):
            journal.rounds.append({name: RowRound(**r) for name, r in line["rows"].items()})
            journal.machine.append(line["machine"])
    return journal
