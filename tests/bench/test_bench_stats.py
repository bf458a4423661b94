"""The latency gate's decision rule (mrcnn_bench.gates.stats) and the slowdown it is measured with
(mrcnn_bench.running.slowdown; its extra FLOPs and unchanged outputs are tested in test_slowdown_hook.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from mrcnn.model import MaskRCNN
from mrcnn_bench.gates import stats
from mrcnn_bench.gates.stats import compare_latency, mean_ratio_ci, min_p_value
from mrcnn_bench.running.cases import CASES, Row, Variant
from mrcnn_bench.running.slowdown import inject_slowdown


def _interleaved(rounds: int, slowdown: float, seed: int, drift: float = 0.0, noise: float = 0.03):
    """Timings of A and B per round: a shared per-round drift (the machine) times independent noise."""
    rng = np.random.default_rng(seed)
    machine = 0.3 * np.exp(drift * rng.standard_normal(rounds))
    a = machine * np.exp(noise * rng.standard_normal(rounds))
    b = machine * (1 + slowdown) * np.exp(noise * rng.standard_normal(rounds))
    return a.tolist(), b.tolist()


@pytest.mark.parametrize("rule", ["paired", "unpaired"])
def test_clear_regression_is_flagged(rule):
    a, b = _interleaved(25, slowdown=0.20, seed=1)
    v = compare_latency(a, b, threshold=0.05, alpha=0.01, rule=rule)
    assert v.regression
    assert v.p_wilcoxon < 0.01 and v.p_mannwhitney < 0.01
    assert 1.15 < v.ratio < 1.25 and 1.15 < v.paired_ratio < 1.25
    assert v.ci_low < v.estimate < v.ci_high
    assert v.ci_low > 1.05


def test_pairing_sees_through_drift():
    """Drift of 15% between rounds hides a 10% slowdown from the unpaired test, not from the paired one."""
    verdicts = [compare_latency(*_interleaved(15, slowdown=0.10, seed=s, drift=0.15, noise=0.02)) for s in range(20)]
    assert all(v.regression and v.regression_by("paired") for v in verdicts)
    assert sum(v.regression_by("unpaired") for v in verdicts) <= 5
    a, b = _interleaved(15, slowdown=0.10, seed=0, drift=0.15, noise=0.02)
    assert compare_latency(a, b, rule="unpaired").regression == compare_latency(a, b).regression_by("unpaired")


@pytest.mark.parametrize("rule", ["paired", "unpaired"])
def test_same_distribution_is_not_flagged(rule):
    flagged = [compare_latency(*_interleaved(15, 0.0, seed, drift=0.1), rule=rule).regression for seed in range(50)]
    assert sum(flagged) <= 1
    a = [0.3] * 10
    v = compare_latency(a, a, rule=rule)
    assert not v.regression and v.p_wilcoxon == 1.0 and v.ratio == 1.0


@pytest.mark.parametrize("rule", ["paired", "unpaired"])
def test_improvement_is_not_a_regression(rule):
    a, b = _interleaved(25, slowdown=-0.20, seed=3)
    v = compare_latency(a, b, rule=rule)
    assert not v.regression
    assert v.ratio < 0.9 and v.p_wilcoxon > 0.99 and v.p_mannwhitney > 0.99


def test_small_significant_slowdown_below_threshold_is_not_flagged():
    a, b = _interleaved(25, slowdown=0.02, seed=4, noise=0.002)
    v = compare_latency(a, b, threshold=0.05)
    assert v.p_wilcoxon < 0.01 and not v.regression
    assert compare_latency(a, b, threshold=0.01).regression


@pytest.mark.parametrize(
    ("a", "b", "match"),
    [
        ([], [], "non-empty"),
        ([0.3] * 10, [0.3] * 9, "one timing per round"),
        ([0.3] * 10, [0.3] * 9 + [0.0], "finite and positive"),
        ([0.3] * 10, [0.3] * 9 + [float("nan")], "finite and positive"),
        ([[0.3] * 10], [[0.3] * 10], "non-empty sequence"),
        ([0.3] * 6, [0.4] * 6, "too few"),
    ],
)
def test_bad_input_is_rejected(a, b, match):
    with pytest.raises(ValueError, match=match):
        compare_latency(a, b)


def test_bad_parameters_are_rejected():
    a, b = _interleaved(10, 0.0, seed=5)
    with pytest.raises(ValueError, match="rule"):
        compare_latency(a, b, rule="t-test")
    with pytest.raises(ValueError, match="alpha"):
        compare_latency(a, b, alpha=0.0)
    with pytest.raises(ValueError, match="threshold"):
        compare_latency(a, b, threshold=-0.1)


def test_the_rule_tests_slower_by_more_than_the_threshold():
    """7% slower, noisy: clearly not "no change" (the old rule flagged it, ratio 1.065 > 1.05), but not
    shown to be more than 5% slower: the one-sided Wilcoxon of log(ratio) - log(1.05) is not significant."""
    a, b = _interleaved(25, slowdown=0.07, seed=0)
    v = compare_latency(a, b, threshold=0.05, alpha=0.01)
    assert v.p_wilcoxon < 1e-5 and 1.05 < v.paired_ratio < 1.08
    assert not v.regression


def test_holm_matches_a_hand_computed_example():
    """m = 4. Sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> 0.06 (monotone)."""
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == [1.0, 1.0]  # capped at 1
    assert stats.holm([]) == []


def test_min_p_value():
    assert min_p_value("paired", 7) == pytest.approx(1 / 128)
    assert min_p_value("unpaired", 3) == pytest.approx(1 / 20)
    # Seven rounds are the fewest for which the paired test can reach alpha = 0.01.
    compare_latency(*_interleaved(7, 0.0, seed=6))


def test_slowdown_hook_leaves_training_alone_and_checks_its_fraction(tiny_cfg):
    model = MaskRCNN(tiny_cfg)
    inject_slowdown(model, 0.3)
    calls = []
    # Rows of P3 that its output convolution sees: 8 on a 64-row image, once in the model's own pass.
    model.backbone.fpn.layer_blocks[1].register_forward_pre_hook(lambda _m, args: calls.append(args[0].shape[-2]))
    with torch.no_grad():
        model.backbone.train()(torch.zeros(1, 3, 64, 64))
        assert calls == [8]
        model.backbone.eval()(torch.zeros(1, 3, 64, 64))
        assert calls == [8, 8] + [8] * round(0.3 / 0.01)  # 30 whole extra passes
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match="slowdown"):
            inject_slowdown(model, bad)
        with pytest.raises(ValueError, match="slowdown"):
            Variant("B", slowdown=bad)


def test_a_variant_travels_to_a_worker_with_its_slowdown():
    row = Row(CASES["static/eager"], Variant("B", "/code", (("box_score_thresh", 0.1),), slowdown=0.2))
    assert Row.from_dict(json.loads(json.dumps(row.to_dict()))) == row


def test_mean_ratio_ci_treats_trials_as_the_units_and_survives_identical_trials():
    ratio, low, high = mean_ratio_ci([math.log(1.10), math.log(1.12), math.log(1.14)])
    assert math.isclose(ratio, math.exp(np.mean(np.log([1.10, 1.12, 1.14]))))
    assert low < ratio < high
    assert mean_ratio_ci([0.0, 0.0, 0.0]) == (1.0, 1.0, 1.0)  # no spread: a zero-width interval, not NaN
    with pytest.raises(ValueError, match="2 or more trials"):
        mean_ratio_ci([0.1])


def _stored_pair(seed: int, slowdown: float = 0.0, level_sd: float = 0.03, rounds: int = 25, noise: float = 0.08):
    """Two separate runs' per-round ratios to their reference row: each run settles at a level of its
    own (sd ``level_sd``, as separate processes do), then each round scatters around it."""
    rng = np.random.default_rng(seed)
    a = 1.2 * np.exp(level_sd * rng.standard_normal() + noise * rng.standard_normal(rounds))
    b = 1.2 * (1 + slowdown) * np.exp(level_sd * rng.standard_normal() + noise * rng.standard_normal(rounds))
    return a.tolist(), b.tolist()


def test_stored_runs_levels_cry_wolf_under_the_per_round_test_but_not_under_the_stored_rule():
    """Per-run levels 0.03 apart (sd), rounds scattering 0.02 around them, no change: pairing rounds by
    index flags many trials; the stored rule, told the between-run sd (0.03 * sqrt 2), stays near its alpha."""
    pairs = [_stored_pair(seed, noise=0.02) for seed in range(300)]
    per_round = sum(compare_latency(a, b).regression for a, b in pairs)
    stored = sum(stats.compare_stored(a, b, between_run_sd=0.03 * math.sqrt(2)).regression for a, b in pairs)
    assert per_round >= 15  # at least 5%, where alpha promises 1%
    assert stored <= 6  # at most 2% of 300


def test_stored_rule_flags_a_slowdown_well_beyond_the_between_run_spread():
    flagged = [stats.compare_stored(*_stored_pair(seed, slowdown=0.35), between_run_sd=0.042).regression
               for seed in range(50)]
    assert sum(flagged) >= 45
    v = stats.compare_stored(*_stored_pair(0, slowdown=0.35), between_run_sd=0.042)
    assert v.rule == "stored" and v.ci_low < v.estimate < v.ci_high and v.between_run_sd == 0.042
    assert v.p_value == v.p_beyond and v.regression_by("stored") == v.regression
    with pytest.raises(ValueError, match="stored verdict"):
        v.regression_by("paired")


def test_stored_rule_interval_widens_with_the_between_run_sd():
    a, b = _stored_pair(1, slowdown=0.10)
    narrow, wide = stats.compare_stored(a, b, between_run_sd=0.0), stats.compare_stored(a, b, between_run_sd=0.1)
    assert narrow.estimate == wide.estimate
    assert wide.ci_low < narrow.ci_low and wide.ci_high > narrow.ci_high and wide.p_value > narrow.p_value


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"between_run_sd": -0.1}, "between_run_sd must be >= 0"),
    ({"alpha": 0.0}, "alpha must be in"),
    ({"threshold": -1.0}, "threshold must be >= 0"),
])
def test_stored_rule_rejects_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        stats.compare_stored([1.0, 1.1, 1.2], [1.0, 1.1, 1.2], **kwargs)


def test_stored_rule_needs_two_rounds_per_run():
    with pytest.raises(ValueError, match="2 or more rounds"):
        stats.compare_stored([1.0], [1.0, 1.1])


def test_stored_rule_without_any_spread_is_certain_either_way():
    same = [1.0, 1.0, 1.0]
    assert stats.compare_stored(same, [1.2] * 3, between_run_sd=0.0).p_value == 0.0
    assert stats.compare_stored(same, same, between_run_sd=0.0).p_value == 1.0
