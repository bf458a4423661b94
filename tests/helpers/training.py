"""Training-forward helpers: small configs, random and realistic targets, and torchvision's losses.

Shared by the training, padding-parity, channels-last, mask-bucket and CUDA tests. Shapes: B images,
G padded ground-truth slots per image, masks [B, G, S, S] (cropped) or [B, G, H, W] (full canvas).
"""

from __future__ import annotations

import math

import torch
from torchvision.ops import roi_align

from mrcnn.model import MaskRCNN
from mrcnn.reference import torchvision_model
from mrcnn.structures import ImageBatch, Targets
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, textured_images

LOSS_NAMES = {"loss_objectness", "loss_rpn_box_reg", "loss_classifier", "loss_box_reg", "loss_mask"}
HEADS = ("rpn.head", "roi_heads.box_head", "roi_heads.box_predictor", "roi_heads.mask_head", "roi_heads.mask_predictor")

# Parity batch: two sizes already at the parity config's scale (short side 160, long side <= 256), so
# torchvision's training transform leaves images, boxes and masks untouched, and its batch padding
# (160 x 224) is the static model's canvas.
PARITY_SIZES = ((160, 224), (160, 192))


def shape_objects(height: int, width: int, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` realistic instance masks (ellipses, stars, rings) [n, h, w] uint8 and their tight boxes [n, 4]."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(height) + 0.5, torch.arange(width) + 0.5, indexing="ij")
    masks, boxes = [], []
    while len(masks) < count:
        kind = int(torch.randint(0, 3, (1,), generator=g))
        cx, cy = (torch.rand(2, generator=g) * torch.tensor([width, height])).tolist()
        r = float(6 + torch.rand(1, generator=g) * min(height, width) * 0.3)
        angle = float(torch.rand(1, generator=g) * math.pi)
        u = (xx - cx) * math.cos(angle) + (yy - cy) * math.sin(angle)
        v = -(xx - cx) * math.sin(angle) + (yy - cy) * math.cos(angle)
        radius = torch.sqrt(u * u + v * v)
        if kind == 0:
            m = (u / r) ** 2 + (v / (0.5 * r)) ** 2 <= 1
        elif kind == 1:
            m = radius <= r * (0.6 + 0.4 * torch.cos(5 * torch.atan2(v, u)))
        else:
            m = (radius <= r) & (radius >= 0.5 * r)
        ys, xs = torch.where(m)
        if len(ys) < 20:
            continue
        masks.append(m.to(torch.uint8))
        boxes.append(torch.tensor([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=torch.float32))
    if not masks:
        return torch.zeros(0, height, width, dtype=torch.uint8), torch.zeros(0, 4)
    return torch.stack(masks), torch.stack(boxes)


def crop_masks(masks: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """Host-side crop as the data pipeline does it: RoIAlign of the mask on its box, thresholded at 0.5."""
    if len(masks) == 0:
        return torch.zeros(0, size, size, dtype=torch.uint8)
    rois = torch.cat([torch.arange(len(boxes), dtype=torch.float32)[:, None], boxes], 1)
    return (roi_align(masks[:, None].float(), rois, (size, size), 1.0)[:, 0] >= 0.5).to(torch.uint8)


def pad_targets(per_image: list[dict], g: int, mask_size: tuple[int, int] | int) -> Targets:
    """torchvision-style per-image dicts -> padded Targets (masks already at ``mask_size``)."""
    b = len(per_image)
    mh, mw = (mask_size, mask_size) if isinstance(mask_size, int) else mask_size
    boxes = torch.zeros(b, g, 4)
    labels = torch.zeros(b, g, dtype=torch.int64)
    masks = torch.zeros(b, g, mh, mw, dtype=torch.uint8)
    valid = torch.zeros(b, g, dtype=torch.bool)
    for i, t in enumerate(per_image):
        n = len(t["boxes"])
        boxes[i, :n], labels[i, :n], valid[i, :n] = t["boxes"], t["labels"], True
        masks[i, :n, : t["masks"].shape[1], : t["masks"].shape[2]] = t["masks"]
    return Targets(boxes, labels, masks, valid)


def random_targets(cfg, batch: ImageBatch, counts: list[int], seed: int) -> Targets:
    """Padded targets with counts[i] valid objects in image i (cropped S x S masks)."""
    g = torch.Generator().manual_seed(seed)
    b, gmax, s = len(counts), cfg.max_gt_instances, cfg.gt_mask_size
    sizes = batch.image_sizes.to(torch.float32)
    xy = torch.rand(b, gmax, 2, generator=g) * sizes[:, None].flip(-1) * 0.6
    wh = 8 + torch.rand(b, gmax, 2, generator=g) * sizes[:, None].flip(-1) * 0.35
    valid = torch.arange(gmax)[None] < torch.tensor(counts)[:, None]
    labels = torch.where(valid, torch.randint(1, cfg.num_classes, (b, gmax), generator=g), 0)
    masks = (torch.rand(b, gmax, s, s, generator=g) > 0.3).to(torch.uint8)
    return Targets(torch.cat([xy, xy + wh], -1), labels, masks, valid)


def small_cfg(tiny_cfg, **overrides):
    """A 128 x 128 canvas and small static sizes: fast enough to compile in a unit test."""
    base = dict(
        min_size=128,
        max_size=128,
        canvases=((128, 128),),
        rpn_pre_nms_top_n_train=200,
        rpn_post_nms_top_n_train=100,
        box_batch_size_per_image=32,
        max_gt_instances=4,
        gt_mask_size=16,
    )
    base.update(overrides)
    return tiny_cfg.replace(**base)


SMALL_SIZES = ((128, 128), (96, 128))  # (h, w) of the images on small_cfg's 128 x 128 canvas


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference over the largest absolute reference entry."""
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


def parity_config(tiny_cfg, canvas: tuple[int, int] = (160, 224)):
    """Configs that make both samplers take every candidate, so the losses are deterministic.

    Half the tiny preset's scale (the same model, four times cheaper), on one ``canvas`` (h, w): the
    default is torchvision's own batch padding of ``PARITY_SIZES``.
    """
    return tiny_cfg.replace(
        min_size=160,
        max_size=256,
        canvases=(canvas,),
        rpn_batch_size_per_image=1 << 17,  # > anchors: all positive and negative anchors
        box_batch_size_per_image=2048,  # > proposals + GT: all positive and negative RoIs
        box_positive_fraction=1 / 16,  # positive quota 128 (all positives), which is also the mask RoI count
        # torchvision's model runs NCHW with its norms unfolded; the same keeps the exact-kernel
        # comparison at 1e-4 (NHWC and folded norms sum in another order:
        # tests/mrcnn/test_channels_last.py and test_fold_norms.py compare them).
        channels_last=False,
        fold_batch_norm=False,
    )


def parity_batch(cfg) -> tuple[list[torch.Tensor], list[dict]]:
    """The two ``PARITY_SIZES`` images [3, h, w] and their 5 and 3 objects, torchvision-style dicts
    (boxes [n, 4], labels [n], full-image masks [n, h, w] uint8)."""
    images = textured_images(PARITY_SIZES, seed=3)
    g = torch.Generator().manual_seed(0)
    per_image = []
    for i, ((h, w), count) in enumerate(zip(PARITY_SIZES, (5, 3))):
        masks, boxes = shape_objects(h, w, count, seed=10 + i)
        labels = torch.randint(1, cfg.num_classes, (count,), generator=g)
        per_image.append({"boxes": boxes, "labels": labels, "masks": masks})
    return images, per_image


def torchvision_losses(cfg, weights, images, per_image):
    """torchvision's training forward and backward -> (losses, parameter gradients by name)."""
    tv = torchvision_model(cfg)
    tv.load_state_dict(weights)
    tv.train()
    losses = tv(images, [{k: v.clone() for k, v in t.items()} for t in per_image])
    sum(losses.values()).backward()
    grads = {n: p.grad for n, p in tv.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in losses.items()}, grads


def static_losses(cfg, weights, images, targets):
    """The static model's training forward and backward -> (losses, parameter gradients by name)."""
    model = load_torchvision_weights(MaskRCNN(cfg), weights).train()
    losses = model(to_image_batch(images, cfg), targets)
    sum(losses.values()).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in losses.items()}, grads


def assert_parity(losses, grads, ref_losses, ref_grads, exact_kernels: bool = True):
    """Losses within 1e-4 (relative); head gradients within 1e-4 of the largest entry of each tensor.

    ``exact_kernels=False`` (the pure-tensor RoIAlign, equal to torchvision's kernel to ~1e-7 but not
    bit for bit): such a difference flips the few ReLUs of the heads whose input sits within it of
    zero, and each flip moves the gradients of every layer below it for that RoI. How many units sit
    that close depends on the weights (the same weights calibrated with one thread instead of two,
    float summation order alone, flip two of the mask head's three million units and move its first
    layers' gradients by up to 1e-3 of their largest entry, while the losses stay equal to 1e-7).
    So the tensor path's gradients are held to 1e-3 in norm and 5e-3 per entry here; the kernel's
    own gradient is held to 1e-5 of torchvision's in tests/mrcnn/test_ops_roi_align.py, where no
    ReLU follows it.
    """
    assert set(losses) == LOSS_NAMES == set(ref_losses)
    for name in LOSS_NAMES:
        assert abs(float(losses[name] - ref_losses[name])) <= 1e-4 * abs(float(ref_losses[name])), (
            name,
            float(losses[name]),
            float(ref_losses[name]),
        )
    for head in HEADS:
        names = [n for n in ref_grads if n.startswith(head)]
        assert names, head
        for n in names:
            g, ref = grads[n], ref_grads[n]
            if exact_kernels:
                assert rel(g, ref) <= 1e-4, (n, rel(g, ref))
            else:
                assert float((g - ref).norm() / ref.norm()) <= 1e-3 and rel(g, ref) <= 5e-3, (n, rel(g, ref))
