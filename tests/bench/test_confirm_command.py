"""The confirm command of a step: its rounds from an A/A study's per-round scatter, per machine."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from mrcnn_bench.changes import confirm_command as confirm  # noqa: E402


def test_rounds_give_90_percent_power_for_the_step_and_the_noise():
    z = stats.norm.ppf(0.95) + stats.norm.ppf(0.90)
    assert confirm.rounds_for(3.0, 0.08) == math.ceil((z * 0.08 / math.log(1.03)) ** 2 / 0.955)
    assert confirm.rounds_for(5.0, 0.08) < confirm.rounds_for(3.0, 0.08) < confirm.rounds_for(3.0, 0.12)
    assert confirm.rounds_for(50.0, 0.01) == confirm.MIN_ROUNDS
    # By simulation: that many paired normal rounds find a 3% step about 90% of the time.
    import numpy as np

    rng = np.random.default_rng(0)
    n = confirm.rounds_for(3.0, 0.08)
    found = sum(stats.wilcoxon(rng.normal(math.log(1.03), 0.08, n), alternative="greater").pvalue < 0.05
                for _ in range(400))
    assert 0.85 <= found / 400 <= 0.95


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
    command, rounds, note = confirm.confirm("Latency.track_ratio(static/xla)", "aaaa", "bbbb", 5.0, {"static/xla": 0.1})
    assert command == f"mrcnn-bench compare aaaa bbbb --cases static/xla --threshold 0 --rounds {rounds}"
    assert rounds == confirm.rounds_for(5.0, 0.1) and "0.100" in note
    command, rounds, _ = confirm.confirm("Compiles.track_count(static/xla, xla_compiles)", "a", "b", None, {})
    assert "--cases static/xla" in command and rounds is None
    command, _, _ = confirm.confirm("Accuracy.track_box_error", "a", "b", 1.0, {})
    assert "fixed_accuracy evaluate" in command
    _, rounds, note = confirm.confirm("Latency.track_ratio(static/eager)", "a", "b", 3.0, {})
    assert rounds == 100 and "guess" in note
