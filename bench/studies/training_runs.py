"""Training runs of a study, a few at a time: the pool the accuracy studies share.

Each job is a command (a ``mrcnn train`` in a process of its own) with a log file; the pool keeps at
most ``parallel`` running, starting the next as one ends, and stops starting new ones after the
first that its caller's ``ended`` callback rejects (a failed run: its log says why). Resuming is the
caller's: it passes only the runs not finished yet.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

POLL_S = 5.0  # how often the pool looks for ended runs (training runs take minutes)


@dataclass(frozen=True)
class Job:
    label: str  # what the progress lines call it
    argv: tuple[str, ...]
    log: Path  # stdout and stderr of the run


def run_jobs(jobs: Sequence[Job], parallel: int, ended: Callable[[Job, int], bool]) -> int:
    """Run ``jobs`` at most ``parallel`` at a time; ``ended(job, exit code)`` says whether to go on.

    Returns 0 when every job ended accepted, 1 at the first rejected one (runs still going then are
    left to finish; their folders are the caller's to clear on the next start).
    """
    todo, running = list(jobs), []
    while todo or running:
        while todo and len(running) < parallel:
            job = todo.pop(0)
            with job.log.open("w") as log:  # the child keeps its own descriptor
                running.append((job, subprocess.Popen(list(job.argv), stdout=log, stderr=subprocess.STDOUT)))
            print(f"{job.label}: started", flush=True)
        time.sleep(POLL_S)
        for job, proc in list(running):
            if proc.poll() is None:
                continue
            running.remove((job, proc))
            if not ended(job, proc.returncode):
                return 1
    return 0


def parse_seeds(text: str) -> list[int]:
    """``0-9`` or ``0,3,5`` (or both: ``0-4,7``) -> the seeds, in order (an argparse type)."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            seeds.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are N, N-M or a comma list of them, not {text!r}") from None
    if not seeds or min(seeds) < 0 or max(seeds) >= 2**32:
        raise argparse.ArgumentTypeError(f"seeds must lie in 0..2^32-1: {text!r}")
    return seeds
