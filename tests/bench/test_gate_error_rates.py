"""The live error-rate study's bookkeeping: which trial runs next, and the rates per round count."""

from __future__ import annotations

import json

import numpy as np
from studies.gate_error_rates import live_error_rates as study


def test_the_kind_furthest_behind_its_target_runs_next():
    assert study.next_kind({}) == "aa"
    assert study.next_kind({"aa": 1}) == "slow05"
    assert study.next_kind({"aa": 72, "slow10": 30, "slow05": 29}) == "slow05"
    assert study.next_kind(dict(study.TARGETS)) is None


def test_rates_judge_each_round_count_on_the_first_rounds(tmp_path):
    rng = np.random.default_rng(0)
    trials = []
    for kind, slow in study.KINDS.items():
        for _ in range(4):
            trials.append({**_trial(kind, rng), "slowdown": slow, "seconds": 30.0, "loadavg_before": 0.1})
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trials) + '{"kind": "a')  # torn
    assert len(study.read_lines(tmp_path / "trials.jsonl")) == 12
    r = study.rates(trials, 10)
    assert (r["aa"].flagged, r["slow10"].flagged, r["aa"].trials) == (0, 4, 4)
    assert r["aa"].text().startswith("0/4 = 0.0% [0.0%, 60.2%]")  # Clopper-Pearson, two-sided 95%
    assert study.summary(tmp_path) == 0
    assert "| 7 |" in (tmp_path / "error_rates.md").read_text()


def _trial(kind: str, rng: np.random.Generator, slow: float | None = None) -> dict:
    """One trial of ``kind`` whose B is ``slow`` (default: the kind's own) slower than A, each round of
    each side with its own 1% noise, as measured rounds have (no two rounds' ratios tie)."""
    slow = study.KINDS[kind] if slow is None else slow
    a = 0.2 * np.exp(rng.normal(0, 0.01, study.ROUNDS))
    b = a * (1 + slow) * np.exp(rng.normal(0, 0.01, study.ROUNDS))
    return {"kind": kind, "a_s": a.tolist(), "b_s": b.tolist()}


def _trials(kind: str, count: int, rng: np.random.Generator, slow: float | None = None) -> list[dict]:
    return [_trial(kind, rng, slow) for _ in range(count)]


def test_the_round_count_proves_the_false_alarm_rate_on_its_interval():
    rng = np.random.default_rng(1)
    clean = _trials("slow10", 30, rng)
    # 0 false alarms in 20 A/A trials is a 0% point estimate, but its upper bound is 17%: no choice.
    assert study.fewest_rounds(_trials("aa", 20, rng) + clean) is None
    # 0 of 72 bounds the rate below 5%, and every 10% slowdown is caught.
    assert study.fewest_rounds(_trials("aa", 72, rng) + clean) == study.ROUND_COUNTS[0]
    # 4 of 30 slowdowns missed (their B as fast as A): 87% detected, under the 90% goal at every count.
    missed = _trials("slow10", 26, rng) + _trials("slow10", 4, rng, slow=0.0)
    assert study.fewest_rounds(_trials("aa", 72, rng) + missed) is None
    missed[-1] = clean[0]  # 3 missed: 90%
    assert study.fewest_rounds(_trials("aa", 72, rng) + missed) == study.ROUND_COUNTS[0]


def test_measured_ratios_report_what_b_really_was_and_the_order_effect():
    a = [0.2] * study.ROUNDS
    # B is 2% slower when it runs second (odd rounds: A first in even rounds, B first in odd ones).
    aa = [{"kind": "aa", "a_s": a, "b_s": [x * (1.02 if i % 2 == 0 else 1.0) for i, x in enumerate(a)]}] * 3
    slow = [{"kind": "slow10", "a_s": a, "b_s": [x * 1.13 for x in a]}, {"kind": "slow10", "a_s": a,
                                                                          "b_s": [x * 1.11 for x in a]}]
    m = study.measured_ratios(aa + slow)
    assert "slow05" not in m  # fewer than two trials: no interval
    assert np.isclose(m["aa"]["a_first"], 1.02) and np.isclose(m["aa"]["b_first"], 1.0)
    assert np.isclose(m["slow10"]["ratio"], np.sqrt(1.13 * 1.11))
    assert m["slow10"]["low"] < m["slow10"]["ratio"] < m["slow10"]["high"]
