"""The stage profile: a call split into the model's stages (on a fake clock: no timing in the
assertions), every stage timed and counted for both models, and each stage's share of the ceiling."""

from __future__ import annotations

import pytest
import torch

from mrcnn_bench.reports import report
from mrcnn_bench.running.cases import Workload
from mrcnn_bench.running.context import ContextOptions, make_context
from mrcnn_bench.running.profile import STAGES, profile_stages, stage_times
from mrcnn_bench.running.records import RunDocument, RunInfo


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
    times, flops = profile_stages(ctx, reps=1)
    backbone, outside, total = "backbone: ResNet body + FPN", STAGES[-2][0], "total, end to end"
    assert flops["static"] == pytest.approx(flops["torchvision"])
    assert flops["static"][backbone] > 0.5 * flops["static"][total]
    assert flops["static"][outside] == 0.0
    assert times["static"][backbone] > 0.0 and times["torchvision"][backbone] > 0.0


def test_stage_table_gives_each_stage_its_fraction_of_the_ceiling():
    info = RunInfo(stages={"static": {"a": 2.0, "total": 4.0}}, stage_flops={"static": {"a": 400e9, "total": 500e9}},
                   ceiling={"fp32_gflops": 400.0})
    frame = report.stage_frame(RunDocument("t", {}, info, []))
    df = frame.set_index(frame.columns[0])
    assert df.loc["a", "static_gflop"] == 400.0 and df.loc["a", "static_frac_ceiling"] == 0.5
    assert df.loc["total", "static_share"] == 1.0 and df.loc["total", "static_frac_ceiling"] == 500 / 4 / 400
    assert "static_frac_ceiling" not in report.stage_frame(RunDocument("t", {}, RunInfo(stages=info.stages), []))
