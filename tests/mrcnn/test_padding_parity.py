"""Padding that changes nothing: on a canvas larger than torchvision's own padding (the
resized size rounded up to 32, the "extent"), the static model still gives torchvision's features
and detections, because it zeroes features outside the extent before every kernel wider than 1.

The photographs are at ``OFF_CANVAS_SIZES`` (``tests/helpers/photos.py``): resized sizes whose
extent is smaller than their canvas bucket in the tiny preset, landscape and portrait.
"""

from __future__ import annotations

import pytest
import torch

from mrcnn.backbone import (
    canvas_level_size,
    eager_crop,
    edge_extended,
    fold_norms_on,
    masked_features,
    padded_extents,
)
from mrcnn.layout import conv_layout
from mrcnn.model import MaskRCNN
from mrcnn.parity import match_detections, same_detections, torchvision_stable_ties
from mrcnn.postprocess import postprocess
from mrcnn.reference import torchvision_model
from mrcnn.transform import select_canvas, to_image_batch
from mrcnn.weights import load_torchvision_weights, synthetic_weights, textured_images
from tests.helpers.photos import OFF_CANVAS_SIZES, PHOTOS, assert_detections_match, photo
from tests.helpers.training import (
    assert_parity,
    pad_targets,
    parity_batch,
    parity_config,
    static_losses,
    torchvision_losses,
)

pytest.importorskip("matplotlib.cbook", reason="the sample photographs ship with matplotlib")


@pytest.fixture(scope="module")
def images():
    return [photo(PHOTOS[1 if i % 3 == 2 else 0], size) for i, size in enumerate(OFF_CANVAS_SIZES)]


@pytest.fixture(scope="module")
def weights(tiny_cfg, tiny_weights):
    return {0: tiny_weights, 1: synthetic_weights(tiny_cfg, 1), 2: synthetic_weights(tiny_cfg, 2)}


@pytest.fixture(scope="module")
def reference(tiny_cfg, weights, images):
    """torchvision's detections for each seed and image (seeds 1 and 2 on every other image)."""
    out = {}
    for seed, state in weights.items():
        tv = torchvision_model(tiny_cfg).eval()
        tv.load_state_dict(state)
        with torch.no_grad():
            out[seed] = [tv([img])[0] for img in _subset(images, seed)]
    return out


def _subset(items: list, seed: int) -> list:
    return items if seed == 0 else items[seed - 1 :: 2]


def _on_extent(cfg, weights, images: list[torch.Tensor], **overrides) -> list[dict]:
    """Each image alone on a canvas equal to its extent: the static model with nothing to mask."""
    out = []
    for img in images:
        extent = tuple(padded_extents(torch.tensor(img.shape[-2:]), cfg.size_divisible).tolist())
        out.append(_static(cfg, weights, canvases=(extent,), **overrides).predict([img])[0])
    return out


def _static(cfg, weights, **overrides):
    return load_torchvision_weights(MaskRCNN(cfg.replace(**overrides)).eval(), weights)


def test_sizes_are_off_canvas(tiny_cfg):
    for size in OFF_CANVAS_SIZES:
        extent = tuple(padded_extents(torch.tensor(size), tiny_cfg.size_divisible).tolist())
        assert extent != select_canvas([size], tiny_cfg), size


