"""torch.compile(fullgraph=True): one graph, no graph breaks, no recompilation within a bucket."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from mrcnn.model import MaskRCNN
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, textured_images

pytestmark = pytest.mark.slow

# Different sizes and contents, all in the tiny preset's (320, 448) canvas.
SIZES = ((240, 320), (300, 400), (180, 240), (330, 440), (225, 300), (210, 290))


@pytest.mark.parametrize(("impl", "backend"), [("torchvision", "inductor"), ("tensor", "aot_eager")])
def test_fullgraph_no_recompile(tiny_cfg, tiny_weights, impl, backend):
    model = load_torchvision_weights(MaskRCNN(tiny_cfg.replace(ops_impl=impl)).eval(), tiny_weights)
    batches = [to_image_batch([img], tiny_cfg) for img in textured_images(SIZES, seed=11)]
    assert len({tuple(b.tensors.shape) for b in batches}) == 1

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    with torch.no_grad():
        for batch in batches:
            det = compiled(batch)
            expected = model(batch)
            # Same detections as eager (fullgraph=True would have raised on any graph break).
            assert torch.equal(det.valid, expected.valid)
            assert torch.allclose(det.scores, expected.scores, atol=1e-4)
            assert torch.allclose(det.boxes, expected.boxes, atol=1e-2)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert not counters["recompiles"], dict(counters["recompiles"])


def test_roi_align_levels_made_nchw_once(tiny_cfg, tiny_weights):
    """Compiled inference clones P2..P5 to the contiguous format once, and both RoIAligns (box and
    mask branch) read those clones: the compiler writes each level NCHW once instead of each
    torchvision kernel copying its channels_last maps again."""
    model = load_torchvision_weights(MaskRCNN(tiny_cfg.replace(ops_impl="torchvision")).eval(), tiny_weights)
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, fullgraph=True, backend=capture)(to_image_batch(textured_images(SIZES[:1]), tiny_cfg))
    (gm,) = graphs
    clones = [
        n for n in gm.graph.nodes
        if n.target == "clone" and n.kwargs.get("memory_format") == torch.contiguous_format
    ]  # fmt: skip
    op = torch.ops.mrcnn.multilevel_roi_align_tv
    align_calls = [n for n in gm.graph.nodes if n.target in (op, op.default)]
    assert len(align_calls) == 2
    assert len(clones) == 4
    for call in align_calls:
        assert list(call.args[0]) == clones
