"""Both command lines as a user meets them: help that states the defaults the code uses, fast
``--help`` / ``--version``, one exit-code table, one progress convention, ``mrcnn-bench list``."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mrcnn import cli as mrcnn_cli
from mrcnn import exits, progress
from mrcnn.engine.hooks import ProgressBar
from mrcnn_bench.base import defaults
from mrcnn_bench.cli import args as cli_args
from mrcnn_bench.cli import asv as asv_tools
from mrcnn_bench.cli import commands as cli
from mrcnn_bench.cli import options as cli_options
from mrcnn_bench.running.cases import CASES, STREAM_IMAGES

REPO = Path(__file__).resolve().parents[1]


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def bench_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every mrcnn-bench subcommand's full parser (the lazy ones built from their modules)."""
    parsers = subparsers(cli.build_parser())
    for name, (module_name, _) in cli.LAZY_COMMANDS.items():
        if name == "asv":  # a group: each tool has a parser of its own
            parsers |= {f"asv {tool}": parser for tool, parser in asv_tools.parsers("mrcnn-bench asv").items()}
            del parsers[name]
            continue
        parser = argparse.ArgumentParser(prog=f"mrcnn-bench {name}")
        __import__(module_name, fromlist=["add_arguments"]).add_arguments(parser)
        parsers[name] = parser
    return parsers


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS
            and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]


# ------------------------------------------------------------------------------------------------
# Help text: every flag explained, and the defaults it states are the ones the code uses


def test_every_flag_has_help_that_states_its_default():
    for command, parser in bench_parsers().items():
        for action in options(parser):
            text = parser._get_formatter()._expand_help(action) if action.help else ""
            assert text.strip(), f"mrcnn-bench {command} {action.option_strings[0]}: no help"
            default = action.default
            if default is None or isinstance(default, (bool, list)):
                continue  # switches, repeatables, and defaults the help describes in words
            shown = f"{default:g}" if isinstance(default, float) else str(default)
            assert shown in text, (command, action.option_strings[0], text)


def mrcnn_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every mrcnn subcommand's full parser."""
    parsers = {}
    for name, (module_name, _) in mrcnn_cli.COMMANDS.items():
        parser = argparse.ArgumentParser(prog=f"mrcnn {name}")
        __import__(module_name, fromlist=["add_arguments"]).add_arguments(parser)
        parsers[name] = parser
    return parsers


def test_every_number_a_flag_takes_is_finite_and_every_seed_fits():
    """NaN, infinity and a seed past numpy's range are the flag's one-line usage error (exit 2), never a
    value that reaches the code: each flag's type refuses them itself."""
    parsers = {f"mrcnn-bench {k}": v for k, v in bench_parsers().items()} | {
        f"mrcnn {k}": v for k, v in mrcnn_parsers().items()}
    checked = 0
    for command, parser in parsers.items():
        for action in options(parser):
            if action.type in (int, float) or getattr(action.type, "__qualname__", "").startswith("bounded"):
                for text in ("nan", "inf", "-1e400"):
                    with pytest.raises((argparse.ArgumentTypeError, ValueError)):
                        action.type(text)
                        pytest.fail(f"{command} {action.option_strings[0]} took {text}")
                checked += 1
            if action.option_strings[0] in ("--seed", "--seeds"):
                with pytest.raises(argparse.ArgumentTypeError):
                    action.type(str(2**64))
    assert checked > 40, checked


def test_help_defaults_are_the_commands_constants(capsys):
    parsers = subparsers(cli.build_parser())
    compare = parsers["compare"].parse_args(["a.json", "b.json"])
    # The threshold's default depends on the test (across pairs, or one process per side): None here.
    assert (compare.pairs, compare.rounds, compare.threshold, compare.alpha) == (
        defaults.COMPARE_PAIRS, defaults.COMPARE_ROUNDS, None, defaults.ALPHA)
    run = parsers["run"].parse_args([])
    assert (run.rounds, run.warmup) == (defaults.RUN_ROUNDS, defaults.RUN_WARMUP)
    # --images: the default stream's length, or a fixed size's count (cli.run_workload)
    assert cli_options.run_workload(run).images == STREAM_IMAGES
    fixed = parsers["run"].parse_args(["--image-size", "240x320"])
    assert cli_options.run_workload(fixed).images == defaults.RUN_IMAGES
    gate = parsers["gate"].parse_args([])
    assert (gate.latency_pairs, gate.latency_rounds, gate.latency_cases) == (
        defaults.COMPARE_PAIRS, defaults.COMPARE_ROUNDS, defaults.COMPARE_CASES)
    assert parsers["report"].parse_args(["x"]).out == defaults.REPORT_OUT

    compare_help = " ".join(parsers["compare"].format_help().split())  # argparse wraps lines
    assert "Wilcoxon" in compare_help and "Mann-Whitney" not in compare_help and defaults.PAIR_TEST in compare_help
    assert f"default: {defaults.PAIR_THRESHOLD:g} across process pairs, {defaults.THRESHOLD:g} with" in compare_help
    assert f"default: {defaults.COMPARE_CASES} when live" in compare_help
    assert f"(default: {defaults.COMPARE_ROUNDS})" in compare_help
    assert "Mann-Whitney" not in cli.build_parser().format_help()
    gate_help = " ".join(parsers["gate"].format_help().split())
    # A list, not a Python tuple; spaced, so that argparse wraps between names, not inside one.
    assert ", ".join(defaults.GATE_CASES) in gate_help and "('" not in gate_help