@pytest.mark.parametrize("size", [(320, 385), (287, 512), (465, 320), (512, 257)])
def test_features_match_torchvision_inside_extent(tiny_cfg, tiny_weights, size):
    """Every FPN level, inside torchvision's own map, equals torchvision's backbone on its padding."""
    model = _static(tiny_cfg, tiny_weights)
    image = photo(PHOTOS[0], size)
    extent = padded_extents(torch.tensor([size]), tiny_cfg.size_divisible)
    batch = to_image_batch([image], tiny_cfg)
    own = torch.zeros(1, 3, *extent[0].tolist())
    own[..., : size[0], : size[1]] = batch.tensors[..., : size[0], : size[1]]
    with torch.no_grad():
        expected = list(model.backbone(own).values())
        masked = masked_features(model.backbone, batch.tensors, extent)
        leaky = list(model.backbone(batch.tensors).values())
    for level, (e, m, p) in enumerate(zip(expected, masked, leaky)):
        h, w = e.shape[-2:]
        scale = float(e.abs().max())
        # Only float summation order differs (convolutions of different sizes).
        torch.testing.assert_close(m[..., :h, :w], e, atol=1e-5 * scale, rtol=0, msg=f"level {level}")
        assert float(m[..., h:, :].abs().sum() + m[..., :, w:].abs().sum()) == 0.0
        if level < 4:  # without masking the canvas padding leaks into the border
            assert float((p[..., :h, :w] - e).abs().max()) > 1e-2 * scale


def _masked_on_canvas(model, batch, extents):
    """The graphs' path: the whole canvas, masked -> (P2..P6, pooled P2..P5 before the layout),
    with the norms folded as eager folds them on the CPU."""
    canvas = tuple(batch.tensors.shape[-2:])
    fold = fold_norms_on(model.cfg, batch.tensors.device)
    with torch.no_grad():
        levels = masked_features(model.backbone, conv_layout(batch.tensors, model.cfg), extents, fold)
    return levels, [edge_extended(f, extents, canvas) for f in levels[:4]]


def test_a_canvas_its_extent_fills_runs_without_masks_and_gives_the_same_maps(tiny_cfg, tiny_weights):
    """Where every image's extent is the whole canvas the masks are all ones: eager on the CPU runs
    the backbone on the whole canvas without them and gets the masked path's levels to the bit."""
    model = _static(tiny_cfg, tiny_weights)
    batch = to_image_batch([photo(PHOTOS[0], (320, 448)), photo(PHOTOS[1], (320, 448))], tiny_cfg)
    canvas = tuple(batch.tensors.shape[-2:])
    extents = padded_extents(batch.image_sizes, tiny_cfg.size_divisible)
    assert canvas == (320, 448) and eager_crop(extents, canvas) == (canvas, None)
    masked, masked_pooled = _masked_on_canvas(model, batch, extents)
    with torch.no_grad():
        features, pooled, got = model.features(batch)
    assert torch.equal(got, extents)
    for level, (m, f) in enumerate(zip(masked, features)):
        torch.testing.assert_close(f, m, atol=0, rtol=0, msg=f"level {level}")
    for level, (m, p) in enumerate(zip(masked_pooled, pooled)):
        torch.testing.assert_close(p, m, atol=0, rtol=0, msg=f"pooled {level}")


@pytest.mark.parametrize("sizes", [[(320, 385)], [(287, 512)], [(320, 448), (320, 385)], [(288, 416), (256, 448)]])
def test_eager_runs_the_backbone_on_the_largest_extent_with_the_canvas_maps(tiny_cfg, tiny_weights, sizes):
    """Eager on the CPU crops the canvas to the batch's largest extent (masked only where the
    extents differ): every level, the RPN's and RoIAlign's, is the graphs' masked canvas map on the
    crop, to float rounding, zero outside each extent; RoIAlign's past each smaller extent hold its
    edge. A compiled graph or another device keeps the canvas, masked."""
    model = _static(tiny_cfg, tiny_weights)
    batch = to_image_batch([photo(PHOTOS[i % 2], size) for i, size in enumerate(sizes)], tiny_cfg)
    canvas = tuple(batch.tensors.shape[-2:])
    extents = padded_extents(batch.image_sizes, tiny_cfg.size_divisible)
    crop, masked_extents = eager_crop(extents, canvas)
    assert crop == tuple(extents.amax(0).tolist()) and (crop != canvas or masked_extents is not None)
    assert (masked_extents is None) == (len(set(map(tuple, extents.tolist()))) == 1)
    assert eager_crop(extents.to("meta"), canvas)[0] == canvas
    masked, masked_pooled = _masked_on_canvas(model, batch, extents)
    with torch.no_grad():
        features, pooled, _ = model.features(batch)
    for level, (m, f) in enumerate(zip(masked + masked_pooled, features + pooled)):
        h, w = canvas_level_size(crop, level % 5)  # P2..P6, then pooled P2..P5
        assert f.shape == (*m.shape[:2], h, w), level
        # Only float summation order differs (convolutions of different sizes).
        torch.testing.assert_close(f, m[..., :h, :w], atol=1e-5 * float(m.abs().max()), rtol=0, msg=f"level {level}")
        if level < 5:  # nothing outside the crop but the pooled levels' edge copies
            assert float(m[..., h:, :].abs().sum() + m[..., :, w:].abs().sum()) == 0.0, level


