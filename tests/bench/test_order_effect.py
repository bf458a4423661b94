"""The order-effect study's summary: a bias that follows the position swaps sign with the order."""

from __future__ import annotations

import json
import math

from studies.compare_order_effect import order_trials as study


def test_summary_reports_each_order_with_its_interval(tmp_path):
    # The second row of a round 4% slower: B/A is +4% when A runs first and -4% when B does.
    trials = [{"swap": i % 2 == 1, "log_b_over_a": 0.001 * (i - 3), "a_first": math.log(1.04),
               "b_first": -math.log(1.04)} for i in range(6)]
    (tmp_path / "order_effect.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trials))
    assert study.summary(tmp_path) == 0
    rows = [line for line in (tmp_path / "order_effect.md").read_text().splitlines() if line.startswith("| A, B")
            or line.startswith("| B, A")]
    assert len(rows) == 2
    assert all("| 1.0400 | 0.9615 |" in row for row in rows)
    low, high = (float(x) for x in rows[0].split("|")[4].split(" to "))
    assert low < math.exp(-0.001) < high  # mean of trials 0, 2, 4: logs -0.003, -0.001, 0.001


def test_summary_without_enough_trials_says_so_and_exits_2(tmp_path):
    assert study.summary(tmp_path) == 2  # no file
    (tmp_path / "order_effect.jsonl").write_text(json.dumps({"swap": False, "log_b_over_a": 0.0, "a_first": 0.0,
                                                             "b_first": 0.0}) + "\n")
    assert study.summary(tmp_path) == 2
    assert not (tmp_path / "order_effect.md").exists()
