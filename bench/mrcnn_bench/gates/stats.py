"""The latency gate's decision rule: is B slower than A by more than a threshold?

Samples come from one run that times A and B interleaved (A B, B A, A B, ...), one call of each per
round, so round ``i`` gives the pair ``(a[i], b[i])`` taken moments apart. (``compare`` of two
stored runs passes each row's per-round ratio to its run's reference row instead of raw times.)

**The rule** (``rule="paired"``, the gate's): with ``r[i] = b[i] / a[i]``, test the hypothesis
users mean, "B is slower by more than ``threshold``": a one-sided Wilcoxon signed-rank test
(alternative *greater*) on ``log r[i] - log(1 + threshold)``. B is flagged when ``p < alpha``;
across the cases of one comparison the p-values are first Holm-corrected (:func:`holm`), which
``mrcnn_bench.gates.ab`` does. The estimate is the median of ``r``, reported with its 95% bootstrap
interval (rounds resampled) and the number of rounds ``n``. A row with fewer than
:data:`MIN_SAMPLES` samples gets no estimate at all, and below 7 rounds the test cannot reach
``alpha = 0.01`` (:func:`min_p_value`), so no verdict either.

``rule="unpaired"`` (reported for comparison) ignores the pairing: the ratio of medians, and a
one-sided Mann-Whitney U test of ``log b - log(1 + threshold)`` against ``log a``; drift between
rounds inflates its spread. ``p_wilcoxon`` and ``p_mannwhitney`` keep the tests against "no change"
for information: they decide nothing.

``rule="pairs"`` (:func:`compare_pairs`, what a live ``compare`` uses by default) takes K pairs of
fresh processes, each pair timing A and B interleaved: the unit is the pair, not the round. Each
pair's mean log ratio ``d[k]`` carries the two processes' levels, so a one-sided t-test of the
pairs' mean against ``log(1 + threshold)`` has the between-process component in its interval by
construction; which process started first is a covariate when both orders ran.

``rule="stored"`` (:func:`compare_stored`, what ``compare A.json B.json`` uses) compares two separate
runs, whose rounds are not paired and whose levels differ from process to process: a z-test of the
difference of the runs' mean log ratios that allows for the between-run spread measured by
``bench/studies/stored_compare_false_alarms/stored_compare_aa.py`` (``results/stored_compare_aa/``).

The rule's error rates are measured through the gate's own code path by
``bench/studies/gate_error_rates/gate_error_rates.py`` (``results/latency_gate_live/``), which is where the
default number of
rounds comes from; ``bench/studies/gate_error_rates/error_rates.py`` measured the previous rule (p < alpha against "no
change", and a ratio above ``1 + threshold``) at ``results/latency_gate/``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

from mrcnn_bench.base import defaults
from mrcnn_bench.base.errors import UsageError

RULES = ("paired", "unpaired", "stored", "pairs")
MIN_PAIRS = defaults.MIN_PAIRS  # fewer process pairs than this: no test across pairs
MIN_SAMPLES = 3  # fewer timed samples than this: no median, ratio or verdict is shown
_Z95 = float(stats.norm.ppf(0.975))


@dataclass(frozen=True)
class LatencyVerdict:
    """The comparison of B against A. Ratios are B / A: above 1 means B is slower."""

    rule: str  # what decides ``regression``: "paired" (Wilcoxon), "unpaired" (Mann-Whitney), "stored" (z),
    # "pairs" (t over process pairs)
    rounds: int  # samples per side (n); "pairs": rounds per process, the fewest of any pair
    median_a: float
    median_b: float
    ratio: float  # median(b) / median(a)
    paired_ratio: float  # median over rounds of b[i] / a[i]
    ci_low: float  # 95% bootstrap interval of the decision rule's ratio
    ci_high: float
    p_wilcoxon: float  # one-sided, paired, against "no change" (information only)
    p_mannwhitney: float  # one-sided, unpaired, against "no change" (information only)
    p_beyond: float  # one-sided Wilcoxon: B slower than A by more than ``threshold`` (paired rule's p)
    p_beyond_unpaired: float  # one-sided Mann-Whitney, the same hypothesis (unpaired rule's p)
    threshold: float
    alpha: float
    regression: bool  # by ``rule``, before any correction across cases
    between_run_sd: float = math.nan  # "stored": the sd of log(B/A) between runs that the test allows for
    pairs: int = 0  # "pairs": process pairs the test rests on (its unit)
    process_sd: float = math.nan  # "pairs": sd of a pair's log(B/A) beyond its rounds' noise (process levels)
    round_sd: float = math.nan  # "pairs": sd of one round's log(B/A) within a process, pooled over pairs
    order_effect: float = math.nan  # "pairs": d with A's process started first minus with B's (log), when both ran

    @property
    def estimate(self) -> float:
        """The ratio the decision rule uses."""
        return self.paired_ratio if self.rule == "paired" else self.ratio  # "pairs": exp of the pairs' mean

    @property
    def p_value(self) -> float:
        """The decision rule's p-value ("slower by more than ``threshold``"), uncorrected."""
        return self.p_beyond_unpaired if self.rule == "unpaired" else self.p_beyond

    def regression_by(self, rule: str) -> bool:
        """The verdict ``rule`` would give on the same samples (to compare the rules)."""
        own = ("stored", "pairs")  # rules whose p-value only their own verdict holds
        if (rule in own or self.rule in own) and rule != self.rule:
            raise ValueError(f"a {self.rule} verdict holds no p-value of the {rule} rule")
        if rule in ("paired", "stored", "pairs"):
            return self.p_beyond < self.alpha
        if rule == "unpaired":
            return self.p_beyond_unpaired < self.alpha
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order (reject where adjusted p < alpha).

    Sorted ascending, the k-th smallest (k = 0, 1, ...) of m is multiplied by ``m - k``; a running
    maximum keeps the adjusted values monotone; each is capped at 1.
    """
    m = len(p_values)
    adjusted = [math.nan] * m
    running = 0.0
    for k, i in enumerate(sorted(range(m), key=lambda j: p_values[j])):
        running = max(running, min(1.0, (m - k) * p_values[i]))
        adjusted[i] = running
    return adjusted


def min_p_value(rule: str, rounds: int) -> float:
    """Smallest one-sided p-value ``rule``'s exact test can give with ``rounds`` samples per side
    (the stored rule's z-test and the pairs' t-test have no floor: 0)."""
    if rule in ("stored", "pairs"):
        return 0.0
    if rule == "paired":
        return 0.5**rounds  # every round has B slower
    if rule == "unpaired":
        return 1.0 / math.comb(2 * rounds, rounds)  # every B slower than every A
    raise ValueError(f"rule must be one of {RULES}, got {rule!r}")


def _check(name: str, values: Sequence[float]) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise UsageError(f"{name}: expected a non-empty sequence of timings, got shape {list(x.shape)}")
    if not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise UsageError(f"{name}: timings must be finite and positive, got min {x.min()!r}")
    return x


def _check_parameters(threshold: float, alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise UsageError(f"alpha must be in (0, 1), got {alpha}")
    if not threshold >= 0.0:
        raise UsageError(f"threshold must be >= 0, got {threshold}")


def _check_pair(a: Sequence[float], b: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    xa, xb = _check("a", a), _check("b", b)
    if xa.size != xb.size:
        raise UsageError(
            f"a and b must have one timing per round each (interleaved A B rounds), got {xa.size} and {xb.size}"
        )
    return xa, xb


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


def paired_ratio_ci(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """(median of b[i] / a[i], 95% bootstrap interval): the estimate alone, for too few rounds to test."""
    xa, xb = _check_pair(a, b)
    low, high = _bootstrap_ci(xa, xb, paired=True)
    return float(np.exp(np.median(np.log(xb / xa)))), low, high


def mean_ratio_ci(log_ratios: Sequence[float]) -> tuple[float, float, float]:
    """(ratio, low, high): the mean of per-trial log ratios as a ratio, with its two-sided 95%
    t-interval across the trials (the trials, not their rounds, are the independent units). Needs
    two or more trials; identical trials give a zero-width interval."""
    x = np.asarray(log_ratios, dtype=float)
    if x.size < 2:
        raise ValueError(f"a 95% interval across trials needs 2 or more trials, got {x.size}")
    sem = float(stats.sem(x))
    low, high = stats.t.interval(0.95, x.size - 1, loc=x.mean(), scale=sem) if sem > 0 else (x.mean(), x.mean())
    return float(np.exp(x.mean())), float(np.exp(low)), float(np.exp(high))


def _wilcoxon_greater(x: np.ndarray) -> float:
    """One-sided Wilcoxon signed-rank p of ``x`` > 0; 1.0 when every value is 0 (no evidence either way)."""
    return float(stats.wilcoxon(x, alternative="greater").pvalue) if np.any(x != 0) else 1.0


def compare_latency(
    a: Sequence[float],
    b: Sequence[float],
    threshold: float = defaults.THRESHOLD,
    alpha: float = 0.01,
    rule: str = "paired",
) -> LatencyVerdict:
    """Compare interleaved timings ``b`` (candidate) against ``a`` (baseline), seconds per call.

    ``a[i]`` and ``b[i]`` must come from the same round. ``regression`` is True when ``rule``'s
    one-sided test of "B slower than A by more than ``threshold``" gives ``p < alpha`` (see the
    module's docstring; correct across cases with :func:`holm`). Raises ``ValueError`` on empty,
    mismatched or non-positive samples, and when there are too few rounds for the test ever to
    reach ``alpha`` (a gate that could never fire).
    """
    if rule not in ("paired", "unpaired"):  # the others take other samples: compare_stored, compare_pairs
        raise ValueError(f"rule must be 'paired' or 'unpaired', got {rule!r}")
    _check_parameters(threshold, alpha)
    xa, xb = _check_pair(a, b)
    if min_p_value(rule, xa.size) >= alpha:
        raise UsageError(
            f"{xa.size} rounds are too few: the {rule} test cannot reach p < {alpha} "
            f"(smallest possible p is {min_p_value(rule, xa.size):.3g}); time more rounds"
        )
    log_ratio, shift = np.log(xb / xa), math.log1p(threshold)
    p_beyond = _wilcoxon_greater(log_ratio - shift)
    p_beyond_unpaired = float(stats.mannwhitneyu(np.log(xb) - shift, np.log(xa), alternative="greater").pvalue)
    median_a, median_b = float(np.median(xa)), float(np.median(xb))
    ci_low, ci_high = _bootstrap_ci(xa, xb, paired=rule == "paired")
    verdict = LatencyVerdict(
        rule=rule,
        rounds=int(xa.size),
        median_a=median_a,
        median_b=median_b,
        ratio=median_b / median_a,
        paired_ratio=float(np.exp(np.median(log_ratio))),
        ci_low=ci_low,
        ci_high=ci_high,
        p_wilcoxon=_wilcoxon_greater(log_ratio),
        p_mannwhitney=float(stats.mannwhitneyu(xb, xa, alternative="greater").pvalue),
        p_beyond=p_beyond,
        p_beyond_unpaired=p_beyond_unpaired,
        threshold=threshold,
        alpha=alpha,
        regression=False,
    )
    return replace(verdict, regression=verdict.regression_by(rule))


def compare_stored(
    a: Sequence[float],
    b: Sequence[float],
    between_run_sd: float = defaults.BETWEEN_RUN_SD,
    threshold: float = defaults.THRESHOLD,
    alpha: float = defaults.ALPHA,
) -> LatencyVerdict:
    """Compare two stored runs: ``a`` and ``b`` are each run's per-round times over its own reference row.

    Rounds of two separate runs are not paired, and each process settles at a level of its own that
    no number of rounds averages away (``results/stored_compare_aa/``). So the estimate is the
    difference of the runs' mean log ratios, ``d``, whose variance is each run's variance of the
    mean (its rounds' variance / n) plus ``between_run_sd**2``, the variance of ``d`` between two
    runs of the same code beyond that (measured by ``bench/studies/stored_compare_false_alarms/stored_compare_aa.py``).
    One-sided z-test
    of ``d > log(1 + threshold)``; the 95% interval is ``d`` +- 1.96 of the same sd, as ratios.
    """
    _check_parameters(threshold, alpha)
    if not between_run_sd >= 0.0:
        raise UsageError(f"between_run_sd must be >= 0, got {between_run_sd}")
    la, lb = np.log(_check("a", a)), np.log(_check("b", b))
    if min(la.size, lb.size) < 2:
        raise UsageError(f"each run needs 2 or more rounds for its variance, got {la.size} and {lb.size}")
    d = float(lb.mean() - la.mean())
    sd = math.sqrt(la.var(ddof=1) / la.size + lb.var(ddof=1) / lb.size + between_run_sd**2)
    shift = math.log1p(threshold)
    p_beyond = float(stats.norm.sf((d - shift) / sd)) if sd > 0 else (0.0 if d > shift else 1.0)
    median_a, median_b = float(np.exp(np.median(la))), float(np.exp(np.median(lb)))
    return LatencyVerdict(
        rule="stored", rounds=int(min(la.size, lb.size)), median_a=median_a, median_b=median_b,
        ratio=math.exp(d), paired_ratio=math.nan,
        ci_low=math.exp(d - _Z95 * sd), ci_high=math.exp(d + _Z95 * sd),
        p_wilcoxon=math.nan, p_mannwhitney=float(stats.mannwhitneyu(lb, la, alternative="greater").pvalue),
        p_beyond=p_beyond,
        p_beyond_unpaired=float(stats.mannwhitneyu(lb - shift, la, alternative="greater").pvalue),
        threshold=threshold, alpha=alpha, regression=p_beyond < alpha, between_run_sd=between_run_sd,
    )


def compare_pairs(
    a: Sequence[Sequence[float]],
    b: Sequence[Sequence[float]],
    a_first: Sequence[bool],
    threshold: float = defaults.PAIR_THRESHOLD,
    alpha: float = defaults.ALPHA,
) -> LatencyVerdict:
    """Compare K process pairs: ``a[k]`` and ``b[k]`` are pair k's interleaved timings (seconds per
    call, round i of each taken moments apart), ``a_first[k]`` whether A's process started first.

    ``d[k]`` is the mean over pair k's rounds of ``log(b/a)``. With two or more pairs of each start
    order, the estimate is the average of the two orders' mean ``d`` and its variance comes from
    the pooled spread within each order (K - 2 degrees of freedom), so an effect of which process
    started first cancels and does not widen the interval; otherwise the plain mean of ``d`` (K - 1).
    One-sided t-test of "B slower by more than ``threshold``"; the 95% interval is two-sided.
    ``process_sd`` and ``round_sd`` are the noise model this comparison itself measured.
    UsageError on fewer than :data:`MIN_PAIRS` pairs or a pair with fewer than 2 rounds.
    """
    _check_parameters(threshold, alpha)
    if not len(a) == len(b) == len(a_first):
        raise UsageError(f"one A, one B and one start order per pair, got {len(a)}, {len(b)} and {len(a_first)}")
    if len(a) < MIN_PAIRS:
        raise UsageError(f"{len(a)} process pair(s) are too few for a test across pairs: at least {MIN_PAIRS}")
    logs = [np.log(xb / xa) for xa, xb in (_check_pair(pa, pb) for pa, pb in zip(a, b, strict=True))]
    if min(x.size for x in logs) < 2:
        raise UsageError("each process pair needs 2 or more rounds for its spread")
    d = np.array([x.mean() for x in logs])
    first = np.asarray(a_first, dtype=bool)
    groups = [d[first], d[~first]]
    if min(g.size for g in groups) >= 2:
        mean = 0.5 * (groups[0].mean() + groups[1].mean())
        df = d.size - 2
        pooled = sum(((g - g.mean()) ** 2).sum() for g in groups) / df
        se = math.sqrt(pooled / 4 * sum(1 / g.size for g in groups))
        order_effect = float(groups[0].mean() - groups[1].mean())
    else:
        mean, df = float(d.mean()), d.size - 1
        pooled, se, order_effect = float(d.var(ddof=1)), float(d.std(ddof=1) / math.sqrt(d.size)), math.nan
    round_var = float(np.mean([x.var(ddof=1) for x in logs]))
    mean_rounds = float(np.mean([x.size for x in logs]))
    shift = math.log1p(threshold)
    if se > 0:
        p_beyond = float(stats.t.sf((mean - shift) / se, df))
        half = float(stats.t.ppf(0.975, df)) * se
    else:  # every pair read the same: no spread to test against
        p_beyond, half = (0.0 if mean > shift else 1.0), 0.0
    all_a, all_b = np.concatenate([np.asarray(x, float) for x in a]), np.concatenate([np.asarray(x, float) for x in b])
    return LatencyVerdict(
        rule="pairs", rounds=min(x.size for x in logs), median_a=float(np.median(all_a)),
        median_b=float(np.median(all_b)), ratio=math.exp(mean), paired_ratio=math.nan,
        ci_low=math.exp(mean - half), ci_high=math.exp(mean + half), p_wilcoxon=math.nan, p_mannwhitney=math.nan,
        p_beyond=p_beyond, p_beyond_unpaired=math.nan, threshold=threshold, alpha=alpha,
        regression=p_beyond < alpha, pairs=int(d.size),
        process_sd=math.sqrt(max(pooled - round_var / mean_rounds, 0.0)), round_sd=math.sqrt(round_var),
        order_effect=order_effect,
    )


def pair_power(process_sd: float, round_sd: float, pairs: int, rounds: int, slowdown: float,
               threshold: float = defaults.PAIR_THRESHOLD, alpha: float = defaults.ALPHA) -> float:
    """The chance that :func:`compare_pairs` flags a true ``slowdown`` (0.05: B 5% slower), under a
    noise model: ``process_sd`` between processes beyond their rounds, ``round_sd`` of one round's
    log ratio. Both start orders in equal numbers (K - 2 degrees of freedom), one test (no Holm);
    the power of the one-sided t-test from the noncentral t."""
    if pairs < MIN_PAIRS + 1 or rounds < 2:
        raise UsageError(f"{pairs} pairs of {rounds} rounds: the power needs {MIN_PAIRS + 1} pairs and 2 rounds")
    se = math.sqrt((process_sd**2 + round_sd**2 / rounds) / pairs)
    df = pairs - 2
    shift = (math.log1p(slowdown) - math.log1p(threshold)) / se
    return float(stats.nct.sf(stats.t.ppf(1 - alpha, df), df, shift))
