"""Exact work counters per inference stage: the same integers for the same shapes in any call and any
process, stages that add up to the call, a one-op change seen in its stage alone, the asv benchmarks
that read them, and `mrcnn-bench steps --work` taking every change of theirs as a step."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mrcnn.config import get_config
from mrcnn.reference import torchvision_model
from mrcnn.weights import textured_images
from mrcnn_bench.changes import changepoints, history_series
from mrcnn_bench.cli import commands as cli
from mrcnn_bench.running.cases import CASES, Row, Workload
from mrcnn_bench.running.context import Context
from mrcnn_bench.running.pipelines import Pipeline
from mrcnn_bench.running.probes import count_flops
from mrcnn_bench.running.stages import STAGE_KEYS
from mrcnn_bench.running.work_counters import COUNTERS, OpCounter, as_dict, count_stage_work
from tests.helpers.asv_results import write_stage_result
from tests.helpers.git_line import git_line

REPO = Path(__file__).resolve().parents[2]
KEYS = list(STAGE_KEYS.values())
NETWORK = [k for k in KEYS if k not in ("outside", "total")]  # the stages whose shapes the config fixes


def pipeline(impl: str = "static") -> Pipeline:
    """An eager pipeline of the tiny preset on two different 240x320 images, with seeded random weights
    (no calibration: seconds saved) whose box classifier scores class 1 high, so that every one of the
    K detection slots is valid and the mask branch runs on all of them; called once, as the counts'
    callers do (torchvision's first call infers its RoIAlign scales, work no later call repeats)."""
    torch.manual_seed(0)
    weights = torchvision_model(get_config("tiny")).state_dict()
    weights["roi_heads.box_predictor.cls_score.bias"][1] = 10.0
    ctx = Context("tiny", {}, Workload("tiny", (240, 320), 1, 2), weights, textured_images(((240, 320),) * 2), [], 1, 0)
    p = Pipeline(Row(CASES[f"{impl}/eager"]), ctx)
    p.setup()
    p.call(0)
    return p


def counts(p: Pipeline, index: int = 0) -> dict[str, dict[str, int]]:
    return as_dict(count_stage_work(p.model, lambda: p.call(index)))


@pytest.fixture(scope="module")
def static() -> Pipeline:
    return pipeline()


@pytest.fixture(scope="module")
def static_counts(static) -> dict[str, dict[str, int]]:
    return counts(static)


# Prints the counts of call 0 of the static pipeline above, as JSON, from a fresh interpreter.
FRESH = ("import json; from tests.bench.test_work_counters import counts, pipeline; "
         "print(json.dumps(counts(pipeline())))")


def test_static_counts_follow_the_shapes_not_the_pixels_in_any_process(static, static_counts):
    """The network's stages count the same on another image (every stage has the same shapes); the
    host's mask pasting ("outside") resizes each mask to its box, so its bytes follow the boxes. The
    same image counts the same in this process and in two fresh ones, to the integer, whatever the
    number of threads."""
    # One thread each, two at once on two cores: another thread count than this process's, too.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    fresh = [subprocess.Popen([sys.executable, "-c", FRESH], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]  # fmt: skip
    other = counts(static, 1)
    assert {k: other[k] for k in NETWORK} == {k: static_counts[k] for k in NETWORK}
    assert counts(static, 0) == static_counts
    for proc in fresh:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        assert json.loads(out) == static_counts
    assert all(isinstance(v, int) for stage in static_counts.values() for v in stage.values())


@pytest.mark.parametrize("impl", ["static", "torchvision"])
def test_stages_add_up_to_the_call_and_each_counter_reads_right(impl, static, static_counts):
    """The stages split the call (by_stage: the rests are differences, "outside" what no stage module
    ran), so they add up to the total exactly and none is negative; the FLOPs are FlopCounterMode's of
    the call alone, and the operators the op counter's alone (neither mode changes what the other sees)."""
    p = static if impl == "static" else pipeline(impl)
    work = static_counts if impl == "static" else counts(p)
    for counter in COUNTERS:
        assert sum(work[k][counter] for k in KEYS if k != "total") == work["total"][counter]
        assert all(work[k][counter] >= 0 for k in KEYS), counter
    assert work["outside"]["flops"] == 0 and work["rpn_rest"]["flops"] == 0
    assert work["total"]["flops"] == count_flops(lambda: p.call(0))
    with torch.no_grad(), OpCounter() as alone:
        p.call(0)
    assert (alone.ops, alone.bytes) == (work["total"]["ops"], work["total"]["bytes"])


def test_one_more_op_shows_in_its_stage_alone(static, static_counts, monkeypatch):
    """An elementwise op added to the RPN head: one more operator and exactly its output's bytes in
    rpn_head, no FLOPs; a small matmul added to the mask head: exactly its FLOPs in mask_head. No other
    stage moves either time."""
    head, added = static.model.rpn.head, []
    original = head.forward

    def head_forward(*args, **kwargs):
        out = original(*args, **kwargs)
        added.append(out[0][0] + 0)  # x + 0: one more pass over the first objectness map
        return out

    monkeypatch.setattr(head, "forward", head_forward)
    plus = counts(static)
    extra = added[-1].numel() * added[-1].element_size()
    assert plus["rpn_head"] == {**static_counts["rpn_head"], "ops": static_counts["rpn_head"]["ops"] + 1,
                                "bytes": static_counts["rpn_head"]["bytes"] + extra}  # fmt: skip
    assert {k: plus[k] for k in KEYS if k not in ("rpn_head", "total")} == {
        k: static_counts[k] for k in KEYS if k not in ("rpn_head", "total")}
    monkeypatch.undo()

    mask_head, a, b = static.model.roi_heads.mask_head, torch.ones(8, 16), torch.ones(16, 4)
    original_mask = mask_head.forward
    monkeypatch.setattr(mask_head, "forward", lambda *args: (torch.mm(a, b), original_mask(*args))[1])
    plus = counts(static)
    assert plus["mask_head"]["flops"] == static_counts["mask_head"]["flops"] + 2 * 8 * 16 * 4
    assert plus["mask_head"]["ops"] == static_counts["mask_head"]["ops"] + 1
    assert plus["mask_head"]["bytes"] == static_counts["mask_head"]["bytes"] + 8 * 4 * 4  # the [8, 4] fp32 product
    assert {k: plus[k] for k in KEYS if k not in ("mask_head", "total")} == {
        k: static_counts[k] for k in KEYS if k not in ("mask_head", "total")}


@pytest.fixture
def suite():
    sys.path.insert(0, str(REPO / "bench" / "asv_suite"))
    try:
        yield importlib.import_module("benchmarks")
    finally:
        sys.path.remove(str(REPO / "bench" / "asv_suite"))


def _part(record=None, error=None, skipped=False):
    return {"record": record, "error": error, "seconds": 1.0, "skipped": skipped}


def test_asv_reads_each_stage_count_and_skips_what_was_not_counted(suite):
    work = {k: {"flops": 10, "ops": 20, "bytes": 30} for k in KEYS}
    cache = {"timing": {}, "compiles": {}, "accuracy": _part(), "work": {
        "static/eager": _part({**work, "backbone": {"flops": 11378196480, "ops": 201, "bytes": 127150848}}),
        "static/inductor": _part(error="mrcnn_bench.history.stage_work exited 1: boom"),
    }}  # fmt: skip
    bench = suite.StageWork()
    assert suite.StageWork.setup_cache is suite._Commit.setup_cache  # the one measurement per commit
    assert suite.StageWork.params == (suite.INFERENCE, KEYS)
    bench.setup(cache, "static/eager", "backbone")
    assert bench.track_flops(cache, "static/eager", "backbone") == 11378196480
    assert bench.track_ops(cache, "static/eager", "backbone") == 201
    assert bench.track_bytes(cache, "static/eager", "mask_head") == 30
    with pytest.raises(NotImplementedError, match="boom"):  # a failed count: skipped, never failed
        bench.setup(cache, "static/inductor", "backbone")
    with pytest.raises(NotImplementedError, match="work not counted"):
        bench.setup(cache, "torchvision/eager", "backbone")
    with pytest.raises(NotImplementedError, match="work not counted"):  # a commit measured before the counters
        bench.setup({k: v for k, v in cache.items() if k != "work"}, "static/eager", "backbone")
    del cache["work"]["static/eager"]["record"]["outside"]
    with pytest.raises(NotImplementedError, match="stage outside not counted"):
        bench.setup(cache, "static/eager", "outside")
    for method in (bench.track_flops, bench.track_ops, bench.track_bytes):
        assert method.unit.startswith("exact: any change is a step") and "eager fp32 CPU model" in method.unit


def test_steps_takes_every_change_of_a_work_count_as_a_step(tmp_path, capsys):
    """One more operator in the backbone at commit 3, taken back at commit 5: two steps, each at its
    commit, with no test (no p-value, a one-commit level included); the mask head never moved."""
    commits = git_line(tmp_path / "repo", 8)
    backbone = [201, 201, 201, 202, 202, 201, 201, 201]
    for k, commit in enumerate(commits):
        write_stage_result(tmp_path / "results" / "m1", commit, k, "StageWork.track_ops", backbone[k], 4)
    where = ("--results", str(tmp_path / "results"), "--machine", "m1", "--repo", str(tmp_path / "repo"),
             "--revs", "HEAD")  # fmt: skip
    assert cli.main(["steps", *where, "--work", "--json"]) == 1
    out, err = capsys.readouterr()
    metric = "StageWork.track_ops(static/eager, backbone)"
    assert [(p["metric"], p["commit"], p["index"], p["before"], p["after"], p["p_value"], p["direction"])
            for p in json.loads(out)] == [(metric, commits[3][:8], 3, 201, 202, None, "regression"),
                                          (metric, commits[5][:8], 5, 202, 201, None, "improvement")]  # fmt: skip
    assert "any change between consecutive commits is a step, no p-value" in err
    assert f"| {metric} | {commits[3][:8]} | 3 | 201 | 202 | +0.50% | exact | regression |" in err
    assert history_series.exact_metrics({metric: ([], []), "Latency.track_ratio(static/eager)": ([], [])}) == {metric}
    # A noisy series is never taken step by step unless named exact.
    assert changepoints.exact_steps([1.0, 1.0, 2.0, 2.0, 1.0]) == [(2, None), (4, None)]
