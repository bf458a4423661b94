"""The stage profile: a call split into the model's stages (on a fake clock: no timing in the
assertions), every stage timed and counted for both models, and each stage's share of the ceiling."""

from __future__ import annotations

import pytest
import torch

from mrcnn_bench.reports import report
from mrcnn_bench.running.cases import Workload
from mrcnn_bench.running.context import ContextOptions, make_context
from mrcnn_bench.running.profile import stage_profile, stage_times
from mrcnn_bench.running.records import RunDocument, RunInfo
from mrcnn_bench.running.stages import STAGE_KEYS, STAGES


class _Tick(torch.nn.Module):
    """Advances the fake clock by ``cost`` then runs its children."""

    def __init__(self, clock: list[float], cost: float = 0.0, **children: torch.nn.Module) -> None:
        super().__init__()
        self.clock, self.cost = clock, cost
        for name, child in children.items():
            self.add_module(name, child)

    def forward(self, x):
        self.clock[0] += self.cost
        for child in self.children():
            x = child(x)
        return x


def test_stage_times_split_a_call_into_stages():
    clock = [0.0]
    t = lambda cost=0.0, **kw: _Tick(clock, cost, **kw)  # noqa: E731
    model = t(backbone=t(body=t(2.0), fpn=t(1.0)), rpn=t(1.0, head=t(2.0)),
              roi_heads=t(1.0, box_head=t(), box_predictor=t(), mask_head=t(2.0), mask_predictor=t()))

    def call():
        clock[0] += 3.0  # outside the network
        model(0)

    times = stage_times({"toy": (model, call)}, reps=1, clock=lambda: clock[0])["toy"]
    assert [label for label, *_ in STAGES] == list(times)
    assert times["backbone: ResNet body + FPN"] == 3.0 and times["RPN head (convs)"] == 2.0
    assert times["RPN rest: anchors, top-k, decode, NMS"] == 1.0 and times["mask head (convs)"] == 2.0
    assert times["outside the network: resize, pad, box rescale, mask paste"] == 3.0
    assert times["total, end to end"] == 12.0


def test_profile_times_and_counts_every_stage_of_both_models():
    """The static backbone runs the ResNet's and FPN's layers itself, so hooks on ``backbone.body``
    never fire there (its stage once read 0 s and its time landed "outside the network"). On this
    workload (the image fills the canvas, every detection slot valid) both models do the same work
    in every stage, so their FLOPs per stage must agree. The static eager row runs staged (the
    default mask buckets on the CPU), which calls the RoI heads' halves as methods: they must still
    count as the RoI heads, not as "outside the network"."""
    ctx, _ = make_context(ContextOptions(Workload(preset="tiny", images=1)))
    profile = stage_profile(ctx, reps=1)
    times, flops, work = profile.seconds, profile.flops, profile.work
    backbone, outside, total = "backbone: ResNet body + FPN", STAGES[-2][0], "total, end to end"
    assert flops["static"] == pytest.approx(flops["torchvision"])
    assert flops["static"][backbone] > 0.5 * flops["static"][total]
    assert flops["static"][outside] == 0.0
    assert times["static"][backbone] > 0.0 and times["torchvision"][backbone] > 0.0
    # The run file's FLOPs are the work counters' (one counted call), beside operators and bytes.
    for impl in ("static", "torchvision"):
        assert {label: work[impl][key]["flops"] for label, key in STAGE_KEYS.items()} == flops[impl]
        assert work[impl]["backbone"]["ops"] > 0 and work[impl]["total"]["bytes"] > work[impl]["backbone"]["bytes"]
    assert work["static"]["mask_head"] == work["torchvision"]["mask_head"]  # the same four convs on K slots


def test_stage_table_gives_each_stage_its_fraction_of_the_ceiling():
    info = RunInfo(stages={"static": {"a": 2.0, "total": 4.0}}, stage_flops={"static": {"a": 400e9, "total": 500e9}},
                   ceiling={"fp32_gflops": 400.0})
    frame = report.stage_frame(RunDocument("t", {}, info, []))
    df = frame.set_index(frame.columns[0])
    assert df.loc["a", "static_gflop"] == 400.0 and df.loc["a", "static_frac_ceiling"] == 0.5
    assert df.loc["total", "static_share"] == 1.0 and df.loc["total", "static_frac_ceiling"] == 500 / 4 / 400
    assert "static_frac_ceiling" not in report.stage_frame(RunDocument("t", {}, RunInfo(stages=info.stages), []))
    info.ceiling["unreliable"] = "matmul_fp32 ran at 450 GFLOP/s, 1.13x the fp32 ceiling of 400"  # ceiling.check
    assert "static_frac_ceiling" not in report.stage_frame(RunDocument("t", {}, info, []))


def test_stage_table_shows_operators_and_bytes_beside_flops():
    """A run file's work counters (by stage key) land on the stage rows (by label); a stage or a count
    the file lacks, or one that is not a number, reads NaN."""
    label = STAGES[0][0]
    work = {"static": {"backbone": {"flops": 400, "ops": 201, "bytes": 127_150_848},
                       "total": {"flops": 500, "ops": 1865, "bytes": "<b>x</b>"}}}  # fmt: skip
    info = RunInfo(stages={"static": {label: 2.0, "total, end to end": 4.0, "gone": 1.0}}, stage_work=work,
                   options={"rounds": 3, "warmup": 1})
    env = dict.fromkeys(("torch", "torchvision", "torch_xla", "cpu", "gpu", "threads", "seed", "commit", "date"), "?")
    doc = RunDocument("t", env, info, [])
    df = report.stage_frame(doc).set_index("stage (eager fp32, CPU, median of 3, interleaved)")
    assert df.loc[label, "static_ops"] == 201 and df.loc[label, "static_mb_written"] == pytest.approx(127.150848)
    assert df.loc["total, end to end", "static_ops"] == 1865
    assert df.loc["total, end to end", "static_mb_written"] != df.loc["total, end to end", "static_mb_written"]  # NaN
    assert df.loc["gone", "static_ops"] != df.loc["gone", "static_ops"]
    assert "static_ops" in report.markdown(doc) and "static_mb_written" in report.html_page(doc)
    assert RunInfo.from_dict(info.to_dict()).stage_work == work and "stage_work" not in RunInfo().to_dict()
