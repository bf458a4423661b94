"""The latency gate's decision rule: is B slower than A beyond a threshold, with significance?

Samples come from one run that times A and B interleaved (A B, B A, A B, ...), one call of each per
round, so round ``i`` gives the pair ``(a[i], b[i])`` taken moments apart. Two tests are computed:

* **paired** (the gate's rule): the per-round ratios ``b[i] / a[i]``; their median is the estimate,
  and a one-sided Wilcoxon signed-rank test on ``log(b[i] / a[i])`` gives the p-value. Pairing
  cancels the machine's drift, which moves both calls of a round together.
* **unpaired** (reported for comparison): the ratio of medians ``median(b) / median(a)`` and a
  one-sided Mann-Whitney U test of B against A. It ignores the pairing, so drift inflates it.

Either way, a regression is flagged when the test is significant (``p < alpha``) *and* the
estimated slowdown exceeds ``threshold``: significance alone would flag real but negligible
differences, the threshold alone would flag noise. ``bench/error_rates.py`` measured both rules on
the same timings (``results/latency_gate/``: 20 A/A and 20 A/B trials, a 10.9% injected slowdown,
0.39 s calls, load average ~9 on 2 cores): no false alarm for either; detections 90% at 15 rounds
and 100% at 20 for the paired rule, 85% and 95% for the unpaired one. Hence the paired rule, with
20 rounds or more. Below 7 rounds the paired test cannot reach ``alpha = 0.01`` at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

RULES = ("paired", "unpaired")


@dataclass(frozen=True)
class LatencyVerdict:
    """The comparison of B against A. Ratios are B / A: above 1 means B is slower."""

    rule: str  # the rule that decides ``regression``: "paired" (Wilcoxon) or "unpaired" (Mann-Whitney)
    rounds: int  # samples per side
    median_a: float
    median_b: float
    ratio: float  # median(b) / median(a)
    paired_ratio: float  # median over rounds of b[i] / a[i]
    ci_low: float  # 95% bootstrap interval of the decision rule's ratio
    ci_high: float
    p_wilcoxon: float  # one-sided, paired: B slower than A
    p_mannwhitney: float  # one-sided, unpaired: B slower than A
    threshold: float
    alpha: float
    regression: bool  # by ``rule``

    @property
    def estimate(self) -> float:
        """The ratio the decision rule uses."""
        return self.paired_ratio if self.rule == "paired" else self.ratio

    def regression_by(self, rule: str) -> bool:
        """The verdict ``rule`` would give on the same samples (to compare the two rules)."""
        if rule == "paired":
            return self.p_wilcoxon < self.alpha and self.paired_ratio > 1.0 + self.threshold
        if rule == "unpaired":
            return self.p_mannwhitney < self.alpha and self.ratio > 1.0 + self.threshold
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")


def min_p_value(rule: str, rounds: int) -> float:
    """Smallest one-sided p-value ``rule``'s exact test can give with ``rounds`` samples per side."""
    if rule == "paired":
        return 0.5**rounds  # every round has B slower
    if rule == "unpaired":
        return 1.0 / math.comb(2 * rounds, rounds)  # every B slower than every A
    raise ValueError(f"rule must be one of {RULES}, got {rule!r}")


def _check(name: str, values: Sequence[float]) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"{name}: expected a non-empty sequence of timings, got shape {list(x.shape)}")
    if not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise ValueError(f"{name}: timings must be finite and positive, got min {x.min()!r}")
    return x


def _bootstrap_ci(a: np.ndarray, b: np.ndarray, paired: bool, seed: int = 0, n: int = 2000) -> tuple[float, float]:
    """95% percentile bootstrap interval of the paired ratio (rounds resampled) or of the ratio of medians."""
    rng = np.random.default_rng(seed)
    if paired:
        idx = rng.integers(0, a.size, size=(n, a.size))
        values = np.exp(np.median(np.log(b[idx] / a[idx]), axis=1))
    else:
        ia = rng.integers(0, a.size, size=(n, a.size))
        ib = rng.integers(0, b.size, size=(n, b.size))
        values = np.median(b[ib], axis=1) / np.median(a[ia], axis=1)
    low, high = np.quantile(values, [0.025, 0.975])
    return float(low), float(high)


def compare_latency(
    a: Sequence[float],
    b: Sequence[float],
    threshold: float = 0.05,
    alpha: float = 0.01,
    rule: str = "paired",
) -> LatencyVerdict:
    """Compare interleaved timings ``b`` (candidate) against ``a`` (baseline), seconds per call.

    ``a[i]`` and ``b[i]`` must come from the same round. ``regression`` is True when ``rule``'s
    one-sided test gives ``p < alpha`` and its ratio exceeds ``1 + threshold``. Raises
    ``ValueError`` on empty, mismatched or non-positive samples, and when there are too few rounds
    for the test ever to reach ``alpha`` (a gate that could never fire).
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not threshold >= 0.0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    xa, xb = _check("a", a), _check("b", b)
    if xa.size != xb.size:
        raise ValueError(
            f"a and b must have one timing per round each (interleaved A B rounds), got {xa.size} and {xb.size}"
        )
    if min_p_value(rule, xa.size) >= alpha:
        raise ValueError(
            f"{xa.size} rounds are too few: the {rule} test cannot reach p < {alpha} "
            f"(smallest possible p is {min_p_value(rule, xa.size):.3g}); time more rounds"
        )
    log_ratio = np.log(xb / xa)
    # Identical pairs give no evidence either way (and scipy would divide by zero).
    nonzero = bool(np.any(log_ratio != 0))
    p_wilcoxon = float(stats.wilcoxon(log_ratio, alternative="greater").pvalue) if nonzero else 1.0
    p_mannwhitney = float(stats.mannwhitneyu(xb, xa, alternative="greater").pvalue)
    median_a, median_b = float(np.median(xa)), float(np.median(xb))
    paired_ratio = float(np.exp(np.median(log_ratio)))
    ratio = median_b / median_a
    ci_low, ci_high = _bootstrap_ci(xa, xb, paired=rule == "paired")
    p, estimate = (p_wilcoxon, paired_ratio) if rule == "paired" else (p_mannwhitney, ratio)
    return LatencyVerdict(
        rule=rule,
        rounds=int(xa.size),
        median_a=median_a,
        median_b=median_b,
        ratio=ratio,
        paired_ratio=paired_ratio,
        ci_low=ci_low,
        ci_high=ci_high,
        p_wilcoxon=p_wilcoxon,
        p_mannwhitney=p_mannwhitney,
        threshold=threshold,
        alpha=alpha,
        regression=bool(p < alpha and estimate > 1.0 + threshold),
    )
