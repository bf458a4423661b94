"""Both ops compiled: fullgraph torch.compile without recompiles (forward and RoIAlign's backward), and
the pure-tensor impls on XLA without CPU fallbacks or recompiles, each equal to the eager CPU result.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch._dynamo.utils import counters

from mrcnn.ops import multilevel_roi_align, nms_fixed
from tests.helpers.ops_inputs import IMPLS, compile_inputs

# The XLA runtime is started here, at collection, not inside the XLA test: the autograd engine
# sizes its per-device queues at the first backward of the process, so an XLA backward after any
# CPU backward that ran before the XLA device existed fails an internal assert in engine.cpp.
os.environ.setdefault("PJRT_DEVICE", "CPU")
try:
    import torch_xla
    import torch_xla.debug.metrics as xla_metrics

    torch_xla.device()
except ImportError as _e:  # pragma: no cover - depends on the environment
    torch_xla = xla_metrics = None
    XLA_MISSING = f"torch_xla is not importable: {_e}"


# ------------------------------------------------------------------------------------------------
# torch.compile


def _both_ops_both_impls(boxes, scores, valid, groups, features, rois):
    out = []
    for impl in IMPLS:
        keep, keep_valid = nms_fixed(boxes, scores, valid, 0.6, 100, groups=groups, impl=impl)
        out += [keep, keep_valid, multilevel_roi_align(features, rois, 7, impl=impl)]
    return out


@pytest.mark.slow
def test_compile_fullgraph_no_recompile():
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(_both_ops_both_impls, fullgraph=True, backend="aot_eager")
    for seed in (1, 2):  # the second call has new data of the same shapes
        inputs = compile_inputs(seed)
        with torch._dynamo.config.patch(error_on_recompile=seed > 1):
            got = compiled(*inputs)
        for g_, e in zip(got, _both_ops_both_impls(*inputs)):
            torch.testing.assert_close(g_, e, atol=1e-5, rtol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]
    torch._dynamo.reset()


@pytest.mark.slow
def test_compile_roi_align_backward():
    def loss(features, rois, impl):
        return multilevel_roi_align(features, rois, 7, impl=impl).square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    *_, features, rois = compile_inputs(3)
    for impl in IMPLS:
        results = []
        for fn in (loss, compiled):
            leaves = [f.clone().requires_grad_() for f in features]
            fn(leaves, rois, impl).backward()
            results.append([f.grad for f in leaves])
        for g_, e in zip(*results):
            torch.testing.assert_close(g_, e, atol=1e-4, rtol=1e-5)
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------------------
# XLA


@pytest.mark.xla
@pytest.mark.slow
def test_xla_tensor_impls_no_fallback_no_recompile():
    if torch_xla is None:
        pytest.skip(XLA_MISSING)
    met = xla_metrics
    device = torch_xla.device()
    met.clear_all()

    def run(seed):
        boxes, scores, valid, groups, features, rois = compile_inputs(seed)
        features = [f.requires_grad_() for f in features]
        xla_features = [f.detach().to(device).requires_grad_() for f in features]
        keep, keep_valid = nms_fixed(
            boxes.to(device), scores.to(device), valid.to(device), 0.6, 100, groups=groups.to(device)
        )
        pooled = multilevel_roi_align(xla_features, rois.to(device), 7)
        pooled.square().sum().backward()
        torch_xla.sync()
        got = [keep.cpu(), keep_valid.cpu(), pooled.cpu(), *[f.grad.cpu() for f in xla_features]]

        ref_keep, ref_valid = nms_fixed(boxes, scores, valid, 0.6, 100, groups=groups)
        ref_pooled = multilevel_roi_align(features, rois, 7)
        ref_pooled.square().sum().backward()
        ref = [ref_keep, ref_valid, ref_pooled, *[f.grad for f in features]]
        for g_, r in zip(got, ref):
            torch.testing.assert_close(g_, r, atol=1e-4, rtol=1e-5)
        assert ref_valid.any() and not ref_valid.all()

    run(1)
    compiles = met.counter_value("UncachedCompile")
    assert compiles, "nothing was compiled: the ops did not run on XLA"
    assert not met.executed_fallback_ops(), met.executed_fallback_ops()
    run(2)
    assert met.counter_value("UncachedCompile") == compiles, "new data of the same shape recompiled"
    assert not met.executed_fallback_ops(), met.executed_fallback_ops()
