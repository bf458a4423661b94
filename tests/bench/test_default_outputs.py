"""Nothing written into the committed tree by a default command.

A command run with its defaults must leave ``git status`` as it found it: every default output path,
taken relative to the repository root, must be one git ignores (``out/``, ``.asv/``, ``data/``, ...)
and hold no tracked file (``git ls-files``). Checked for

- every output-like option of ``mrcnn-bench`` and ``mrcnn``, each subcommand's parser built as the
  command line builds it (the lazily loaded ones included), plus the paths the gates write with
  ``--write-baseline`` when ``--baseline`` is not given;
- the literal ``--out`` defaults of the harness's modules and tools, and of the studies (read from the
  source: the scripts are not imported);
- the Makefile: the ``--out``-like words of each target's recipe.

Exceptions are the allow-lists below, each with its reason; a default on none of them that lands in
the committed tree fails, naming the command, the option and the path.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import re
import subprocess
from pathlib import Path

import pytest

from mrcnn import cli as mrcnn_cli
from mrcnn_bench.cli import asv
from mrcnn_bench.cli import commands as bench_cli

REPO = Path(__file__).resolve().parents[2]
# Option destinations that name where a command writes (not what it reads).
OUTPUT_DESTS = frozenset({"out", "out_dir", "output", "accuracy_out", "json", "data", "results"})
# Recipe words of the Makefile that name where a target writes.
MAKE_OUTPUT_FLAGS = ("--out", "--accuracy-out", "--benchmark-json", "--md", "--html")

# Where a default may write into the committed tree: path prefix -> why.
ALLOWED = {
    "results/asv/": "asv's results (asv.conf.json results_dir) and the tools that read and extend them: the "
                    "dashboard's series are the committed results",
    "baselines/": "--write-baseline: a new baseline is written to be committed with the change that justifies it",
}
# Studies write their evidence under results/, where their READMEs point.
STUDY_ALLOWED = "results/"
# Makefile targets whose recipe writes into the committed tree: target -> (prefix, why).
MAKE_ALLOWED = {
    "asv-table": ("results/asv/", "the held figures per commit, beside asv's results they summarise"),
    "asv-spread": ("results/asv/", "the A/A spread of one commit: asv results"),
    "asv-publish": ("results/", "the regression report beside asv's results (results/asv/regressions_report.md, "
                                "committed) and its dashboard page in results/html (built, git-ignored)"),
}
# Every other target writes under one of these (both git-ignored).
MAKE_OUTPUT_ROOTS = ("out/", ".asv/")


@functools.cache
def _tracked() -> tuple[str, ...]:
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not proc.stdout:
        pytest.skip("not a git checkout: the committed tree is unknown")
    return tuple(sorted(proc.stdout.split("\0")))


def _ignored(paths: list[str]) -> set[str]:
    """The paths git ignores (a folder's pattern matches the files under it, so ``p/_`` stands for ``p/``)."""
    proc = subprocess.run(["git", "check-ignore", "--stdin"], cwd=REPO, input="\n".join(paths) + "\n",
                          capture_output=True, text=True, check=False)
    return set(proc.stdout.splitlines())


def committed(default: str | Path) -> str | None:
    """Why writing to ``default`` (from the repository root) would change the committed tree; None: it would not.

    Outside the repository (an absolute path elsewhere) is fine; inside it, the path must be git-ignored
    (itself, or as a folder) and hold no tracked file.
    """
    path = Path(default)
    if path.is_absolute():
        if not path.is_relative_to(REPO):
            return None
        path = path.relative_to(REPO)
    rel = path.as_posix().removeprefix("./").rstrip("/")
    if any(f == rel or f.startswith(rel + "/") for f in _tracked()):
        return f"{rel} holds tracked files"
    if not _ignored([rel, f"{rel}/_"]):
        return f"{rel} is not git-ignored: it would show in git status, inside the committed tree"
    return None


def allowed(default: str | Path, prefixes: dict[str, str]) -> bool:
    path = Path(default)
    rel = (path.relative_to(REPO) if path.is_absolute() and path.is_relative_to(REPO) else path).as_posix()
    rel = rel.removeprefix("./").rstrip("/") + "/"  # a prefix's own folder is inside it
    return any(rel.startswith(p) for p in prefixes)


# ------------------------------------------------------------------------------------------------
# The command lines' parsers


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _lazy(module_name: str, prog: str) -> argparse.ArgumentParser:
    """A subcommand's parser as run_lazy / run_command build it once its module is imported."""
    parser = argparse.ArgumentParser(prog=prog)
    importlib.import_module(module_name).add_arguments(parser)
    return parser


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """``"mrcnn-bench run"`` -> its parser, for every subcommand of both command lines."""
    parsers = {f"mrcnn-bench {name}": p for name, p in _subparsers(bench_cli.build_parser()).items()
               if name not in bench_cli.LAZY_COMMANDS}
    parsers |= {f"mrcnn-bench {name}": _lazy(module, f"mrcnn-bench {name}")
                for name, (module, _) in bench_cli.LAZY_COMMANDS.items() if name != "asv"}
    parsers |= {f"mrcnn-bench asv {tool}": p for tool, p in asv.parsers("mrcnn-bench asv").items()}
    parsers |= {f"mrcnn {name}": _lazy(module, f"mrcnn {name}") for name, (module, _) in mrcnn_cli.COMMANDS.items()}
    return parsers


def output_defaults(parser: argparse.ArgumentParser) -> list[tuple[str, str | Path]]:
    """(option, default) of each output-like option with a path default (None: writes nothing, or a temp folder)."""
    return [(a.option_strings[0] if a.option_strings else a.dest, a.default) for a in parser._actions
            if a.dest in OUTPUT_DESTS and isinstance(a.default, (str, Path))]


def test_every_subcommand_is_seen():
    names = set(command_parsers())
    assert {"mrcnn-bench report", "mrcnn-bench gate", "mrcnn-bench accuracy-gate", "mrcnn export"} <= names
    assert {"mrcnn train", "mrcnn synth", "mrcnn-bench run", "mrcnn-bench export-time"} <= names


def test_no_command_line_default_writes_into_the_committed_tree():
    found = {(cmd, opt): default for cmd, p in command_parsers().items() for opt, default in output_defaults(p)}
    assert ("mrcnn-bench report", "--out") in found and ("mrcnn export", "--out") in found
    problems = [f"{cmd} {opt} {default}: {why}" for (cmd, opt), default in found.items()
                if (why := committed(default)) and not allowed(default, ALLOWED)]
    assert problems == []


def test_the_gates_write_new_baselines_only_under_baselines():
    """--write-baseline without --baseline: the allow-listed baselines/ (a tree clean outside it)."""
    from mrcnn_bench.gates import accuracy_baseline, gate

    for path in (gate.baseline_path("tiny"), accuracy_baseline.default_baseline_path("ci")):
        assert allowed(path, {"baselines/": ALLOWED["baselines/"]}), path


# ------------------------------------------------------------------------------------------------
# Scripts' literal defaults (read from the source, not imported)


def literal_out_defaults(path: Path) -> list[tuple[int, str]]:
    """(line, default) of each ``add_argument("--out", default=Path("...") or "...")`` in a script."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        flags = [a.value for a in node.args if isinstance(a, ast.Constant)]
        if not any(isinstance(f, str) and f.lstrip("-").replace("-", "_") in OUTPUT_DESTS for f in flags):
            continue
        for kw in node.keywords:
            value = kw.value
            if kw.arg == "default" and isinstance(value, ast.Call) and getattr(value.func, "id", "") == "Path":
                value = value.args[0] if value.args else value
            if kw.arg == "default" and isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.append((node.lineno, value.value))
    return found


def test_the_harness_and_its_tools_write_no_literal_default_into_the_committed_tree():
    scripts = sorted((REPO / "bench" / "mrcnn_bench").glob("*.py")) + sorted((REPO / "bench" / "tools").glob("*.py"))
    problems = [f"{s.relative_to(REPO)}:{line} {default}: {why}" for s in scripts
                for line, default in literal_out_defaults(s)
                if (why := committed(default)) and not allowed(default, ALLOWED)]
    assert problems == []


def test_studies_write_their_evidence_under_results_or_outside_the_tree():
    studies = sorted((REPO / "bench" / "studies").glob("*/*.py"))
    assert studies
    problems = [f"{s.relative_to(REPO)}:{line} {default}: {why}" for s in studies
                for line, default in literal_out_defaults(s)
                if (why := committed(default)) and not allowed(default, {STUDY_ALLOWED: "studies"})]
    assert problems == []


# ------------------------------------------------------------------------------------------------
# The Makefile


def makefile_outputs(text: str) -> dict[str, list[str]]:
    """Target -> the paths its recipe names after ``--out``-like words, make variables and shell defaults expanded."""
    variables = dict(re.findall(r"^(\w+)\s*[:?]?=\s*(.*?)\s*$", text, re.MULTILINE))
    outputs: dict[str, list[str]] = {}
    target = None
    flags = "|".join(map(re.escape, MAKE_OUTPUT_FLAGS))
    for line in text.replace("\\\n", " ").splitlines():
        if m := re.match(r"^([^\s:#=][^:=]*):(?!=)", line):
            target = m.group(1).strip()
        elif line.startswith("\t") and target:
            for word in re.findall(rf"(?:{flags})[= ]+(\S+)", line):
                word = re.sub(r"\$\((\w+)\)", lambda v: variables.get(v.group(1), v.group(0)), word.strip("\"'"))
                word = re.sub(r"^\$\$\{\w+:-(.*)\}$", r"\1", word)  # "$${OUT:-default}": the default
                outputs.setdefault(target, []).append(word)
    return outputs


def test_makefile_targets_write_under_out_unless_allowed():
    outputs = makefile_outputs((REPO / "Makefile").read_text(encoding="utf-8"))
    assert {"bench", "gate", "bench-quick"} <= set(outputs)  # the parse sees the recipes
    problems = []
    for target, paths in outputs.items():
        prefix = MAKE_ALLOWED[target][0] if target in MAKE_ALLOWED else None
        for path in paths:
            ok = path.startswith(prefix) if prefix else path.startswith(MAKE_OUTPUT_ROOTS) and not committed(path)
            if not ok:
                problems.append(f"make {target}: {path}")
    assert problems == []


# ------------------------------------------------------------------------------------------------
# The checks catch what they are for


def test_the_check_flags_a_default_inside_the_committed_tree():
    assert committed("results/report") and not allowed("results/report", ALLOWED)
    assert committed("bench/out.json") and committed("README.md") and committed(REPO / "results" / "x")
    assert committed("out/report") is None and committed(".asv/x") is None and committed("/tmp/x") is None
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="results/report")
    parser.add_argument("--cases", default="results/cases")  # not an output option
    assert output_defaults(parser) == [("--out", "results/report")]


def test_the_makefile_parse_flags_an_output_outside_out(tmp_path):
    text = ("OUTDIR := results/x\nbench:\n\tmrcnn-bench run --out $(OUTDIR) --name a \\\n"
            "\t\t--accuracy-out out/y\nasv-table:\n\ttool --out \"$${OUT:-results/asv/$$name.md}\"\n")
    assert makefile_outputs(text) == {"bench": ["results/x", "out/y"], "asv-table": ["results/asv/$$name.md"]}
    script = tmp_path / "study.py"
    script.write_text('p.add_argument("--out", type=Path, default=Path("bench/evidence"))\n')
    assert literal_out_defaults(script) == [(1, "bench/evidence")]
