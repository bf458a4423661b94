"""Change points of per-commit series: where a metric's level moved, and by how much.

The method is Apache Otava's (the Hunter paper, ICPE 2023: E-Divisive splits over sliding windows,
then a merge step that keeps a change point only while a two-sided Student's t-test between its
neighbouring segments stays below ``max_pvalue``). It is deterministic, unlike the permutation form
of E-Divisive, so a history gives the same answer every time. Otava runs in an environment of its
own (:mod:`mrcnn_bench.changes.otava_bridge`; ``make otava-env``), found at ``$MRCNN_OTAVA_PYTHON`` or
``.venv-otava/bin/python`` in the repository.

The settings (:data:`SETTINGS`) are Otava's published defaults, fixed before any measured history or
injected step was run through them; the error rates they give are measured, not tuned for.

Series are oldest first, lower is better, so a rise is a regression whatever the values' sign. For
each change point the figures are the means of the segments between adjacent change points:
``before`` ends at the point, ``after`` starts there. Each series is sent to Otava divided by a power
of two near its largest magnitude (exact in floating point; the method is scale-free), so values
near the ends of the float range neither overflow nor hide a step.

An exact series (``exact``: a count with no noise, such as the work counters) is not tested: any
change between consecutive commits is a step, with no p-value.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from mrcnn_bench.base.errors import UsageError

REPO = Path(__file__).resolve().parents[3]
PYTHON_ENV = "MRCNN_OTAVA_PYTHON"  # the interpreter of the environment that has apache-otava
DEFAULT_PYTHON = REPO / ".venv-otava" / "bin" / "python"
BRIDGE = Path(__file__).with_name("otava_bridge.py")
# Otava's command-line defaults (otava.analysis.compute_change_points).
SETTINGS = {"window": 50, "max_pvalue": 0.001, "min_magnitude": 0.0}
# Two points on each side of a change, so that each segment has a spread for the t-test.
MIN_POINTS = 4


@dataclass(frozen=True)
class ChangePoint:
    """One change point of one metric's series: the JSON contract of ``mrcnn-bench steps --json``."""

    metric: str
    commit: str  # the commit of the first point of the new level, as the input named it
    index: int  # that point's 0-based position in the metric's series
    before: float  # mean of the segment that ends here (from the previous change point, or the start)
    after: float  # mean of the segment that starts here (to the next change point, or the end)
    change_pct: float | None  # 100 (after - before) / |before|: its sign is the direction's; None when before is 0
    p_value: float | None  # Otava's two-sided t-test between the two segments; None for an exact series
    direction: str  # "regression" when the level rose (lower is better), else "improvement"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def otava_python() -> Path:
    """The interpreter that runs Otava; ValueError (exit 2) naming how to make it when there is none."""
    python = Path(os.environ.get(PYTHON_ENV) or DEFAULT_PYTHON)
    if not python.exists():
        raise UsageError(f"no Otava environment at {python}: run `make otava-env` (or set ${PYTHON_ENV})")
    return python


def _detect(series: Mapping[str, Sequence[float]]) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(index, p-value)] from Otava, for series that vary at all."""
    request = json.dumps({"series": {m: list(map(float, v)) for m, v in series.items()}, **SETTINGS})
    done = subprocess.run([str(otava_python()), str(BRIDGE)], input=request, capture_output=True, text=True,
                          check=False, timeout=600)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"Otava failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    return {metric: [(int(i), float(p)) for i, p in points] for metric, points in json.loads(done.stdout).items()}


def find(
    series: Mapping[str, tuple[Sequence[str], Sequence[float]]], exact: Collection[str] = ()
) -> list[ChangePoint]:
    """The change points of each metric's (commits, values), oldest first; sorted by the metrics'
    order in ``series``, then by index.

    ValueError when a series has fewer than :data:`MIN_POINTS` points. A series whose values are all
    equal has no change point and is not sent to Otava (its t-test would have no spread). The
    metrics named in ``exact`` are not sent either: each change from one commit to the next is a
    change point of theirs, with ``p_value`` None.
    """
    short = {m: len(v) for m, (_, v) in series.items() if len(v) < MIN_POINTS}
    if short:
        listed = ", ".join(f"{m!r} ({n})" for m, n in short.items())
        raise UsageError(f"the change-point method needs at least {MIN_POINTS} points per metric; "
                         f"too few in {listed}")
    scale = {m: _scale(v) for m, (_, v) in series.items()}
    scaled = {m: [x / scale[m] for x in v] for m, (_, v) in series.items()}
    varying = {m: v for m, v in scaled.items() if max(v) != min(v) and m not in exact}
    found: dict[str, list[tuple[int, float | None]]] = {**(_detect(varying) if varying else {})}
    found.update({m: exact_steps(v) for m, (_, v) in series.items() if m in exact})
    out = []
    for metric, (commits, _) in series.items():
        values = scaled[metric]
        points = [(i, p) for i, p in sorted(found.get(metric, [])) if p is None or math.isfinite(p)]
        bounds = [0, *(i for i, _ in points), len(values)]
        for k, (index, p_value) in enumerate(points):
            before = statistics.fmean(values[bounds[k]:bounds[k + 1]])
            after = statistics.fmean(values[bounds[k + 1]:bounds[k + 2]])
            change = 100 * (after - before) / abs(before) if before else None
            out.append(ChangePoint(metric, commits[index], index, before * scale[metric], after * scale[metric],
                                   change, p_value, "regression" if after > before else "improvement"))
    return out


def _scale(values: Sequence[float]) -> float:
    """A power of two near the largest magnitude of ``values`` (1 for all zeros): dividing by it is exact
    and leaves every value within [-2, 2] (one binade below the largest, which 1.8e308 would overflow)."""
    top = max((abs(float(x)) for x in values), default=0.0)
    return math.ldexp(1.0, math.frexp(top)[1] - 1) if top and math.isfinite(top) else 1.0



def exact_steps(values: Sequence[float]) -> list[tuple[int, float | None]]:
    """(index, None) for each value of an exact series that differs from the one before it."""
    return [(i, None) for i in range(1, len(values)) if values[i] != values[i - 1]]
