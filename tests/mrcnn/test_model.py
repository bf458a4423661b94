"""Parity of the static model with torchvision's Mask R-CNN (the oracle), same weights, both op impls."""

from __future__ import annotations

import pytest
import torch

from mrcnn.model import MaskRCNN
from mrcnn.parity import match_detections
from mrcnn.reference import torchvision_model
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, textured_images

# Landscape 3:4, portrait 4:3, square and wide 5:8. Each resizes into a tiny-preset canvas that equals
# torchvision's own padding (resized size rounded up to 32), so border features are identical too.
SIZES = ((240, 320), (400, 300), (256, 256), (300, 480))


@pytest.fixture(scope="module")
def images():
    return textured_images(SIZES, seed=1)


@pytest.fixture(scope="module")
def reference(tiny_cfg, tiny_weights, images):
    tv = torchvision_model(tiny_cfg).eval()
    tv.load_state_dict(tiny_weights)
    with torch.no_grad():
        return tv, [tv([img])[0] for img in images]


def _static(cfg, weights, **overrides):
    return load_torchvision_weights(MaskRCNN(cfg.replace(**overrides)).eval(), weights)


@pytest.mark.parametrize("impl", ["torchvision", "tensor"])
def test_parity_with_torchvision(tiny_cfg, tiny_weights, images, reference, impl):
    _, expected = reference
    model = _static(tiny_cfg, tiny_weights, ops_impl=impl)
    outputs = model.predict(images)
    assert len(outputs) == len(images)
    for img, ref, out in zip(images, expected, outputs):
        p = match_detections(ref, out)
        assert p.num_ref >= 50, "weights too weak: torchvision should find dozens of objects"
        assert abs(p.num_other - p.num_ref) <= 0.05 * p.num_ref, (p.num_ref, p.num_other)
        assert p.ref_matched >= 0.95, f"{impl}: only {p.ref_matched:.1%} of torchvision's detections matched"
        assert p.other_matched >= 0.95, f"{impl}: only {p.other_matched:.1%} of static detections matched"
        assert p.mask_ious.numel() == p.matched
        assert p.min_mask_iou >= 0.9, f"{impl}: mask IoU {p.min_mask_iou:.3f}"
        assert out["masks"].shape[-2:] == img.shape[-2:]  # pasted at the original size


def test_weights_are_not_trivial(tiny_cfg, tiny_weights, images, reference):
    """Non-zero box deltas, many detections, and NMS that removes boxes from the top K."""
    tv, expected = reference
    deltas = []
    hook = tv.roi_heads.box_predictor.bbox_pred.register_forward_hook(lambda m, i, o: deltas.append(o))
    try:
        with torch.no_grad():
            tv([images[0]])
        tv.roi_heads.nms_thresh = 1.0  # IoU never exceeds 1: nothing is suppressed
        with torch.no_grad():
            no_nms = tv([images[0]])[0]
    finally:
        hook.remove()
        tv.roi_heads.nms_thresh = tiny_cfg.box_nms_thresh
    assert deltas[0].abs().mean() > 0.1
    assert all(len(r["boxes"]) >= 50 for r in expected)
    assert match_detections(expected[0], no_nms).ref_matched < 0.9, "NMS did not change the top detections"
    assert len({int(x) for x in expected[0]["labels"]}) >= 3, "scores should spread over several classes"


def test_nothing_above_threshold_gives_empty_outputs(tiny_cfg, tiny_weights, images):
    model = _static(tiny_cfg, tiny_weights, box_score_thresh=0.9999)
    tv = torchvision_model(tiny_cfg.replace(box_score_thresh=0.9999)).eval()
    tv.load_state_dict(tiny_weights)
    with torch.no_grad():
        assert len(tv([images[1]])[0]["boxes"]) == 0
    batch = to_image_batch([images[1]], model.cfg)
    with torch.no_grad():
        det = model(batch)
    k, m = tiny_cfg.box_detections_per_img, tiny_cfg.mask_size
    assert det.boxes.shape == (1, k, 4) and det.masks.shape == (1, k, m, m)
    assert not det.valid.any()
    out = model.predict([images[1]])[0]
    assert out["boxes"].shape == (0, 4) and out["masks"].shape == (0, 1, *images[1].shape[-2:])


def test_outputs_have_fixed_shapes_for_any_content(tiny_cfg, tiny_weights):
    model = _static(tiny_cfg, tiny_weights)
    k, m = tiny_cfg.box_detections_per_img, tiny_cfg.mask_size
    for images in (
        textured_images(((240, 320), (200, 300)), seed=5),
        [torch.zeros(3, 240, 320), torch.ones(3, 220, 300)],
    ):
        batch = to_image_batch(images, tiny_cfg, batch_size=3)
        with torch.no_grad():
            det = model(batch)
        assert det.boxes.shape == (3, k, 4) and det.scores.shape == (3, k) and det.labels.shape == (3, k)
        assert det.masks.shape == (3, k, m, m) and det.valid.shape == (3, k)
        assert not det.valid[2].any(), "the padding slot of an incomplete batch must have no detections"
        assert len(model.predict(images, batch_size=3)) == 2


def test_batched_equals_single(tiny_cfg, tiny_weights, images):
    """Two images in one canvas give what each gives alone in that canvas."""
    model = _static(tiny_cfg, tiny_weights)
    pair = [images[0], textured_images(((230, 320),), seed=9)[0]]
    together = model.predict(pair)
    alone = [model.predict([img])[0] for img in pair]
    for a, b in zip(alone, together):
        assert match_detections(a, b).ref_matched == 1.0
