"""The levels of a series on either side of a change point: each its mean with a 95% Student's t
interval over the commits it spans, as the regression report states them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as scipy_stats

from mrcnn_bench.changes.changepoints import ChangePoint

__all__ = ["Level", "level", "levels"]


@dataclass(frozen=True)
class Level:
    """One level of a series: its mean and 95% interval over ``n`` commits (no interval for one)."""

    mean: float
    low: float
    high: float
    n: int

    def text(self, digits: int = 4) -> str:
        if self.n < 2:
            return f"{self.mean:.{digits}g} (1 commit, no interval)"
        return f"{self.mean:.{digits}g} (95% CI {self.low:.{digits}g} to {self.high:.{digits}g}, {self.n} commits)"


def level(values: Sequence[float]) -> Level:
    """Mean of ``values`` and its 95% t interval."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return Level(mean, math.nan, math.nan, n)
    half = float(scipy_stats.t.ppf(0.975, n - 1)) * statistics.stdev(values) / math.sqrt(n)
    return Level(mean, mean - half, mean + half, n)


def levels(points: Sequence[ChangePoint], values: Sequence[float], point: ChangePoint) -> tuple[Level, Level]:
    """The levels on either side of ``point``: between its neighbours among ``points`` (one metric's)."""
    indices = sorted(p.index for p in points)
    k = indices.index(point.index)
    start = indices[k - 1] if k > 0 else 0
    end = indices[k + 1] if k + 1 < len(indices) else len(values)
    return level(values[start:point.index]), level(values[point.index:end])
