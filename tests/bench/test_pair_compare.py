"""The live compare's test across process pairs: the pair is the unit, so process levels are in the interval.

Simulated timings: each process draws a level (log-normal, sd ``process``), each round scatters
around it (sd ``rnd``). A statistic that treated rounds as the unit would see a pair's two levels as
a real difference and cry wolf; these tests fail if the pair statistic ignores that component.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mrcnn_bench.gates import stats


def _pairs(rng: np.random.Generator, k: int, rounds: int, process: float, rnd: float, slowdown: float = 0.0,
           order: float = 0.0) -> tuple[list[np.ndarray], list[np.ndarray], list[bool]]:
    """K pairs of interleaved timings; ``order``: log speed-up of the side whose process started second."""
    a, b, first = [], [], []
    for j in range(k):
        a_first = j % 2 == 0
        level_a, level_b = rng.normal(0, process, 2)
        shift = order if a_first else -order  # the process started second runs ``order`` faster
        a.append(0.2 * np.exp(level_a + rng.normal(0, rnd, rounds)))
        b.append(0.2 * (1 + slowdown) * np.exp(level_b - shift + rng.normal(0, rnd, rounds)))
        first.append(a_first)
    return a, b, first


def test_aa_false_alarms_stay_at_alpha_when_process_levels_dominate():
    """Levels 3% apart between processes, rounds 1%: a per-round test flags most A/A pairs; the pair test ~alpha."""
    rng = np.random.default_rng(0)
    trials, alpha = 400, 0.05
    pair_alarms = round_alarms = 0
    for _ in range(trials):
        a, b, first = _pairs(rng, k=8, rounds=20, process=0.03, rnd=0.01)
        pair_alarms += stats.compare_pairs(a, b, first, threshold=0.0, alpha=alpha).regression
        round_alarms += stats.compare_latency(np.concatenate(a), np.concatenate(b), threshold=0.0,
                                              alpha=alpha).regression
    assert round_alarms / trials > 0.3  # the blind spot the pairs exist to close
    # Binomial(400, 0.05): above 0.085 with probability below 0.1%.
    assert pair_alarms / trials < 0.085


def test_interval_width_follows_the_process_sd_not_the_rounds():
    rng = np.random.default_rng(1)
    wide = stats.compare_pairs(*_pairs(rng, 10, 20, process=0.04, rnd=0.01), threshold=0.0)
    narrow = stats.compare_pairs(*_pairs(rng, 10, 20, process=0.0, rnd=0.01), threshold=0.0)
    assert math.log(wide.ci_high / wide.ci_low) > 4 * math.log(narrow.ci_high / narrow.ci_low)
    assert wide.process_sd == pytest.approx(0.04 * math.sqrt(2), rel=0.5)  # a pair holds two levels
    assert narrow.round_sd == pytest.approx(0.01 * math.sqrt(2), rel=0.2)


def test_a_slowdown_beyond_the_process_spread_is_found_and_estimated():
    rng = np.random.default_rng(2)
    v = stats.compare_pairs(*_pairs(rng, 16, 20, process=0.014, rnd=0.08, slowdown=0.06), threshold=0.01,
                            alpha=0.01)
    assert v.regression and v.rule == "pairs" and v.pairs == 16 and v.rounds == 20
    assert v.ci_low < 1.06 < v.ci_high and v.ci_low > 1.01


def test_which_process_started_first_cancels_and_does_not_widen_the_interval():
    """A second-started process 4% faster: alternating the start order cancels it in the estimate,
    and the order covariate keeps it out of the spread."""
    rng = np.random.default_rng(4)
    a, b, first = _pairs(rng, 12, 20, process=0.01, rnd=0.01, order=0.04)
    v = stats.compare_pairs(a, b, first, threshold=0.0)
    assert v.ci_low < 1.0 < v.ci_high and not v.regression
    # A first: B second and 4% faster (d -0.04); B first: A faster (d +0.04).
    assert v.order_effect == pytest.approx(-0.08, abs=0.03)
    assert math.log(v.ci_high / v.ci_low) < 0.04
    # One start order only: no covariate to fit, the plain mean (the effect is then in the estimate).
    one = stats.compare_pairs(a[::2], b[::2], first[::2], threshold=0.0)
    assert math.isnan(one.order_effect) and one.estimate < 0.98


@pytest.mark.parametrize(("a", "b", "first", "match"), [
    ([[1.0, 1.0]] * 2, [[1.0, 1.0]] * 2, [True, False], "too few"),
    ([[1.0]] * 3, [[1.0]] * 3, [True, False, True], "2 or more rounds"),
    ([[1.0, 1.0]] * 3, [[1.0, 1.0]] * 3, [True], "one start order per pair"),
    ([[1.0, -1.0]] * 3, [[1.0, 1.0]] * 3, [True, False, True], "finite and positive"),
])
def test_bad_pairs_are_refused_in_one_line(a, b, first, match):
    with pytest.raises(stats.UsageError, match=match):
        stats.compare_pairs(a, b, first)


def test_identical_pairs_are_certain_either_way():
    same = [[0.2, 0.2]] * 4
    assert not stats.compare_pairs(same, same, [True, False] * 2, threshold=0.0).regression
    slower = [[0.25, 0.25]] * 4
    assert stats.compare_pairs(same, slower, [True, False] * 2, threshold=0.0).regression


def test_the_pair_verdict_holds_no_other_rules_p_value():
    v = stats.compare_pairs(*_pairs(np.random.default_rng(5), 4, 4, 0.01, 0.01))
    with pytest.raises(ValueError, match="pairs verdict"):
        v.regression_by("paired")
    with pytest.raises(ValueError, match="'paired' or 'unpaired'"):
        stats.compare_latency([1.0] * 8, [1.0] * 8, rule="pairs")
