"""The work counters in the regression report: every change of an exact counter is a step found at its
commit with its stage, the block of a latency step names the work of its case that changed with it,
and every rise in work is listed."""

from __future__ import annotations

import dataclasses

from mrcnn_bench.changes import regression_report as report
from mrcnn_bench.changes import work_steps
from mrcnn_bench.changes.changepoints import ChangePoint
from tests.helpers.asv_results import write_stage_result
from tests.helpers.git_line import git_line

FLOPS = 2.0e9


def test_an_exact_counter_steps_at_its_commit_with_its_stage(tmp_path):
    """1% more mask-head FLOPs at commit 6 (and back at 9), the backbone unchanged: found there, with
    no p-value, and nowhere else."""
    commits = git_line(tmp_path / "repo", 12)
    for k, commit in enumerate(commits):
        mask_head = FLOPS * (1.01 if 6 <= k < 9 else 1.0)
        write_stage_result(tmp_path / "results" / "m1", commit, k, "StageWork.track_flops", 5 * FLOPS, mask_head)
    found = work_steps.steps(tmp_path / "results", "m1", commits)
    assert [(w.metric, w.commit, w.direction, w.p_value) for w in found] == [
        ("StageWork.track_flops(static/eager, mask_head)", commits[6][:8], "regression", None),
        ("StageWork.track_flops(static/eager, mask_head)", commits[9][:8], "improvement", None)]
    assert [round(w.change_pct, 6) for w in found] == [1.0, round(100 * (1 / 1.01 - 1), 6)]
    assert work_steps.rises(found) == found[:1]
    table = work_steps.markdown([("main", "m1", found)])
    assert "More work at a commit (exact counters" in table and commits[6][:8] in table
    assert commits[9][:8] not in table, "a fall in work is not listed as more work"
    assert work_steps.steps(tmp_path / "results", "m1", commits[:2]) == [], "too few commits: no series"


def test_a_machine_without_counters_has_no_work_steps(tmp_path):
    commits = git_line(tmp_path / "repo", 6)
    for k, commit in enumerate(commits):
        write_stage_result(tmp_path / "results" / "m1", commit, k, "Stages.track_ratio", 1.0, 1.0)
    assert work_steps.steps(tmp_path / "results", "m1", commits) == []


def _step(metric: str, commit: str, change: float) -> ChangePoint:
    return ChangePoint(metric, commit, 0, 1.0, 1.0 + change / 100, change, None,
                       "regression" if change > 0 else "improvement")


def test_a_block_names_the_work_of_its_case_that_changed_with_it():
    position = {f"c{i}": i for i in range(10)}
    latency = ChangePoint("Latency.track_ratio(static/eager)", "c5", 5, 1.0, 1.03, 3.0, 1e-4, "regression")
    work = [_step("StageWork.track_ops(static/eager, rpn_rest)", "c5", 0.4),
            _step("StageWork.track_bytes(static/eager, backbone)", "c4", -2.0),  # either direction
            _step("StageWork.track_flops(static/inductor, mask_head)", "c5", 1.0),  # another case
            _step("StageWork.track_flops(static/eager, outside)", "c8", 1.0)]  # too far
    near = work_steps.near(latency, work, position)
    assert near == work[:2]
    level = report.Level(1.0, 0.9, 1.1, 3)
    entry = report.Regression("main", "m", latency, "c5" * 20, "c4" * 20, "subject", level, level, work=near)
    text = report.markdown([entry])
    assert "Work that changed with it (exact counters" in text and r"track\_ops(static/eager, rpn\_rest)" not in text
    assert r"track\_ops\(static/eager, rpn\_rest\) \+0\.40% at c5" in text
    page = report.page([report.Section("main", "m", [latency], [entry], work=work)])
    assert "Work that changed with it: track_ops(static/eager, rpn_rest) +0.40% at c5" in page
    assert "More work at a commit" in page
    assert "Work that changed" not in report.markdown([dataclasses.replace(entry, work=[])])
