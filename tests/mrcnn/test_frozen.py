"""``mrcnn.frozen.FrozenInference``: inductor with freezing, the model's outputs, weights guarded.

Freezing folds batch norm into the convolutions and prepacks the weights, so outputs agree with
eager to float rounding (valid and labels exactly).
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from mrcnn.frozen import FrozenInference
from mrcnn.model import MaskRCNN
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, textured_images
from tests.helpers.detections import assert_same_detections

pytestmark = pytest.mark.slow  # two inductor compilations


def test_frozen_equals_eager_and_refuses_changed_weights(tiny_cfg, tiny_weights):
    model = load_torchvision_weights(MaskRCNN(tiny_cfg).eval(), tiny_weights)
    batches = [to_image_batch([image], tiny_cfg) for image in textured_images(((240, 320), (230, 300)), seed=3)]
    assert len({tuple(b.tensors.shape) for b in batches}) == 1  # one canvas
    torch._dynamo.reset()
    counters.clear()
    frozen = FrozenInference(model)
    with torch.no_grad():
        expected = [model(batch) for batch in batches]
        for batch, want in zip(batches, expected):
            assert int(want.valid.sum()) > 50  # the weights detect things: not a vacuous comparison
            assert_same_detections(frozen(batch), want)
    # Freezing happened (weights packed for oneDNN), in one graph for the canvas.
    assert counters["inductor"]["mkldnn_conv_weight_pack_matcher_count"] > 0, dict(counters["inductor"])
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])

    # Another model of the same class, compiled without freezing in the same process, runs its own
    # weights, not the frozen graph's.
    other_weights = {k: v * 0.9 if k.endswith("cls_score.weight") else v for k, v in tiny_weights.items()}
    other = load_torchvision_weights(MaskRCNN(tiny_cfg).eval(), other_weights)
    with torch.no_grad():
        plain, eager_other = torch.compile(other, fullgraph=True, dynamic=False)(batches[0]), other(batches[0])
    assert_same_detections(plain, eager_other)
    assert not torch.allclose(eager_other.scores, expected[0].scores)  # the two models differ

    model.load_state_dict(model.state_dict())  # same values, but written in place: refused
    with pytest.raises(RuntimeError, match="weights changed after they were frozen"):
        frozen(batches[0])
