"""The stored-run A/A study's summary: the between-run sd it recovers, the cross-fitted stored rule,
and no summary from too few trials."""

from __future__ import annotations

import json
import math

import numpy as np
from studies.stored_compare_false_alarms import stored_false_alarms as study


def _trials(count: int, level_sd: float, noise: float = 0.05, rounds: int = 25, seed: int = 0) -> list[dict]:
    """A/A trials: each run's static/eager at a level of its own (sd ``level_sd``) over a steady reference."""
    rng = np.random.default_rng(seed)
    out = []
    for pair in range(count):
        trial = {"pair": pair, "rounds": rounds, "loadavg_before": 1.0, "regression": False}
        for side in "ab":
            trial[f"{side}_torchvision/eager"] = [0.1] * rounds
            level = level_sd * rng.standard_normal()
            trial[f"{side}_static/eager"] = (0.13 * np.exp(level + noise * rng.standard_normal(rounds))).tolist()
        out.append(trial)
    return out


def test_between_run_sd_recovers_the_spread_of_levels_beyond_the_rounds_noise():
    # Levels of sd 0.03 per run: the difference of two runs has sd 0.03 * sqrt(2).
    assert math.isclose(study.between_run_sd(_trials(400, 0.03)), 0.03 * math.sqrt(2), rel_tol=0.15)
    assert study.between_run_sd(_trials(400, 0.0)) < 0.01  # the rounds' noise alone is not counted


def test_the_cross_fitted_stored_rule_stays_quiet_on_a_a_and_catches_a_large_slowdown():
    trials = _trials(100, 0.03)
    flagged, n = study.stored_rule_alarms(trials)
    assert n == 100 and flagged <= 3
    assert study.stored_rule_alarms(trials, scale=1.4)[0] >= 95


def test_summary_writes_the_rates_and_refuses_too_few_trials(tmp_path, capsys):
    assert study.summary(tmp_path) == 2  # no trials at all
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(t) + "\n" for t in _trials(8, 0.03)))
    assert study.summary(tmp_path) == 0
    text = (tmp_path / "summary.md").read_text()
    assert "8 trials of 25 rounds" in text and "| 1.30 |" in text and "Between-run sd" in text
