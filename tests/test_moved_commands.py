"""Commands that moved with their code: each old spelling exits 2 and names the new one."""

from __future__ import annotations

import pytest

from mrcnn import cli as mrcnn_cli
from mrcnn_bench.cli import commands as bench_cli


def test_accuracy_gate_moved_to_the_harness(capsys):
    assert mrcnn_cli.main(["accuracy-gate", "--recipe", "ci"]) == 2
    assert "mrcnn-bench accuracy-gate" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "new"), [("--set-b", "--inject-slowdown "), ("--set-a", "--inject-slowdown-a ")])
def test_slowdown_is_a_harness_flag_not_a_config_field(capsys, flag, new):
    assert bench_cli.main(["compare", ".", ".", flag, "inject_slowdown=0.1"]) == 2
    assert new in capsys.readouterr().err


def test_slowdown_fraction_is_checked_before_running(capsys):
    assert bench_cli.main(["compare", ".", ".", "--inject-slowdown", "1.5"]) == 2
    assert "[0, 1)" in capsys.readouterr().err


def test_export_timing_moved_to_the_harness(capsys, tmp_path):
    assert mrcnn_cli.main(["export", "--out", str(tmp_path), "--rounds", "3"]) == 2
    assert "mrcnn-bench export-time" in capsys.readouterr().err
