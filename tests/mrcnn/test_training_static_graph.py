"""The training step keeps static shapes over varying ground-truth counts: torch.compile fullgraph
builds one graph without recompiles, and XLA's compile counts stay flat after warm-up with no CPU
fallback op.
"""

from __future__ import annotations

import math

import pytest
import torch

from mrcnn.losses import check_targets
from mrcnn.model import MaskRCNN
from mrcnn.structures import ImageBatch, Targets
from mrcnn.transform import to_image_batch
from mrcnn.weights import textured_images
from tests.helpers.training import LOSS_NAMES, SMALL_SIZES, random_targets, small_cfg

try:
    # Started at collection, before any test runs a backward: the autograd engine sizes its
    # per-device queues at the first backward of the process, and counts XLA devices only once the
    # XLA runtime is up. Otherwise an XLA backward after a CPU one fails an internal assert.
    import torch_xla
    import torch_xla.runtime

    torch_xla.runtime.global_runtime_device_count()
except ImportError:
    torch_xla = None


@pytest.mark.slow
def test_compiled_training_forward_has_one_graph_over_gt_counts(tiny_cfg):
    import torch._dynamo
    from torch._dynamo.utils import counters

    cfg = small_cfg(tiny_cfg)
    torch.manual_seed(0)
    model = MaskRCNN(cfg).train()
    batch = to_image_batch(textured_images(SMALL_SIZES, seed=0), cfg)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for step, counts in enumerate(([2, 1], [0, 0], [4, 3], [1, 0])):
        targets = random_targets(cfg, batch, counts, seed=step)
        check_targets(targets, cfg, batch)
        losses = compiled(batch, targets)
        assert set(losses) == LOSS_NAMES and all(torch.isfinite(v) for v in losses.values())
        sum(losses.values()).backward()
        if sum(counts) == 0:
            assert float(losses["loss_box_reg"].detach()) == 0 and float(losses["loss_mask"].detach()) == 0
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert not counters["recompiles"], dict(counters["recompiles"])


@pytest.mark.slow
@pytest.mark.xla
def test_xla_training_steps_compile_once(tiny_cfg):
    """Forward + backward + SGD step on XLA, FPN trainable: compile counts stay flat after the first
    step over 20 steps of varying ground truth, and no op falls back to the CPU."""
    if torch_xla is None:
        pytest.skip("torch_xla is not installed")
    import torch_xla.debug.metrics as met

    # The ResNet body is frozen to keep the compile short here; the FPN trains, so the step holds
    # the backward of its nearest upsampling, which must lower (no CPU fallback op).
    cfg = small_cfg(tiny_cfg, trainable_backbone_layers=0)
    device = torch_xla.device()
    torch.manual_seed(0)
    model = MaskRCNN(cfg).train()
    model.backbone.body.requires_grad_(False)
    assert all(p.requires_grad for p in model.backbone.fpn.parameters())
    model = model.to(device)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01, momentum=0.9)
    batch = to_image_batch(textured_images(SMALL_SIZES, seed=0), cfg)
    met.clear_all()
    counts_per_step, losses_per_step = [], []
    # 20 steps, ground truth from none to max_gt_instances (4) per image: each count a recompile could key on.
    steps = [[2, 1], [0, 0], [4, 3], [1, 0], [3, 4], [0, 2]]
    steps += torch.randint(0, 5, (14, 2), generator=torch.Generator().manual_seed(0)).tolist()
    for step, counts in enumerate(steps):
        targets = random_targets(cfg, batch, counts, seed=step)
        check_targets(targets, cfg, batch)  # on the host, before the copy
        losses = model(ImageBatch(*(t.to(device) for t in batch)), Targets(*(t.to(device) for t in targets)))
        optimizer.zero_grad()
        sum(losses.values()).backward()
        optimizer.step()
        torch_xla.sync()
        counts_per_step.append(met.counter_value("UncachedCompile") or 0)
        losses_per_step.append({k: v.detach() for k, v in losses.items()})
    # Step 1 compiles the step; step 2 again, as SGD's momentum buffers now exist. Then nothing.
    assert counts_per_step[0] > 0
    assert len(set(counts_per_step[1:])) == 1, f"recompiled after warm-up: {counts_per_step}"
    assert met.executed_fallback_ops() == [], met.executed_fallback_ops()
    values = [{k: float(v.cpu()) for k, v in losses.items()} for losses in losses_per_step]
    assert all(math.isfinite(v) for losses in values for v in losses.values())
    assert values[1]["loss_box_reg"] == 0 and values[1]["loss_mask"] == 0  # no ground truth at all
