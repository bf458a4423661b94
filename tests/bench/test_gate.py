"""The merge gate and the command line's exit codes: never pass on nothing, never cry wolf.

Fakes stand in for the measurements (``gate.measure``), so these tests take no timings and compile
nothing, except the two marked slow, which run the real probe of static/inductor: on dynamo's eager
backend in CI, under inductor in ``make test-all``.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

import mrcnn.transform
from mrcnn_bench.cli import commands as cli
from mrcnn_bench.gates import compile_probe, gate
from mrcnn_bench.running.cases import QUICK, parse_cases

REPO = Path(__file__).resolve().parents[2]
INDUCTOR = {"unique_graphs": 2, "graph_breaks": 0, "recompiles": 1, "flops": 10.0, "per_call": []}
XLA = {"uncached_compile": 2, "fallback_ops": 0, "flops": 10.0, "per_call": [], "xla_causes": []}


def write_baseline(path: Path, cases: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"preset": "tiny", "cases": cases}))
    return path


@pytest.fixture
def fake_measure(monkeypatch):
    """``gate.measure`` returning ``counts[case]``; ``calls`` records the cases it was asked for."""

    class Fake:
        def __init__(self) -> None:
            self.counts: dict[str, dict[str, Any]] = {"static/inductor": INDUCTOR, "static/xla": XLA}
            self.calls: list[str] = []

        def __call__(self, case_name: str, preset: str, inject: str | None, workdir: Path) -> dict[str, Any]:
            self.calls.append(case_name)
            return dict(self.counts[case_name])

    fake = Fake()
    monkeypatch.setattr(gate, "measure", fake)
    return fake


def gate_cli(baseline: Path, *extra: str) -> int:
    return cli.main(["gate", "--accuracy", "none", "--baseline", str(baseline), *extra])


# ------------------------------------------------------------------------------------------------
# 1. A gate that measured nothing (or not everything) cannot pass


def test_gate_cannot_decide_when_a_case_cannot_run_here(tmp_path, monkeypatch, capsys, fake_measure):
    monkeypatch.delenv("PJRT_DEVICE", raising=False)  # static/xla cannot run: the reproduction of the issue
    baseline = write_baseline(tmp_path / "gate.json", {"static/inductor": INDUCTOR, "static/xla": XLA})
    assert gate_cli(baseline, "--cases", "static/xla") == 2
    captured = capsys.readouterr()
    assert "gate passed" not in captured.out and "static/xla" in captured.err
    assert gate_cli(baseline) == 2  # the baseline's cases by default: static/xla among them
    assert "static/xla" in capsys.readouterr().err and fake_measure.calls == []


def test_gate_cannot_decide_when_a_measurement_crashes(tmp_path, monkeypatch, capsys):
    def crashed_run(cmd: list[str], stdout: Any, **kwargs: Any) -> subprocess.CompletedProcess:
        stdout.write("RuntimeError: out of memory\n")
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(gate.subprocess, "run", crashed_run)
    baseline = write_baseline(tmp_path / "gate.json", {"static/inductor": INDUCTOR})
    assert gate_cli(baseline) == 2
    captured = capsys.readouterr()
    assert "static/inductor" in captured.out and "out of memory" in captured.err
    assert "Traceback" not in captured.err


@pytest.mark.parametrize("side", ["now", "base"])
def test_gate_cannot_decide_on_a_metric_missing_from_one_side(tmp_path, capsys, fake_measure, side):
    lacking = {k: v for k, v in INDUCTOR.items() if k != "recompiles"}
    fake_measure.counts = {"static/inductor": lacking if side == "now" else INDUCTOR}
    baseline = write_baseline(tmp_path / "gate.json", {"static/inductor": INDUCTOR if side == "now" else lacking})
    assert gate_cli(baseline, "--cases", "static/inductor") == 2
    out = capsys.readouterr().out
    assert "static/inductor: recompiles is missing" in out and "gate passed" not in out


@pytest.mark.parametrize("doctored", [float("nan"), -1, "2", True, None])
def test_a_baseline_count_that_is_not_a_count_is_refused_before_measuring(tmp_path, capsys, fake_measure, doctored):
    """NaN compares false both ways: a baseline of NaN counts passed every comparison (exit 0)."""
    entry = {**INDUCTOR, "unique_graphs": doctored} if doctored is not None else "2 graphs"
    baseline = write_baseline(tmp_path / "gate.json", {"static/inductor": entry})
    assert gate_cli(baseline, "--cases", "static/inductor") == 2
    err = capsys.readouterr().err
    assert "static/inductor" in err and "gate.json" in err and "Traceback" not in err
    assert fake_measure.calls == [], "refused before anything was measured"


def test_check_benchmarks_expects_every_quick_case_not_what_runs_here(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    ran = [n for n in QUICK if n != "static/xla"]
    data = tmp_path / "benchmarks.json"
    data.write_text(json.dumps({"benchmarks": [{"extra_info": {"case": n}} for n in ran]}))
    assert cli.main(["check-benchmarks", str(data)]) == 1
    assert "static/xla" in capsys.readouterr().err
    assert cli.main(["check-benchmarks", "--expect", ",".join(ran), str(data)]) == 0
    assert cli.main(["check-benchmarks", "--expect", "static/nope", str(data)]) == 2


# ------------------------------------------------------------------------------------------------
# 2. Any change fails, a fall included; the baseline is written from a clean tree only


def test_gate_fails_when_a_count_falls_and_says_to_rebaseline(tmp_path, capsys, fake_measure):
    fake_measure.counts = {"static/inductor": {**INDUCTOR, "unique_graphs": 1, "recompiles": 0}}
    baseline = write_baseline(tmp_path / "gate.json", {"static/inductor": INDUCTOR})
    assert gate_cli(baseline, "--cases", "static/inductor") == 1
    out = capsys.readouterr().out
    assert "static/inductor: recompiles fell from 1 to 0" in out and "unique_graphs fell from 2 to 1" in out
    assert "mrcnn-bench gate --write-baseline --accuracy none" in out
    assert gate.compile_failures("static/inductor", INDUCTOR, INDUCTOR) == []


def test_write_baseline_refuses_a_dirty_tree_before_measuring(tmp_path, monkeypatch, capsys, fake_measure):
    monkeypatch.setattr(gate, "dirty_files", lambda repo=gate.REPO: ["mrcnn/model.py"])
    monkeypatch.setattr(gate, "REPO", tmp_path)  # a baseline in the repository: one that could be committed
    baseline = tmp_path / "gate.json"
    assert gate_cli(baseline, "--cases", "static/inductor", "--write-baseline") == 2
    err = capsys.readouterr().err
    assert "mrcnn/model.py" in err and len(err.strip().splitlines()) == 1
    assert fake_measure.calls == [] and not baseline.exists()
    opts = gate.GateOptions(cases=parse_cases("static/inductor"), baseline=str(baseline), write_baseline=True,
                            require_clean_tree=False, accuracy="none")
    assert gate.run_gate(opts) == 0
    assert json.loads(baseline.read_text())["cases"]["static/inductor"]["recompiles"] == 1


def test_dirty_files_ignore_baselines(monkeypatch):
    outputs = {"diff": "baselines/gate_tiny.json\nmrcnn/model.py", "ls-files": "notes.txt\nbaselines/accuracy/x.json"}
    monkeypatch.setattr(gate.vcs, "output", lambda repo, *args: outputs[args[1]])
    assert gate.dirty_files() == ["mrcnn/model.py", "notes.txt"]
    assert gate.baseline_path("tiny") == REPO / "baselines" / "gate_tiny.json"
    monkeypatch.setattr(gate.vcs, "output", lambda repo, *args: None)
    assert gate.dirty_files() is None


@pytest.mark.slow
@pytest.mark.extended(ci="tests/bench/test_gate.py::test_tight_padding_raises_the_dynamo_counts_that_the_gate_compares")
def test_gate_fails_on_an_injected_recompile_under_inductor(capsys):
    """The real probe of static/inductor with images padded tightly, against the committed baseline."""
    opts = gate.GateOptions(cases=parse_cases("static/inductor"), accuracy="none", inject="recompile")
    assert gate.run_gate(opts) == 1
    out = capsys.readouterr().out
    assert "GATE FAILED" in out and "static/inductor: " in out and " rose from " in out


@pytest.fixture
def probe_in_process_without_inductor(monkeypatch):
    """``gate.measure`` as the real probe (:func:`compile_probe.measure_case`) in this process, with
    dynamo's ``eager`` backend under ``torch.compile``. The counts the gate compares (unique graphs,
    graph breaks, recompiles) are dynamo's, settled before a backend sees a graph, so they are
    inductor's without its minutes of code generation."""
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, **{**kw, "backend": "eager"}))
    monkeypatch.setattr(mrcnn.transform, "select_canvas", mrcnn.transform.select_canvas)  # the fault replaces it
    monkeypatch.setattr(gate, "measure",
                        lambda case, preset, inject, workdir: compile_probe.measure_case(case, preset, inject))
    torch._dynamo.reset()  # counters and caches of earlier tests' compilations
    yield
    torch._dynamo.reset()  # this test's graphs must not count against the frames of later tests