def test_calibrated_weights_give_distinct_scores_on_photographs(reference):
    """The parity below means something only if torchvision's own answer is a function of its scores:
    with saturated scores (1.0 in fp32) it depends on how its sort orders ties instead."""
    for seed, detections in reference.items():
        for det in detections:
            scores = det["scores"]
            assert len(scores) >= 40 and scores.unique().numel() == len(scores) and bool((scores < 1).all()), seed


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ops_impl", ["torchvision", "tensor"])
def test_detections_match_torchvision(tiny_cfg, weights, images, reference, seed, ops_impl):
    """Padding adds no error: each image on its canvas gives torchvision's detections, with either
    op path; for the torchvision ops also what a canvas equal to its extent gives."""
    subset = _subset(images, seed)
    out = _static(tiny_cfg, weights[seed], ops_impl=ops_impl).predict(subset)
    assert_detections_match(reference[seed], out, f"seed {seed}, {ops_impl} ops: canvas vs torchvision")
    if ops_impl == "torchvision":
        on_extent = _on_extent(tiny_cfg, weights[seed], subset, ops_impl=ops_impl)
        assert_detections_match(on_extent, out, f"seed {seed}: vs extent canvas")


def test_tensor_ops_padding_changes_nothing(tiny_cfg, tiny_weights, images):
    """The pure-tensor ops on a larger canvas give what they give on a canvas equal to the extent."""
    model = _static(tiny_cfg, tiny_weights, ops_impl="tensor")
    subset = _subset(images, 2)  # every other image keeps the test short
    on_extent = _on_extent(tiny_cfg, tiny_weights, subset, ops_impl="tensor")
    assert_detections_match(on_extent, model.predict(subset), "tensor ops")


def test_tensor_ops_match_torchvision_with_ties_by_index(tiny_cfg, images):
    """Where torchvision's answer depends on tie order, the pure-tensor ops give the index order's.

    Weights calibrated on textured images alone (``synthetic_weights``' batch before white noise
    joined it) saturate the RPN's objectness on these photographs: sigmoid is 1.0 in fp32 for every
    proposal, and which tied boxes torchvision keeps is whatever order its unstable sort leaves.
    The first assertion shows the ties decide torchvision's own answer; the second, that the tensor
    NMS (ties by index) agrees with torchvision once torchvision follows the same rule.
    """
    sizes = ((tiny_cfg.min_size, int(tiny_cfg.min_size * 1.3)), (tiny_cfg.min_size, tiny_cfg.min_size))
    saturating = synthetic_weights(tiny_cfg, 2, textured_images(sizes, 2))
    subset = _subset(images, 2)
    tv = torchvision_model(tiny_cfg).eval()
    tv.load_state_dict(saturating)
    with torch.no_grad():
        shipped = [tv([img])[0] for img in subset]
        with torchvision_stable_ties():
            by_index = [tv([img])[0] for img in subset]
    assert not all(same_detections(a, b) for a, b in zip(shipped, by_index)), "no ties: the test shows nothing"
    out = _static(tiny_cfg, saturating, ops_impl="tensor").predict(subset)
    assert_detections_match(by_index, out, "tensor ops vs torchvision with ties by index")


