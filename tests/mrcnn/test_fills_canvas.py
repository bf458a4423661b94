"""A batch that fills its canvas needs no padding masks: the host says so (``fills_canvas``), a
graph told so skips them and gives the masked graph's outputs, and eager refuses a false claim.

Graphs are traced by dynamo with a backend that keeps the FX graph as it is: what the test checks
is what the graph holds, which is fixed at tracing, not how a compiler runs it.
"""

from __future__ import annotations

import pytest
import torch

from mrcnn.backbone import fills_canvas
from mrcnn.model import MaskRCNN
from mrcnn.staged import StagedDetector
from mrcnn.structures import ImageBatch
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, textured_images

# On the tiny preset's (320, 448) canvas: 240x320 resizes to 320x426, whose extent (rounded up to
# 32) is the canvas; 250x300 resizes to 320x384, which leaves 64 columns of padding.
FILLS, SHORT = (240, 320), (250, 300)


def _batch(cfg, sizes: list[tuple[int, int]], batch_size: int | None = None) -> ImageBatch:
    images = textured_images(tuple(sizes))
    return to_image_batch(images, cfg, batch_size)


@pytest.fixture(scope="module")
def model(tiny_cfg, tiny_weights):
    return load_torchvision_weights(MaskRCNN(tiny_cfg).eval(), tiny_weights)


def test_the_host_finds_which_batches_fill_their_canvas(tiny_cfg):
    d = tiny_cfg.size_divisible
    assert fills_canvas(_batch(tiny_cfg, [FILLS]), d)
    assert not fills_canvas(_batch(tiny_cfg, [SHORT]), d)
    # A padding slot has the canvas's size, so it never needs a mask.
    assert fills_canvas(_batch(tiny_cfg, [FILLS], batch_size=2), d)
    # Training pads every image to the largest valid one: filling is that one's.
    mixed = _batch(tiny_cfg, [FILLS, SHORT])
    assert not fills_canvas(mixed, d) and fills_canvas(mixed, d, training=True)
    assert not fills_canvas(_batch(tiny_cfg, [SHORT, SHORT]), d, training=True)
    # Sizes on a device are not read (no call waits on it): the masks stay.
    on_device = ImageBatch(*(t.to("meta") for t in _batch(tiny_cfg, [FILLS])))
    assert not fills_canvas(on_device, d)


def test_eager_refuses_a_batch_said_to_fill_that_does_not(model, tiny_cfg):
    with torch.no_grad(), pytest.raises(ValueError, match="do not all fill its canvas"):
        model(_batch(tiny_cfg, [SHORT]), fills_canvas=True)


def _traced(fn):
    """``fn`` compiled whole by dynamo; the FX graphs it made, in order."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return torch.compile(fn, fullgraph=True, dynamic=False, backend=keep), graphs


def test_a_graph_told_the_batch_fills_skips_the_masks_and_gives_the_same_maps(model, tiny_cfg):
    torch._dynamo.reset()
    features, graphs = _traced(model.features)
    batch = _batch(tiny_cfg, [FILLS, FILLS])
    assert fills_canvas(batch, tiny_cfg.size_divisible)
    with torch.no_grad():
        masked = features(batch)
        told = features(batch, True)
        features(batch, True)
        features(batch)
    assert len(graphs) == 2, "one graph per canvas and value, each built once"
    for level, (m, t) in enumerate(zip(masked[0] + masked[1], told[0] + told[1])):
        torch.testing.assert_close(t, m, atol=0, rtol=0, msg=f"level {level}")
    nodes = [len(g.graph.nodes) for g in graphs]
    assert nodes[1] < nodes[0], f"the told graph should drop the masks' ops: {nodes}"
    torch._dynamo.reset()


def test_wrapped_stages_are_told_whether_the_batch_fills(model, tiny_cfg):
    """A staged detector's wrapped (compiled) first stage is told the host's answer, with the
    unwrapped call's outputs; eager stages are never told (eager finds it itself)."""
    told = []

    def recording(fn):
        def call(*args):
            told.append(args[1] if isinstance(args[0], ImageBatch) else None)
            return fn(*args)

        return call

    wrapped, plain = StagedDetector(model, wrap=recording), StagedDetector(model)
    with torch.no_grad():
        for sizes in ([FILLS], [SHORT]):
            batch = _batch(tiny_cfg, sizes)
            out, ref = wrapped(batch), plain(batch)
            for name, a, b in zip(out._fields, out, ref):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)
    # Each call: the first stage, then the mask stage (never told).
    assert told[0::2] == [True, False] and told[1::2] == [None, None]
    assert not plain.tells_fills