def test_runner_and_compare_use_the_same_defaults():
    from mrcnn_bench.gates import ab, stats
    from mrcnn_bench.running import runner

    assert runner.RunOptions.__dataclass_fields__["rounds"].default == defaults.RUN_ROUNDS
    assert ab.CompareOptions.__dataclass_fields__["alpha"].default == defaults.ALPHA
    assert stats.compare_latency.__defaults__[0] == defaults.THRESHOLD


# ------------------------------------------------------------------------------------------------
# --help and --version load no torch


FAST = """
import sys
from mrcnn import cli as m
from mrcnn_bench.cli import commands as b
codes = [m.main(["--help"]), m.main(["--version"]), b.main(["--version"])]
codes += [b.main([c, "--help"]) for c in ("run", "compare", "gate", "report", "check-benchmarks", "list")]
codes.append(b.main(["--help"]))
print("torch" in sys.modules, codes, file=sys.stderr)
"""


def test_help_and_version_do_not_import_torch():
    proc = subprocess.run([sys.executable, "-c", FAST], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.stderr.strip().splitlines()[-1] == f"False {[0] * 10}", proc.stderr
    assert f"mrcnn-bench {exits.version_text('x').split(' ', 1)[1]}" in proc.stdout
    assert f"torch {metadata.version('torch')}" in proc.stdout  # read from the package's metadata, not torch


# ------------------------------------------------------------------------------------------------
# One exit-code table: 2 with one line on bad input, 3 with one line on a bug


def mrcnn_bad_invocations(tmp_path: Path) -> dict[str, list[list[str]]]:
    absent = str(tmp_path / "absent")
    out = ["--out", str(tmp_path / "out")]
    return {
        "synth": [["--format", "gif", *out], ["--bogus", *out]],
        "train": [["--recipe", "nosuch", *out], [*out],
                  [*out, "--steps", "1", "--no-progress", "--device", "cpu", "--data", absent]],
        "export": [["--canvas", "axb", *out], ["--weights", absent + ".pt", *out]],
    }


def test_mrcnn_exits_2_without_a_traceback_on_bad_input(tmp_path, capsys):
    cases = mrcnn_bad_invocations(tmp_path)
    assert set(cases) == set(mrcnn_cli.COMMANDS), "walk every subcommand"
    for command, argvs in [*cases.items(), ("", [["--bogus"], ["no-such-command"], []])]:
        for argv in argvs:
            full = [command, *argv] if command else argv
            assert mrcnn_cli.main(full) == exits.UNDECIDED, full
            err = capsys.readouterr().err
            assert err.strip() and "Traceback" not in err, (full, err)


@pytest.mark.parametrize(("main", "argv", "prog"), [
    (mrcnn_cli.main, ["synth", "--out", "x"], "mrcnn"),
    (cli.main, ["list"], "mrcnn-bench"),
])
def test_a_bug_is_an_internal_error_with_its_traceback_in_a_log(main, argv, prog, tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise KeyError("boom")

    if prog == "mrcnn":
        monkeypatch.setattr("mrcnn.data.synthetic.run", broken)
    else:
        monkeypatch.setattr(cli, "cmd_list", broken)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(argv) == exits.INTERNAL
    err = capsys.readouterr().err
    assert f"{prog} {argv[0]}: internal error: KeyError: 'boom'" in err and "Traceback" not in err
    (log,) = tmp_path.glob(f"{prog}-error-*.log")
    assert "Traceback" in log.read_text() and "boom" in log.read_text()


def _break_a_command(prog: str, error: BaseException, monkeypatch) -> None:
    """Make the command of ``_COMMANDS`` (``prog``'s) raise ``error``."""

    def broken(*args, **kwargs):
        raise error

    if prog == "mrcnn":
        monkeypatch.setattr("mrcnn.data.synthetic.run", broken)
    else:
        monkeypatch.setattr(cli, "cmd_list", broken)


_COMMANDS = [(mrcnn_cli.main, ["synth", "--out", "x"], "mrcnn"), (cli.main, ["list"], "mrcnn-bench")]


@pytest.mark.parametrize(("main", "argv", "prog"), _COMMANDS)
def test_a_plain_value_error_is_a_bug_not_the_users_mistake(main, argv, prog, tmp_path, monkeypatch, capsys):
    """Only a UsageError says "your input": a ValueError from a check inside the code is exit 3, with its log."""
    _break_a_command(prog, ValueError("an internal invariant broke"), monkeypatch)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(argv) == exits.INTERNAL
    err = capsys.readouterr().err
    assert f"{prog} {argv[0]}: internal error: ValueError: an internal invariant broke" in err
    assert "Traceback" not in err and exits.REPORT_BUG in err
    (log,) = tmp_path.glob(f"{prog}-error-*.log")
    assert "Traceback" in log.read_text() and "an internal invariant broke" in log.read_text()


@pytest.mark.parametrize(("main", "argv", "prog"), _COMMANDS)
@pytest.mark.parametrize("error", [exits.UsageError("--thing: no such file: x.json"),
                                   FileNotFoundError("--thing: no such file: x.json"),
                                   PermissionError("--thing: no such file: x.json")], ids=type)
def test_a_usage_error_or_an_os_error_is_one_line_and_exit_2(main, argv, prog, error, tmp_path, monkeypatch,
                                                             capsys):
    _break_a_command(prog, error, monkeypatch)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(argv) == exits.UNDECIDED
    err = capsys.readouterr().err
    assert err == f"{prog} {argv[0]}: error: --thing: no such file: x.json\n"
    assert not list(tmp_path.glob(f"{prog}-error-*.log")), "an input error is no bug: no log"


def test_the_input_errors_of_the_library_and_the_harness_are_usage_errors():
    """Every exception type that names bad input exits 2 through :func:`mrcnn.exits.guarded`, and still
    is a ValueError for the library callers that catch that."""
    from mrcnn.data.coco import CocoFormatError
    from mrcnn.engine.config import TrainSetupError
    from mrcnn.export.trust import UntrustedPackageError
    from mrcnn_bench.base.errors import UsageError as harness_usage_error
    from mrcnn_bench.base.vcs import GitError
    from mrcnn_bench.gates.accuracy_baseline import BaselineError
    from mrcnn_bench.running.cases import UserCasesError

    assert harness_usage_error is exits.UsageError, "one type: the harness's is the library's"
    assert issubclass(exits.UsageError, ValueError)
    for kind in (CocoFormatError, TrainSetupError, UntrustedPackageError, GitError, BaselineError, UserCasesError):
        assert issubclass(kind, exits.UsageError), kind

        def refuse(kind: type[Exception] = kind) -> int:
            raise kind("bad input")

        assert exits.guarded("prog", refuse) == exits.UNDECIDED, kind


def test_run_saves_the_run_file_before_printing_the_table(tmp_path, monkeypatch, capsys):
    from mrcnn_bench.reports import report
    from mrcnn_bench.running import records, runner, store

    done = []
    monkeypatch.setattr(runner, "run", lambda opts: SimpleNamespace(rows=[], info=SimpleNamespace(
        threads=1, interrupted=None)))
    monkeypatch.setattr(store, "environment", lambda threads, seed: {})
    monkeypatch.setattr(records, "to_document", lambda rows, info, name, env: SimpleNamespace(name=name, records=[]))
    monkeypatch.setattr(store, "save", lambda doc, path: done.append(path.name) or path)
    monkeypatch.setattr(report, "write", lambda doc, folder, with_plots: done.append("report files") or [])

    def no_tabulate(doc):
        raise ImportError("Missing optional dependency 'tabulate'.")

    monkeypatch.setattr(report, "markdown", no_tabulate)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert cli.main(["run", "--cases", "static/eager", "--out", str(tmp_path), "--name", "mine"]) == exits.INTERNAL
    assert done == ["mine.json", "report files"]  # both written before printing failed
    assert "wrote " + str(tmp_path / "mine.json") in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# One progress convention


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_a_bar_on_a_terminal_and_plain_lines_elsewhere(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    term = FakeTerminal()
    for _ in progress.progress(range(3), desc="work", stream=term):
        pass
    assert "\r" in term.getvalue() and "work" in term.getvalue()

    log = io.StringIO()
    for _ in progress.progress(range(3), desc="work", stream=log):
        pass
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and lines[0].startswith("work:") and "3/3" in lines[-1]
    assert len(lines) == 2  # the start and the end: the steps came faster than LINE_INTERVAL_S

    monkeypatch.setenv("CI", "true")  # a terminal in CI (e.g. a pty) gets lines too
    ci = FakeTerminal()
    for _ in progress.progress(range(3), desc="work", stream=ci):
        pass
    assert "\r" not in ci.getvalue() and "3/3" in ci.getvalue()

    off = io.StringIO()
    assert list(progress.progress(range(3), enabled=False, stream=off)) == [0, 1, 2]
    assert off.getvalue() == ""


def test_every_long_command_takes_no_progress():
    bench = bench_parsers()
    for command in ("run", "compare", "gate", "accuracy-gate"):
        assert bench[command].parse_args(
            [*(["a", "b"] if command == "compare" else []), "--no-progress"]).no_progress, command
    for name, (module_name, _) in mrcnn_cli.COMMANDS.items():
        if name == "export":
            continue  # one build, no loop to report on
        parser = argparse.ArgumentParser()
        __import__(module_name, fromlist=["add_arguments"]).add_arguments(parser)
        assert parser.parse_args(["--out", "x", "--no-progress"]).no_progress, name
        assert parser.parse_args(["--out", "x", "--quiet"]).no_progress, name  # the old spelling still works
        assert "--quiet" not in parser.format_help(), name


# ------------------------------------------------------------------------------------------------
# mrcnn-bench list


def test_list_names_every_case_and_why_one_cannot_run_here(capsys):
    assert cli.main(["list", "--json"]) == exits.PASSED
    inv = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in inv["cases"]] == list(CASES)
    cuda = next(c for c in inv["cases"] if c["name"] == "static/cuda")
    assert cuda["runs_here"] == torch.cuda.is_available()
    if not cuda["runs_here"]:
        assert cuda["why_not"] == "no CUDA device"
    assert {p["name"] for p in inv["presets"]} == {"tiny", "coco_r50_fpn"}
    assert cli.main(["list"]) == exits.PASSED
    text = capsys.readouterr().out
    assert all(name in text for name in CASES) and ("no CUDA device" in text) != torch.cuda.is_available()


def test_cpu_pinning_takes_a_taskset_list_of_cpus_this_process_may_use(capsys):
    allowed = sorted(os.sched_getaffinity(0))
    assert cli_args.parse_cpus(f"{allowed[0]}") == (allowed[0],)
    if len(allowed) > 1:
        assert cli_args.parse_cpus(f"{allowed[0]}-{allowed[1]}") == tuple(range(allowed[0], allowed[1] + 1))
    for bad in ("x", "9999", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            cli_args.parse_cpus(bad)
    assert cli.main(["run", "--cpus", "9999"]) == exits.UNDECIDED
    assert "may use only" in capsys.readouterr().err


def test_the_training_progress_is_a_few_lines_in_a_log_not_one_per_step(monkeypatch, capsys):
    monkeypatch.setenv("CI", "true")
    trainer = SimpleNamespace(total=200, state=SimpleNamespace(step=0), info=SimpleNamespace(main=True))
    hook = ProgressBar()
    hook.before_train(trainer)
    for step in range(200):
        hook.after_step(trainer, {"loss": 1.0 / (step + 1), "lr": 0.01})
    hook.after_train(trainer)
    lines = capsys.readouterr().err.splitlines()
    assert 2 <= len(lines) <= 3 and "200/200" in lines[-1] and "loss=" in lines[-1], lines


@pytest.mark.parametrize("argv", [["run", "--time-limit", "nan"], ["run", "--time-limit", "0"],
                                  ["run", "--peak-reps", "-1"], ["run", "--seed", "1e20"],
                                  ["run", "--seed", str(2**64)], ["compare", "a.json", "b.json", "--threshold", "inf"],
                                  ["compare", "a.json", "b.json", "--threshold", "nan"]])  # fmt: skip
def test_numeric_flags_are_finite_and_in_range_at_the_edge(argv, capsys):
    """A NaN time limit timed every bounded row out at once with exit 0; a huge seed failed deep in numpy."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    flag = next(a for a in argv if a.startswith("--"))
    assert flag in err.strip().splitlines()[-1] and "Traceback" not in err, err  # argparse's usage, then the line


def test_bounded_reads_numbers_within_their_range():
    seed = cli_args.bounded(int, 0, cli_args.SEED_MAX)
    assert seed("7") == 7 and seed(str(cli_args.SEED_MAX)) == cli_args.SEED_MAX
    assert cli_args.bounded(float, 0, low_open=True)("0.5") == 0.5
    for bad in ("-1", "1.5", "x", str(cli_args.SEED_MAX + 1)):
        with pytest.raises(argparse.ArgumentTypeError):
            seed(bad)
    with pytest.raises(argparse.ArgumentTypeError, match=r"is not in \[0, 4294967295\]"):
        seed("-1")
    with pytest.raises(argparse.ArgumentTypeError, match=r"'1' is not in \[0, 1\)"):
        cli_args.bounded(float, 0, 1, high_open=True)("1")