def test_batch_of_two_sizes_matches_each_alone(tiny_cfg, tiny_weights, images, reference):
    """Two images with different extents share the 320x512 canvas: each gets its own detections."""
    pair = [images[OFF_CANVAS_SIZES.index((320, 385))], images[OFF_CANVAS_SIZES.index((257, 512))]]
    batch = to_image_batch(pair, tiny_cfg)
    assert tuple(batch.tensors.shape[-2:]) == (320, 512)
    model = _static(tiny_cfg, tiny_weights, ops_impl="torchvision")
    with torch.no_grad():
        out = postprocess(model(batch), batch)
    expected = [reference[0][OFF_CANVAS_SIZES.index((320, 385))], reference[0][OFF_CANVAS_SIZES.index((257, 512))]]
    assert_detections_match(expected, out, "batch of two")


def test_without_masking_padding_leaks(tiny_cfg, tiny_weights, images, reference):
    """The switch that turns masking off (for the cost measurement) shows the issue it fixes."""
    model = _static(tiny_cfg, tiny_weights, ops_impl="torchvision", mask_padding=False)
    out = model.predict(images[:5])
    matched = sum(match_detections(r, o).matched for r, o in zip(reference[0][:5], out))
    assert matched < 0.95 * sum(len(r["boxes"]) for r in reference[0][:5])


@pytest.mark.slow
def test_training_losses_on_a_larger_canvas(tiny_cfg, tiny_weights):
    """Losses and head gradients equal torchvision's batched training (padded to the batch's largest
    extent, 160x224) on a 224x288 canvas; 160 / 32 is odd, so the stride-64 anchors differ too."""
    cfg = parity_config(tiny_cfg, canvas=(224, 288))  # the training parity tests' deterministic sampling
    images, per_image = parity_batch(cfg)
    ref_losses, ref_grads = torchvision_losses(cfg, tiny_weights, images, per_image)
    losses, grads = static_losses(cfg, tiny_weights, images, pad_targets(per_image, 8, (224, 288)))
    # Convolutions over a larger canvas sum in another order (features equal to ~1e-6 relative),
    # enough to flip a box-head ReLU at its kink: the tolerance of the inexact-kernel case.
    assert_parity(losses, grads, ref_losses, ref_grads, exact_kernels=False)


@pytest.mark.slow
def test_compiled_fullgraph_matches_torchvision(tiny_cfg, tiny_weights, images, reference):
    i = OFF_CANVAS_SIZES.index((287, 512))
    model = _static(tiny_cfg, tiny_weights, ops_impl="torchvision")
    compiled = torch.compile(model, fullgraph=True)
    batch = to_image_batch([images[i]], tiny_cfg)
    with torch.no_grad():
        out = postprocess(compiled(batch), batch)
    assert_detections_match([reference[0][i]], out, "torch.compile")


@pytest.mark.slow
@pytest.mark.xla
def test_xla_padding_changes_nothing(tiny_cfg, tiny_weights, images):
    """On XLA (pure-tensor ops), the canvas gives what a canvas equal to the extent gives.

    Compared on XLA itself: XLA and eager CPU differ by float rounding that flips a few boxes at the
    thresholds (``tests/mrcnn/test_xla.py`` allows 5%) whatever the padding.
    """
    pytest.importorskip("torch_xla", reason="torch_xla is not installed")
    import torch_xla  # optional backend: imported only where the test runs

    image = images[OFF_CANVAS_SIZES.index((465, 320))]
    device = torch_xla.device()
    model = _static(tiny_cfg, tiny_weights, ops_impl="tensor").to(device)
    extent = tuple(padded_extents(torch.tensor(image.shape[-2:]), tiny_cfg.size_divisible).tolist())
    exact = _static(tiny_cfg, tiny_weights, ops_impl="tensor", canvases=(extent,)).to(device)
    assert_detections_match(exact.predict([image]), model.predict([image]), "XLA: canvas vs extent canvas")
