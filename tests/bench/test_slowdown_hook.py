"""The slowdown hook: the extra work of the old injected slowdown, counted in FLOPs, with outputs left
bit-identical, on both models."""

from __future__ import annotations

import pytest
import torch

from mrcnn.model import MaskRCNN
from mrcnn.reference import torchvision_model
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, textured_images
from mrcnn_bench.running.probes import count_flops
from mrcnn_bench.running.slowdown import inject_slowdown


def _strips(height: int, fraction: float) -> list[int]:
    """The extra body passes of the old ``MaskRCNN._injected_work`` (body share 0.5), written out again."""
    rows = round(fraction / 0.5 * height)
    return [height] * (rows // height) + ([rows % height] if rows % height else [])


@pytest.mark.parametrize(("impl", "fraction"), [("static", 0.1), ("static", 0.6), ("torchvision", 0.1)])
def test_slowdown_hook_does_the_old_extra_work_and_keeps_outputs(tiny_cfg, tiny_weights, impl, fraction):
    """Extra FLOPs = the body over the old formula's strips (0.6: a whole pass plus a strip); outputs bit-identical."""
    if impl == "static":
        model = load_torchvision_weights(MaskRCNN(tiny_cfg), tiny_weights).eval()
        batch = to_image_batch(textured_images(((240, 320),), seed=1), tiny_cfg)
        call, canvas = (lambda: model(batch)), batch.tensors
    else:
        model = torchvision_model(tiny_cfg).eval()
        model.load_state_dict(tiny_weights)
        images = textured_images(((240, 320),), seed=1)
        call, canvas = (lambda: model(images)), model.transform(images)[0].tensors
    with torch.no_grad():
        plain, plain_flops = call(), count_flops(call)
        strips = _strips(canvas.shape[-2], fraction)
        reference = sum(count_flops(lambda s=s: model.backbone.body(canvas[..., :s, :])) for s in strips)
        handle = inject_slowdown(model, fraction)
        hooked, hooked_flops = call(), count_flops(call)
        handle.remove()
    assert reference > 0 and len(strips) == (2 if fraction > 0.5 else 1)
    assert hooked_flops - plain_flops == reference
    if impl == "static":
        assert int(plain.valid.sum()) > 10
        pairs = zip(plain._fields, plain, hooked)
    else:
        pairs = ((k, a[k], b[k]) for a, b in zip(plain, hooked) for k in a)
    for name, x, y in pairs:
        assert torch.equal(x, y), name