@pytest.mark.slow
def test_tight_padding_raises_the_dynamo_counts_that_the_gate_compares(probe_in_process_without_inductor, capsys):
    """static/inductor's probe as the gate runs it (seven sizes, two canvases), but on dynamo's eager
    backend: it counts what the committed inductor baseline holds, and with images padded tightly
    (a new shape per aspect ratio) the gate fails on the counts that rose."""
    opts = gate.GateOptions(cases=parse_cases("static/inductor"), accuracy="none")
    assert gate.run_gate(opts) == 0, capsys.readouterr().out
    capsys.readouterr()
    torch._dynamo.reset()
    assert gate.run_gate(dataclasses.replace(opts, inject="recompile")) == 1
    out = capsys.readouterr().out
    assert "GATE FAILED" in out and "static/inductor: unique_graphs rose from " in out, out


# ------------------------------------------------------------------------------------------------
# 3. Every input is checked before anything is measured


def test_missing_inputs_are_reported_before_measuring(tmp_path, monkeypatch, capsys, fake_measure):
    monkeypatch.chdir(REPO)  # the accuracy baseline is found relative to the working directory
    assert gate_cli(tmp_path / "absent.json") == 2
    err = capsys.readouterr().err
    assert "no compile baseline" in err and len(err.strip().splitlines()) == 1
    baseline = write_baseline(tmp_path / "gate.json", {"static/inductor": INDUCTOR})
    argv = ["gate", "--baseline", str(baseline), "--checkpoint", str(tmp_path / "absent.pt")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "absent.pt" in err and len(err.strip().splitlines()) == 1
    assert gate_cli(baseline, "--latency-against", "no-such-ref-anywhere") == 2
    assert "no-such-ref-anywhere" in capsys.readouterr().err
    assert fake_measure.calls == []


def test_every_input_problem_is_reported_the_missing_checkpoint_first(tmp_path, monkeypatch, capsys, fake_measure):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("PJRT_DEVICE", raising=False)  # static/xla of the baseline cannot run here
    baseline = write_baseline(tmp_path / "gate.json", {"static/inductor": INDUCTOR, "static/xla": XLA})
    absent = tmp_path / "absent.pt"
    assert cli.main(["gate", "--baseline", str(baseline), "--checkpoint", str(absent)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"mrcnn-bench gate: error: 2 problems: (1) --checkpoint {absent}: no such file"), line
    assert "(2) cannot measure static/xla (PJRT_DEVICE is not set" in line and fake_measure.calls == []


# ------------------------------------------------------------------------------------------------
# 4. One table of exit codes for every command


def bad_invocations(tmp_path: Path) -> dict[str, list[list[str]]]:
    """Per subcommand: a wrong argument, and a missing input file."""
    absent = str(tmp_path / "absent")
    return {
        "run": [["--rounds", "-1"], ["--weights", absent + ".pt"], ["--out", str(tmp_path), "--name", "../escape"]],
        "compare": [["a.json", "b.json", "--bogus"], [absent + "_a.json", absent + "_b.json"], [absent, "."],
                    [".", ".", "--pairs", "2"], [".", ".", "--rounds", "7"], [".", ".", "--pairs", "0"]],
        "bisect": [["HEAD~1"], ["HEAD~1", "HEAD", "--pairs", "1"], ["HEAD~1", "HEAD", "--rounds", "3"],
                   [f"--output={absent}", "HEAD"], ["HEAD", "HEAD~1"]],
        "gate": [["--cases", "static/nope"], ["--accuracy", "none", "--baseline", absent + ".json"],
                 ["--skip-compile", "--accuracy", "none", "--latency-against", "HEAD", "--latency-pairs", "2"],
                 ["--skip-compile", "--accuracy", "none", "--latency-against", "HEAD", "--latency-rounds", "7"],
                 ["--skip-compile", "--accuracy-threads", "0"]],
        "latency-check": [["--pairs", "3"], ["--rounds", "7"], ["--against=nope"], [f"--against=--output={absent}"],
                          ["--inject-slowdown", "0.1"], ["--cases", "static/nope"], ["--out", str(REPO / "Makefile")]],
        "accuracy-gate": [["--bogus"], ["--checkpoint", absent + ".pt"]],
        "export-time": [[absent + ".pt2", "--rounds", "0"], [absent + ".pt2"]],
        "check-benchmarks": [["--expect", "static/nope", absent + ".json"], [absent + ".json"]],
        "report": [["--bogus", absent], [absent + ".json", "--out", str(tmp_path / "html")]],
        "export-db": [["--bogus", absent], [absent + ".json", "--out", str(tmp_path / "db.json")]],
        "list": [["--bogus"], ["unexpected"]],
        "steps": [["--bogus"], ["--series", absent + ".csv"]],
        "gpu-check": [["--steps", "nope"], ["--budget-s", "0"]],
        "asv": [[], ["nope"], ["machine", "--bogus"], ["fixture", "evaluate"], ["scratch", "--repo", absent],
                ["spread", "--runs", "x"], ["table", "m", "--results", absent],
                ["table", "m", "--repo", str(tmp_path), f"--revs=--output={absent}"], ["flags", "--html", absent],
                ["report", "--noise", absent], ["offline-html", absent], ["screenshots", "--html-dir", absent]],
    }


def test_every_command_exits_2_without_a_traceback_on_bad_input(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    cases = bad_invocations(tmp_path)
    commands = set(cli.build_parser()._subparsers._group_actions[0].choices)
    assert set(cases) == commands, "walk every subcommand"
    for command, argvs in [*cases.items(), ("", [["--bogus"], ["no-such-command"]])]:
        for argv in argvs:
            full = [command, *argv] if command else argv
            assert cli.main(full) == 2, full
            err = capsys.readouterr().err
            assert err.strip() and "Traceback" not in err, (full, err)
    assert not Path(tmp_path / "absent").exists(), "a ref from outside was handed to git as an option"


def test_an_unexpected_exception_is_an_internal_error(tmp_path, monkeypatch, capsys):
    def broken(args: Any) -> int:
        raise KeyError("boom")

    monkeypatch.setattr(cli, "cmd_report", broken)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert cli.main(["report", "x.json"]) == 3
    err = capsys.readouterr().err
    assert "internal error: KeyError: 'boom'" in err and "report it to the mrcnn maintainers" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2
    (log,) = tmp_path.glob("mrcnn-bench-error-*.log")
    assert "Traceback" in log.read_text()
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    assert cli.main(["report", "x.json"]) == 3
    assert "Traceback" in capsys.readouterr().err


def test_training_probe_steps_on_each_ground_truth_mix():
    """The gate's training steps: TRAIN_BATCH samples per mix of GATE_TRAIN_COUNTS, the same image
    cut to each count (every per-object field), so sampled positives and buckets vary by step."""
    from mrcnn_bench.gates.compile_probe import GATE_SIZES, GATE_TRAIN_COUNTS, training_mixes
    from mrcnn_bench.running.cases import TRAIN_BATCH

    samples = training_mixes(GATE_SIZES[0])
    assert TRAIN_BATCH == 2 and len(samples) == TRAIN_BATCH * len(GATE_TRAIN_COUNTS)
    counts = [len(t["labels"]) for _, t in samples]
    assert counts == [n for mix in GATE_TRAIN_COUNTS for n in mix]
    assert 0 in counts and len(set(counts)) > 3
    for _, target in samples:
        n = len(target["labels"])
        assert len(target["boxes"]) == len(target["masks"]) == len(target["iscrowd"]) == n
    assert all(torch.equal(image, samples[0][0]) for image, _ in samples)
