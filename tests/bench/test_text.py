"""Text the harness prints: table cells from outside, and JSON that every parser reads."""

from __future__ import annotations

import json

from mrcnn_bench.base.text import cell, strict_json


def test_a_cell_cannot_forge_a_row_or_reach_the_terminal():
    assert cell("a|b\nc\x1b[31m") == "a\\|b\\x0ac\\x1b[31m"


def test_strict_json_writes_null_for_non_finite_numbers():
    value = {"change_pct": float("inf"), "p": [float("nan"), 1.5, -float("inf")], "n": (1, "x")}
    text = strict_json(value, indent=1)
    assert "Infinity" not in text and "NaN" not in text
    assert json.loads(text) == {"change_pct": None, "p": [None, 1.5, None], "n": [1, "x"]}
