"""The confirm command of a step: its process pairs from an A/A study's per-round scatter, per machine."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from mrcnn_bench.base import defaults  # noqa: E402
from mrcnn_bench.changes import confirm_command as confirm  # noqa: E402


def test_pairs_give_90_percent_power_for_the_step_and_the_noise():
    k = confirm.pairs_for(3.0, 0.08)
    assert confirm.pairs_for(5.0, 0.08) < k < confirm.pairs_for(3.0, 0.12)
    assert confirm.pairs_for(3.0, 0.08, process_sd=0.03) > k  # process levels cost pairs, not rounds
    assert confirm.pairs_for(50.0, 0.01) == confirm.MIN_PAIRS
    # By simulation, through the compare's own statistic: K pairs whose processes draw levels find
    # a 3% step about 90% of the time.
    import numpy as np

    from mrcnn_bench.gates.stats import compare_pairs

    rng = np.random.default_rng(0)
    rounds, found = defaults.COMPARE_ROUNDS, 0
    for _ in range(300):
        levels = rng.normal(0, defaults.PROCESS_SD, (k, 1))  # the pair's level difference
        a = np.exp(rng.normal(0, 0.08 / math.sqrt(2), (k, rounds)))
        b = 1.03 * np.exp(levels + rng.normal(0, 0.08 / math.sqrt(2), (k, rounds)))
        found += compare_pairs(list(a), list(b), [i % 2 == 0 for i in range(k)], threshold=0.0,
                               alpha=defaults.ALPHA).regression
    assert 0.85 <= found / 300 <= 0.95


def test_round_noise_is_the_scatter_within_each_process(tmp_path):
    # Two processes of 20 rounds whose levels differ by 10%: the level is not round noise.
    logs = [0.05 * (-1) ** i for i in range(20)]
    ratios = [math.exp(x) for x in logs] + [1.1 * math.exp(x) for x in logs]
    record = {"case_s": ratios, "ruler_s": [1.0] * 40, "processes": 2}
    (tmp_path / "run_1.json").write_text(json.dumps({"timing": {"static/eager": {"record": record}}}))
    sd = confirm.round_noise(tmp_path)["static/eager"]
    assert sd == pytest.approx(0.05 * math.sqrt(20 / 19), rel=1e-6)
    assert confirm.round_noise(tmp_path / "none") == {} and confirm.round_noise(None) == {}


def test_each_machine_gets_its_own_a_a_noise_and_others_the_default(tmp_path):
    for name, sd in (("intel", 0.05), ("amd", 0.10)):
        (tmp_path / name).mkdir()
        logs = [sd * (-1) ** i for i in range(20)]
        record = {"case_s": [math.exp(x) for x in logs], "ruler_s": [1.0] * 20, "processes": 1}
        (tmp_path / name / "run_1.json").write_text(json.dumps({"timing": {"static/eager": {"record": record}}}))
    noise = confirm.noise_by_machine([str(tmp_path / "intel"), f"amd-epyc-2c-fx1={tmp_path / 'amd'}"])
    assert noise[None]["static/eager"] == pytest.approx(0.05 * math.sqrt(20 / 19))
    assert noise["amd-epyc-2c-fx1"]["static/eager"] == pytest.approx(0.10 * math.sqrt(20 / 19))
    with pytest.raises(ValueError, match="no A/A study"):
        confirm.noise_by_machine([f"m={tmp_path / 'none'}"])
    with pytest.raises(ValueError, match="already"):
        confirm.noise_by_machine([f"m={tmp_path / 'amd'}", f"m={tmp_path / 'intel'}"])


def test_confirm_commands_by_kind_of_metric():
    command, pairs, note = confirm.confirm("Latency.track_ratio(static/xla)", "aaaa", "bbbb", 5.0, {"static/xla": 0.1})
    assert command == f"mrcnn-bench compare aaaa bbbb --cases static/xla --threshold 0 --pairs {pairs}"
    assert pairs == confirm.pairs_for(5.0, 0.1) and "0.100" in note
    command, pairs, _ = confirm.confirm("Compiles.track_count(static/xla, xla_compiles)", "a", "b", None, {})
    assert "--cases static/xla --pairs 1" in command and pairs is None
    command, _, _ = confirm.confirm("Accuracy.track_box_error", "a", "b", 1.0, {})
    assert "fixed_accuracy evaluate" in command
    _, pairs, note = confirm.confirm("Latency.track_ratio(static/eager)", "a", "b", 3.0, {})
    assert pairs == confirm.GUESS_PAIRS and "guess" in note
