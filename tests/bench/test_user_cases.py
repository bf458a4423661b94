"""Users' own cases: a module named in $MRCNN_BENCH_CASES adds cases that every front end sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mrcnn.exits import UsageError
from mrcnn_bench.running.cases import USER_CASES_ENV, Case, Row, add_case, register_implementation

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "bench" / "examples"


def with_cases(module: str, *paths: Path) -> dict[str, str]:
    path = os.pathsep.join([*map(str, paths), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, USER_CASES_ENV: module, "PYTHONPATH": path}


def bench(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mrcnn_bench", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def test_the_readme_example_runs_beside_the_built_in_cases(tmp_path):
    env = with_cases("my_cases", EXAMPLES)
    listed = bench(["list", "--json"], env, timeout=300)
    assert listed.returncode == 0, listed.stderr
    names = [c["name"] for c in json.loads(listed.stdout)["cases"]]
    assert {"tv_v2/eager", "static/eager+k32", "static/eager"} <= set(names)

    cases = "torchvision/eager,static/eager+k32,tv_v2/eager"
    run = bench(["run", "--cases", cases, "--rounds", "3", "--images", "1", "--peak-reps", "0", "--no-flops",
                 "--no-plots", "--no-progress", "--out", str(tmp_path), "--name", "mine"], env)
    assert run.returncode == 0, run.stderr
    records = {r["case"]: r for r in json.loads((tmp_path / "mine.json").read_text())["records"]}
    assert all(records[c]["status"] == "ok" and len(records[c]["times_s"]) == 3 for c in cases.split(","))
    assert records["static/eager+k32"]["variant_overrides"] == {"box_detections_per_img": 32}
    assert records["tv_v2/eager"]["impl"] == "tv_v2"


QUICK_MODULE = """
from mrcnn_bench.running.cases import Case, add_case
add_case(Case("static", tag="k16", overrides=(("box_detections_per_img", 16),)), quick=True)
"""

CHECK = """
import sys
sys.path.insert(0, {suite!r})
from mrcnn_bench.running import cases
import benchmarks  # the asv suite
assert "static/eager+k16" in cases.QUICK and "static/eager+k16" in cases.TRACKED, cases.QUICK
assert "static/eager+k16" in benchmarks.Latency.params, benchmarks.Latency.params
print("ok")
"""


def test_a_quick_case_reaches_asv_and_pytest_benchmark(tmp_path):
    (tmp_path / "quick_cases.py").write_text(QUICK_MODULE)
    check = CHECK.format(suite=str(REPO / "bench" / "asv_suite"))
    proc = subprocess.run([sys.executable, "-c", check], env=with_cases("quick_cases", tmp_path, REPO / "bench"),
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


BROKEN = {  # module source -> the one line every command prints (exit 2): its start
    None: "$MRCNN_BENCH_CASES: cannot load 'broken_cases': ModuleNotFoundError: No module named 'broken_cases'",
    "raise RuntimeError('typo in my cases')\n":
        "$MRCNN_BENCH_CASES: cannot load 'broken_cases': RuntimeError: typo in my cases",
    "def cases(:\n": "$MRCNN_BENCH_CASES: cannot load 'broken_cases': SyntaxError: ",  # its text varies by Python
    "from mrcnn_bench.running.cases import Case, add_case\nadd_case(Case('static'))\n":
        "$MRCNN_BENCH_CASES: cannot load 'broken_cases': UsageError: a case named 'static/eager' already exists",
}


def assert_one_line_exit_2(proc: subprocess.CompletedProcess, message: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"mrcnn-bench: error: {message}"), proc.stderr


@pytest.mark.parametrize("source", list(BROKEN), ids=["missing", "raises", "syntax", "bad-add_case"])
def test_a_module_that_fails_to_load_is_named_in_one_line_exit_2(source, tmp_path):
    if source is not None:
        (tmp_path / "broken_cases.py").write_text(source)
    env = with_cases("broken_cases", tmp_path)
    for args in (["list"], ["run", "--cases", "static/eager"], ["--version"]):  # before parsing: --help alike
        assert_one_line_exit_2(bench(args, env, timeout=300), BROKEN[source])


def test_an_entry_point_that_fails_to_load_is_named_in_one_line_exit_2(tmp_path):
    dist = tmp_path / "my_cases_pkg-0.1.dist-info"  # an installed package declaring the entry point
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-cases-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[mrcnn_bench.cases]\nmine = no_such_package.my_cases\n")
    proc = bench(["list"], with_cases("", tmp_path), timeout=300)
    assert_one_line_exit_2(proc, "entry point mine = 'no_such_package.my_cases' of group mrcnn_bench.cases: "
                                 "cannot load: ModuleNotFoundError: No module named 'no_such_package'")


def test_case_rules_and_round_trip():
    with pytest.raises(UsageError, match="needs a tag"):  # a user's case module's mistake: exit 2
        Case("static", overrides=(("box_detections_per_img", 8),))
    with pytest.raises(UsageError, match="impl 'nope'"):  # a user's case module's mistake: exit 2
        Case("nope")
    with pytest.raises(UsageError, match="already"):  # a user's case module's mistake: exit 2
        register_implementation("static", "static", "x:y")
    with pytest.raises(UsageError, match="already exists"):  # a user's case module's mistake: exit 2
        add_case(Case("static"))
    case = Case("static", tag="k8", overrides=[["box_detections_per_img", 8]])  # as JSON gives it
    row = Row(case)
    assert Row.from_dict(json.loads(json.dumps(row.to_dict()))) == row and hash(row) == hash(Row(case))
    assert case.name == "static/eager+k8"


def test_a_builder_that_does_not_load_is_refused_before_set_up(tmp_path):
    """The module registering the case loads, but the builder it names does not: found when --cases is
    read, in one line naming the case and the builder, not in each row's worker after set-up began."""
    (tmp_path / "late_cases.py").write_text(
        "from mrcnn_bench.running.cases import Case, add_case, register_implementation\n"
        "register_implementation('late', interface='torchvision', builder='late_builder:make')\n"
        "add_case(Case('late'))\n")
    (tmp_path / "late_builder.py").write_text("raise RuntimeError('typo in my builder')\n")
    proc = bench(["run", "--cases", "late/eager", "--rounds", "1", "--no-progress"], with_cases("late_cases", tmp_path),
                 timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "case late/eager: builder 'late_builder:make' cannot be loaded: RuntimeError: typo in my builder" \
        in proc.stderr
