"""The pure-tensor forms as operators: ``mrcnn::nms_fixed`` and ``mrcnn::multilevel_roi_align``.

Registered as composite only (no kernel of their own), equal to the plain tensor functions, opcheck,
traced under FakeTensorMode, kept as one node by torch.export (until decomposed for a C++ process)
and by Dynamo.
"""

from __future__ import annotations

import pytest
import torch

from mrcnn import export
from mrcnn.ops import multilevel_roi_align, nms_fixed
from mrcnn.ops._library import COMPOSITE_OPS
from mrcnn.ops.nms import _nms_fixed_tensor
from mrcnn.ops.roi_align import _roi_align_tensor, infer_scales
from tests.helpers.ops_inputs import nms_sample, reference_nms, roi_sample

NMS_OP = torch.ops.mrcnn.nms_fixed.default
ROI_OP = torch.ops.mrcnn.multilevel_roi_align.default


def test_composite_ops_are_registered_as_composite_only():
    assert dict(COMPOSITE_OPS) == {NMS_OP: _nms_fixed_tensor, ROI_OP: _roi_align_tensor}
    for op in COMPOSITE_OPS:
        name = op.name()
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd"), name
        # No kernel of their own for a backend, autograd or fake tensors: everything goes through the
        # decomposition, which is what lets XLA, AOTAutograd and export see aten ops only.
        for key in ("CPU", "CUDA", "XLA", "Meta", "Autograd", "CompositeExplicitAutograd"):
            assert not torch._C._dispatch_has_kernel_for_dispatch_key(name, key), (name, key)
        assert torch.Tag.pt2_compliant_tag in op.tags
        assert not export.has_cpp_cpu_kernel(name), "a Python-registered kernel must not count as C++"
    assert str(NMS_OP._schema) == (
        "mrcnn::nms_fixed(Tensor boxes, Tensor scores, Tensor valid, Tensor? groups, float iou_threshold, "
        "int max_out, int iterations) -> (Tensor keep, Tensor keep_valid)"
    )
    assert str(ROI_OP._schema) == (
        "mrcnn::multilevel_roi_align(Tensor[] features, Tensor boxes, float[] scales, int output_size, "
        "int sampling_ratio, int canonical_scale, int canonical_level, Tensor? images=None) -> Tensor"
    )


@pytest.mark.parametrize("use_groups", [False, True])
def test_nms_op_equals_tensor_function(use_groups):
    boxes, scores, valid, groups = nms_sample(4, g=3, n=300)
    groups = groups if use_groups else None
    # Keyword call of the plain function: a schema whose arguments are bound in another order
    # (threshold, max_out and iterations are all numbers) would not give the same result.
    want = _nms_fixed_tensor(
        boxes=boxes, scores=scores, valid=valid, groups=groups, iou_threshold=0.6, max_out=60, iterations=16
    )
    got = torch.ops.mrcnn.nms_fixed(boxes, scores, valid, groups, 0.6, 60, 16)
    assert want[1].sum() > 90 and not want[1].all()  # real suppression, and padded slots (33 to 73 survive)
    for g_, w in zip(got, want):
        assert g_.dtype == w.dtype and torch.equal(g_, w)
    # ... and the public function, which now goes through the op, still equals torchvision.
    keep, keep_valid = nms_fixed(boxes, scores, valid, 0.6, 60, groups=groups, impl="tensor")
    for i, r in enumerate(reference_nms(boxes, scores, valid, groups, 0.6, 60)):
        assert torch.equal(keep[i, : len(r)], r) and int(keep_valid[i].sum()) == len(r)


def test_roi_align_op_equals_tensor_function():
    features, boxes = roi_sample(6, requires_grad=True)
    scales = infer_scales(features)
    upstream = torch.randn(2, boxes.shape[1], 3, 5, 5, generator=torch.Generator().manual_seed(1))

    def run(fn):
        out = fn()
        grads = torch.autograd.grad((out * upstream).sum(), features)
        return out.detach(), grads

    want, want_grads = run(lambda: _roi_align_tensor(
        features=features, boxes=boxes, scales=scales, output_size=5, sampling_ratio=2, canonical_scale=224,
        canonical_level=4,
    ))
    # Nothing registered on autograd keys: the gradient comes from the decomposition, as before.
    got, got_grads = run(lambda: torch.ops.mrcnn.multilevel_roi_align(features, boxes, scales, 5, 2, 224, 4))
    assert torch.equal(got, want)
    for g_, w in zip(got_grads, want_grads):
        assert torch.equal(g_, w)
    assert all(w.abs().sum() > 0 for w in want_grads)  # every level pooled something


