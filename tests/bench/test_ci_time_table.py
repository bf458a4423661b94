"""The table of where the unit tests' time went (bench/studies/ci_time/suite_durations.py): per
module and per test, setup included, from two pytest JUnit XML files; a file that is not one exits
with one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "studies" / "ci_time"))

import suite_durations  # noqa: E402


def _junit(path: Path, wall: float, cases: list[tuple[str, str, float, str]]) -> Path:
    body = "".join(
        f'<testcase classname="{m}" name="{t}" time="{s}">' + (f"<{o}/>" if o != "passed" else "") + "</testcase>"
        for m, t, s, o in cases)
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest" time="{wall}">{body}'
                    "</testsuite></testsuites>")
    return path


def test_modules_and_tests_ranked_by_the_first_run_with_the_second_beside(tmp_path):
    kept = [("tests.a", "t2", 50.0, "passed"), ("tests.b", "t3", 40.0, "passed")]
    before = _junit(tmp_path / "before.xml", 300.0,
                    [("tests.a", "t1", 200.0, "failure"), *kept, ("tests.b", "gone", 10.0, "skipped")])
    after = _junit(tmp_path / "after.xml", 120.0, [("tests.a", "t1", 20.0, "passed"), *kept])
    text = suite_durations.table(before, after, top=3)
    assert "| suite's wall time (s) | 300 | 120 |" in text and "| failure | 1 | 0 |" in text
    assert "| tests.a | 250.0 | 70.0 |" in text and "| tests.b | 50.0 | 40.0 |" in text
    rows = [line for line in text.splitlines() if line.startswith("| tests.") and "::" in line]
    assert rows == ["| tests.a::t1 | 200.0 | 20.0 |", "| tests.a::t2 | 50.0 | 50.0 |", "| tests.b::t3 | 40.0 | 40.0 |"]
    missing = suite_durations.table(before, after, top=4)
    assert "| tests.b::gone | 10.0 |  |" in missing  # absent from the second run: blank


def test_a_file_that_is_not_junit_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text("<html>")
    with pytest.raises(SystemExit, match=r"cannot read .*bad.xml"):
        suite_durations.table(bad, bad, top=3)
    other = tmp_path / "other.xml"
    other.write_text("<report/>")
    with pytest.raises(SystemExit, match="no <testsuite>"):
        suite_durations.table(other, other, top=3)
