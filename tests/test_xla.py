"""XLA (PJRT_DEVICE=CPU): one compilation per canvas bucket, no CPU fallback ops."""

from __future__ import annotations

import pytest

from mrcnn.model import MaskRCNN
from mrcnn.parity import match_detections
from mrcnn.weights import load_torchvision_weights, textured_images

xm = pytest.importorskip("torch_xla", reason="torch_xla is not installed")
import torch_xla.debug.metrics as met  # noqa: E402

pytestmark = [pytest.mark.xla, pytest.mark.slow]

# Five landscape images of different sizes in the (320, 448) bucket, then two portrait ones (448, 320).
LANDSCAPE = ((240, 320), (300, 400), (180, 240), (330, 440), (225, 300))
PORTRAIT = ((320, 240), (400, 300))


def test_compile_count_flat_per_bucket_and_no_fallback(tiny_cfg, tiny_weights):
    device = torch_xla_device()
    model = load_torchvision_weights(MaskRCNN(tiny_cfg).eval(), tiny_weights).to(device)
    cpu_model = load_torchvision_weights(MaskRCNN(tiny_cfg).eval(), tiny_weights)
    images = textured_images(LANDSCAPE + PORTRAIT, seed=3)
    met.clear_all()
    counts = []
    outputs = []
    for img in images:
        outputs.append(model.predict([img])[0])
        counts.append(met.counter_value("UncachedCompile") or 0)
    first_portrait = len(LANDSCAPE)
    assert counts[0] > 0
    assert counts[first_portrait - 1] == counts[0], f"recompiled within the landscape bucket: {counts}"
    assert counts[-1] == counts[first_portrait], f"recompiled within the portrait bucket: {counts}"
    assert met.executed_fallback_ops() == [], met.executed_fallback_ops()
    # XLA runs the pure-tensor ops; they must still agree with the CPU model.
    for img, out in zip(images[:2], outputs[:2]):
        p = match_detections(cpu_model.predict([img])[0], out)
        assert p.ref_matched >= 0.95 and p.other_matched >= 0.95, (p.ref_matched, p.other_matched)


def torch_xla_device():
    import torch_xla

    return torch_xla.device()
