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
