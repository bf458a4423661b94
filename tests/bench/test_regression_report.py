"""The regression report: levels with intervals, the stages that moved, steps after unmeasured
commits, escaping, and the report of main's own history."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from mrcnn_bench.changes import changepoints, history_series  # noqa: E402
from mrcnn_bench.changes import levels as series_levels  # noqa: E402
from mrcnn_bench.changes import regression_report as report  # noqa: E402
from mrcnn_bench.changes.changepoints import ChangePoint  # noqa: E402


def point(metric: str, commit: str, index: int, change: float, direction: str = "regression") -> ChangePoint:
    return ChangePoint(metric, commit, index, 1.0, 1.0 + change / 100, change, 1e-4, direction)


def test_a_level_is_its_mean_with_a_t_interval():
    values = [1.0, 1.02, 0.98, 1.01]
    got = series_levels.level(values)
    half = stats.t.ppf(0.975, 3) * stats.tstd(values) / 2
    assert got.mean == pytest.approx(1.0025) and got.n == 4
    assert (got.low, got.high) == pytest.approx((1.0025 - half, 1.0025 + half))
    one = series_levels.level([2.0])
    assert one.n == 1 and math.isnan(one.low) and "no interval" in one.text()


def test_levels_end_at_the_neighbouring_change_points():
    values = [1.0] * 4 + [1.1] * 3 + [1.2] * 5
    points = [point("m", "c4", 4, 10.0), point("m", "c7", 7, 9.1)]
    before, after = series_levels.levels(points, values, points[1])
    assert (before.mean, before.n, after.mean, after.n) == (pytest.approx(1.1), 3, pytest.approx(1.2), 5)
    before, _ = series_levels.levels(points, values, points[0])
    assert before.n == 4


def test_only_stages_that_stepped_the_same_way_within_one_commit_are_named():
    position = {f"c{i}": i for i in range(10)}
    step = point("Latency.track_ratio(static/eager)", "c5", 5, 3.0)
    stages = [point("Stages.track_ratio(static/eager, backbone)", "c5", 5, 6.5),
              point("Stages.track_ratio(static/eager, mask_head)", "c6", 6, 4.0),
              point("Stages.track_ratio(static/eager, outside)", "c8", 8, 5.0),  # too far
              point("Stages.track_ratio(static/eager, rpn_head)", "c5", 5, -4.0, "improvement")]
    moved = report.moved_with(step, stages, position)
    assert [s.metric for s in moved] == [stages[0].metric, stages[1].metric]
    assert report.moved_with(point("x", "unknown", 0, 3.0), stages, position) == []


def test_an_unreadable_a_a_study_is_exit_2(tmp_path):
    assert report.main(["--noise", str(tmp_path / "none"), "--md", str(tmp_path / "r.md")]) == 2
    assert not (tmp_path / "r.md").exists()


def test_a_step_after_unmeasured_commits_names_the_range_to_confirm_and_bisect():
    level = report.Level(1.0, 0.9, 1.1, 3)
    entry = report.Regression("main", "m", point("Latency.track_ratio(static/eager)", "bbbb2222", 5, 4.0),
                              "bbbb2222" * 5, "aaaa1111" * 5, "subject", level, level, [], "", "cmd", unmeasured=3)
    text = report.markdown([entry])
    assert r"the 3 commit\(s\) that change the library between aaaa1111 and bbbb2222" in text
    assert r"aaaa1111\.\.bbbb2222" in text and "Confirm (the last commit measured before it first)" in text
    assert "aaaa1111..bbbb2222" in report.page([report.Section("main", "m", [entry.point], [entry])])
    plain = report.markdown([dataclasses.replace(entry, unmeasured=0)])
    assert "No value" not in plain and "Confirm (the parent first)" in plain
    assert "Control" not in text
    control = dataclasses.replace(entry, point=point("Latency.track_ratio(torchvision/eager)", "bbbb2222", 5, 2.0))
    assert "Control: torchvision" in report.markdown([control])
    assert "Control: torchvision" in report.page([report.Section("main", "m", [control.point], [control])])
    # An improvement has no block: the page's table of change points carries its gap instead.
    better = point("Training.track_ratio(static/train)", "cccc3333", 7, -9.0, "improvement")
    gap = report.page([report.Section("main", "m", [better], [], gaps={(better.metric, 7): ("aaaa1111" * 5, 21)})])
    assert "<td>21 since aaaa1111: the step lies in aaaa1111..cccc3333</td>" in gap
    assert "since" not in report.page([report.Section("main", "m", [better], [])]).split("<table>")[1]


def test_subjects_are_escaped_in_the_markdown_and_the_page():
    level = report.Level(1.0, 0.9, 1.1, 3)
    bad = "<script>alert(1)</script> [x](javascript:y) | *bold*"
    entry = report.Regression("main", "m<1>", point("Latency.track_ratio(static/eager)", "abcd1234", 3, 3.0),
                              "abcd1234" * 5, "p" * 40, bad, level, level, [], "index.html#x?a='b'", "cmd <x>")
    text = report.markdown([entry])
    assert "<script>" not in text and "](javascript" not in text and "\\<script\\>" in text
    page = report.page([report.Section("main", "m<1>", [entry.point], [entry])])
    assert "<script>" not in page and "&lt;script&gt;" in page and "cmd &lt;x&gt;" in page
    assert "href=\"index.html#x?a=&#x27;b&#x27;\"" in page
    assert report.markdown([]).startswith("No regression")


def _main_has_history() -> bool:
    done = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", "5505aa86^{commit}"], capture_output=True)
    return done.returncode == 0


@pytest.mark.skipif(not _main_has_history(), reason="needs main's git history (a full clone)")
def test_the_report_of_mains_history_names_its_parent_and_the_graph(tmp_path):
    try:
        changepoints.otava_python()
    except ValueError as e:  # `make test` builds it: in CI its absence fails
        if "CI" in os.environ:
            raise
        pytest.skip(str(e))
    md, page = tmp_path / "report.md", tmp_path / "changes.html"
    code = report.main(["--results", str(ROOT / "results/asv"), "--repo", str(ROOT), "--line", "main=main",
                        "--machine", "amd-epyc-f25m17-2c-fx021d390f",
                        "--md", str(md), "--html", str(page), "--dashboard", "https://example.invalid/"])
    assert code == 0
    text = md.read_text()
    # The padding commit raised 1 - box AP on this host's fixture: a regression with its parent.
    assert "at 5505aa86" in text and "for r in 2d58bc49 5505aa86" in text
    assert "<https://example.invalid/index.html#benchmarks.Accuracy.track_box_error?" in text
    assert "amd-epyc-f25m17-2c-fx021d390f" in page.read_text()


@pytest.mark.skipif(not _main_has_history(), reason="needs main's git history (a full clone)")
def test_unmeasured_commits_are_those_that_change_the_library_in_between():
    # 25ad72d, 2d58bc4 (gates only), 5505aa8 (the masking, in mrcnn/), 8540fa6.
    assert history_series.unmeasured_between(ROOT, "25ad72d0", "8540fa65") == 1  # 5505aa86
    assert history_series.unmeasured_between(ROOT, "5505aa86", "8540fa65") == 0
    assert history_series.unmeasured_between(ROOT, "25ad72d0", "5505aa86") == 0  # commits between leave mrcnn/ alone
    assert history_series.unmeasured_between(ROOT, "not-a-commit", "8540fa65") == 0


def test_the_dashboard_links_the_page_once(tmp_path):
    index = tmp_path / "index.html"
    assert not report.link_from_dashboard(tmp_path / "changes.html")  # no dashboard: nothing to do
    index.write_text(f"<ul>{report.NAV_ANCHOR}</ul>")
    assert report.link_from_dashboard(tmp_path / "changes.html")
    assert report.link_from_dashboard(tmp_path / "changes.html")
    assert index.read_text().count('href="changes.html"') == 1
    index.write_text("<ul></ul>")  # an asv whose page has no such entry: left alone
    assert not report.link_from_dashboard(tmp_path / "changes.html") and index.read_text() == "<ul></ul>"
