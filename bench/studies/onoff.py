"""Settings of one lever timed against each other round by round in one process, resumably.

The method of the one-lever studies (``bench/studies/padding_parity/padding_parity.py cost``,
``bench/studies/cpu_levers/levers.py``): every
round calls each variant once, the order reversed every other round (A B, then B A), so that a
drift of the machine's speed hits both alike; each timed call is appended at once to a JSON-lines
file as ``{"key": "<prefix><round>:<variant>", "round", "variant", "seconds", ...}``, and a rerun
skips the keys already there, so an interrupted run resumes in a new process (each round still
pairs its variants within one process). The figure is the median over rounds of the per-round
ratio, with its 95% bootstrap interval (:func:`mrcnn_bench.gates.stats.paired_ratio_ci`).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mrcnn_bench.base import timing
from mrcnn_bench.gates.stats import paired_ratio_ci
from mrcnn_bench.running.journal import read_lines


def done_keys(path: Path, key: str = "key") -> set:
    """The values of ``key`` already written to ``path``: what a resumed run skips."""
    return {row[key] for row in read_lines(path)}


def run_rounds(
    variants: Mapping[str, Callable[[], Any]],
    rounds: int,
    out: Path,
    prefix: str = "",
    extra: Callable[[], dict[str, Any]] | None = None,
) -> int:
    """Time ``rounds`` interleaved rounds of ``variants`` (name -> call), appending each call to ``out``.

    ``extra`` adds fields to every line, read right after the call (e.g. the machine's state). Returns
    the number of calls timed now (0 when every round was already there).
    """
    done = done_keys(out)
    timed = 0
    # A B, then B A: drifts in load hit both alike.
    calls = timing.timed_rounds(variants, "alternate", rounds, skip=lambda r, name: f"{prefix}{r}:{name}" in done)
    for r, name, seconds, _ in calls:
        row = dict(key=f"{prefix}{r}:{name}", round=r, variant=name, seconds=seconds, **(extra() if extra else {}))
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        timed += 1
    return timed


def seconds_by_round(rows: list[dict[str, Any]], variant: str) -> dict[int, float]:
    """round -> seconds of ``variant``'s call in that round."""
    return {row["round"]: row["seconds"] for row in rows if row["variant"] == variant}


def paired(rows: list[dict[str, Any]], off: str, on: str) -> dict[str, Any]:
    """On / off over the rounds both ran: median per-round ratio, its 95% interval, rounds, medians."""
    a, b = seconds_by_round(rows, off), seconds_by_round(rows, on)
    both = sorted(set(a) & set(b))
    if not both:
        return {"median_ratio": None, "ci95": None, "rounds": 0}
    ratio, low, high = paired_ratio_ci([a[r] for r in both], [b[r] for r in both])
    return {
        "median_ratio": ratio,
        "ci95": [low, high],
        "rounds": len(both),
        "median_s_off": statistics.median(a[r] for r in both),
        "median_s_on": statistics.median(b[r] for r in both),
    }
