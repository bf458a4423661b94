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


def test_fpn_upsampling_on_xla_equals_nearest_interpolation_and_its_backward_lowers():
    """The FPN's 2x nearest upsampling as XLA runs it (expand + reshape): the same values and
    gradients as F.interpolate on the CPU, and no CPU fallback op in the backward."""
    import torch
    import torch.nn.functional as F

    from mrcnn.backbone import upsample_nearest

    x = torch.randn(2, 3, 5, 7, generator=torch.Generator().manual_seed(0))
    weight = torch.randn(2, 3, 10, 14, generator=torch.Generator().manual_seed(1))
    ref_x = x.clone().requires_grad_(True)
    ref = F.interpolate(ref_x, size=(10, 14), mode="nearest")
    (ref * weight).sum().backward()

    device = xm.device()
    met.clear_all()
    xla_x = x.to(device).requires_grad_(True)
    out = upsample_nearest(xla_x, (10, 14))
    (out * weight.to(device)).sum().backward()
    assert torch.equal(out.detach().cpu(), ref.detach())
    assert torch.equal(xla_x.grad.cpu(), ref_x.grad)
    assert met.executed_fallback_ops() == [], met.executed_fallback_ops()
