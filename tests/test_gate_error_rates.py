"""The live error-rate study's bookkeeping: which trial runs next, and the rates per round count."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gate_error_rates.py"
_spec = importlib.util.spec_from_file_location("gate_error_rates", SCRIPT)
study = importlib.util.module_from_spec(_spec)  # a script in bench/, not a package
sys.modules["gate_error_rates"] = study  # its dataclasses look their module up there
_spec.loader.exec_module(study)


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
            a = (0.2 * np.exp(rng.normal(0, 0.01, study.ROUNDS))).tolist()
            b = [x * (1 + slow) * 1.0005 for x in a] if slow else list(a)
            trials.append({"kind": kind, "slowdown": slow, "a_s": a, "b_s": b, "seconds": 30.0,
                           "loadavg_before": 0.1})
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trials) + '{"kind": "a')  # torn
    assert len(study.read_lines(tmp_path / "trials.jsonl")) == 12
    r = study.rates(trials, 10)
    assert (r["aa"].flagged, r["slow10"].flagged, r["aa"].trials) == (0, 4, 4)
    assert r["aa"].text().startswith("0/4 = 0.0% [0.0%, 60.2%]")  # Clopper-Pearson, two-sided 95%
    assert study.summary(tmp_path) == 0
    assert "| 7 |" in (tmp_path / "error_rates.md").read_text()
