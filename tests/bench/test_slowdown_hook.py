"""The slowdown hook: its extra work is the FPN's P3 convolution over the rows it names, counted in
FLOPs, with outputs left bit-identical, on both models."""

from __future__ import annotations

import pytest
import torch

from mrcnn.model import MaskRCNN
from mrcnn.reference import torchvision_model
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, textured_images
from mrcnn_bench.running.probes import count_flops
from mrcnn_bench.running.slowdown import inject_slowdown, slowdown_rows


def test_rows_are_whole_passes_then_a_strip():
    assert slowdown_rows(40, 0.02) == [40, 40]
    assert slowdown_rows(40, 0.025) == [40, 40, 20]
    assert slowdown_rows(40, 0.001) == [4]
    assert slowdown_rows(40, 0.0) == []


@pytest.mark.parametrize(("impl", "fraction"), [("static", 0.025), ("static", 0.003), ("torchvision", 0.013)])
def test_slowdown_hook_convolves_p3_again_and_keeps_outputs(tiny_cfg, tiny_weights, impl, fraction):
    """Extra FLOPs = the P3 convolution over exactly the rows named; outputs bit-identical."""
    if impl == "static":
        model = load_torchvision_weights(MaskRCNN(tiny_cfg), tiny_weights).eval()
        batch = to_image_batch(textured_images(((240, 320),), seed=1), tiny_cfg)
        call = lambda: model(batch)  # noqa: E731
    else:
        model = torchvision_model(tiny_cfg).eval()
        model.load_state_dict(tiny_weights)
        images = textured_images(((240, 320),), seed=1)
        call = lambda: model(images)  # noqa: E731
    levels = []
    capture = model.backbone.register_forward_hook(lambda module, args, out: levels.append(list(out.values())))
    with torch.no_grad():
        plain, plain_flops = call(), count_flops(call)
        capture.remove()
        p3 = levels[0][1]
        rows = slowdown_rows(p3.shape[-2], fraction)
        reference = sum(count_flops(lambda r=r: model.backbone.fpn.get_result_from_layer_blocks(p3[..., :r, :], 1))
                        for r in rows)
        handle = inject_slowdown(model, fraction)
        hooked, hooked_flops = call(), count_flops(call)
        handle.remove()
    assert reference > 0 and len(rows) == {0.025: 3, 0.003: 1, 0.013: 2}[fraction]
    assert hooked_flops - plain_flops == reference
    if impl == "static":
        assert int(plain.valid.sum()) > 10
        pairs = zip(plain._fields, plain, hooked)
    else:
        pairs = ((k, a[k], b[k]) for a, b in zip(plain, hooked) for k in a)
    for name, x, y in pairs:
        assert torch.equal(x, y), name