def test_composite_ops_opcheck():
    # Real content: clustered boxes that suppress each other, with invalid candidates and groups.
    boxes, scores, valid, groups = nms_sample()
    assert not nms_fixed(boxes, scores, valid, 0.5, 40)[1].all()
    for g in (groups, None):
        result = torch.library.opcheck(NMS_OP, (boxes, scores, valid, g, 0.5, 16, 16))
        assert all(v == "SUCCESS" for v in result.values()), result
        assert set(result) >= {"test_schema", "test_faketensor", "test_aot_dispatch_dynamic"}

    # Features that require grad: test_autograd_registration and test_aot_dispatch_dynamic then
    # check the backward too (through the decomposition, with symbolic shapes).
    features, rois = roi_sample(requires_grad=True)
    result = torch.library.opcheck(ROI_OP, (features, rois, infer_scales(features), 3, 2, 224, 4))
    assert all(v == "SUCCESS" for v in result.values()), result
    assert set(result) >= {"test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"}


def test_composite_ops_trace_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    boxes, scores, valid, groups = nms_sample()
    features, rois = roi_sample()
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in (boxes, scores, valid, groups, rois, *features)]
        keep, keep_valid = nms_fixed(*fake[:3], 0.5, 25, groups=fake[3], impl="tensor")
        pooled = multilevel_roi_align(fake[5:], fake[4], 7, impl="tensor")
    assert keep.shape == (2, 25) and keep.dtype == torch.int64
    assert keep_valid.shape == (2, 25) and keep_valid.dtype == torch.bool
    assert pooled.shape == (2, rois.shape[1], 3, 7, 7) and pooled.dtype == torch.float32


class _BothOps(torch.nn.Module):
    def forward(self, boxes, scores, valid, groups, rois, *features):
        keep, keep_valid = nms_fixed(boxes, scores, valid, 0.5, 25, groups=groups, impl="tensor")
        return keep, keep_valid, multilevel_roi_align(list(features), rois, 7, impl="tensor")


def test_export_keeps_composite_ops_until_decomposed():
    boxes, scores, valid, groups = nms_sample()
    features, rois = roi_sample()
    args = (boxes, scores, valid, groups, rois, *features)
    ep = torch.export.export(_BothOps(), args)
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    # The op boundary is real: one node per op, not its hundred aten ops...
    assert targets.count(NMS_OP) == 1 and targets.count(ROI_OP) == 1
    assert torch.ops.aten.bmm.default not in targets
    # ... which a C++ process could not run, so check_exportable rejects them,
    with pytest.raises(RuntimeError, match=r"mrcnn::nms_fixed, not an aten op.*mrcnn::multilevel_roi_align"):
        export.check_exportable(ep)
    # and decompose_mrcnn_ops turns them into aten ops with C++ kernels, the same numbers.
    flat = export.decompose_mrcnn_ops(ep)
    export.check_exportable(flat)
    ops = {n.target for n in flat.graph.nodes if n.op == "call_function"}
    assert not ops & set(COMPOSITE_OPS) and torch.ops.aten.bmm.default in ops
    for g_, w in zip(flat.module()(*args), _BothOps()(*args)):
        assert torch.equal(g_, w)


def test_compile_sees_composite_ops_as_one_node():
    """Dynamo records each op as one call (the boundary), AOTAutograd then decomposes it."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    boxes, scores, valid, groups = nms_sample()
    features, rois = roi_sample()
    args = (boxes, scores, valid, groups, rois, *features)
    torch._dynamo.reset()
    out = torch.compile(_BothOps(), fullgraph=True, backend=backend)(*args)
    torch._dynamo.reset()
    (gm,) = graphs
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.mrcnn.nms_fixed) + targets.count(NMS_OP) == 1, targets
    assert targets.count(torch.ops.mrcnn.multilevel_roi_align) + targets.count(ROI_OP) == 1, targets
    for g_, w in zip(out, _BothOps()(*args)):
        assert torch.equal(g_, w)
