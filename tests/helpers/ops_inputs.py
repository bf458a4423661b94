"""Inputs and dynamic references for the op tests: clustered boxes that NMS really suppresses, FPN-like
pyramids, RoIs over every level and corner case, and torchvision's batched_nms and MultiScaleRoIAlign.

Shapes: G problems (images) of N candidate boxes [G, N, 4] (x1, y1, x2, y2), scores [G, N]; B images
of R RoIs [B, R, 4]; pyramid level l of [B, C, ceil(H_0 / 2**l), ceil(W_0 / 2**l)].
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torchvision

IMPLS = ["tensor", "torchvision"]


def clustered_boxes(gen: torch.Generator, g: int, n: int, clusters: int, size=(480.0, 640.0)):
    """[G, N, 4] boxes jittered around a few objects, so NMS really suppresses; scores [G, N].

    Coordinates are multiples of 1/8 px: torchvision's batched_nms shifts each group by a large
    offset below 1000 boxes (the "coordinate trick"), and on such a grid the shift is exact, so
    its IoUs are bit-identical to the unshifted ones and the comparison cannot flip on rounding.
    Scores are distinct: batched_nms orders equal scores arbitrarily (its final sort is unstable).
    """
    h, w = size
    centre = torch.rand(g, clusters, 2, generator=gen) * torch.tensor([w, h])
    extent = torch.rand(g, clusters, 2, generator=gen) * 150 + 20
    pick = torch.randint(0, clusters, (g, n), generator=gen)[..., None].expand(g, n, 2)
    c, e = centre.gather(1, pick), extent.gather(1, pick)
    c = c + torch.randn(g, n, 2, generator=gen) * e * 0.12
    e = e * torch.exp(torch.randn(g, n, 2, generator=gen) * 0.15)
    boxes = torch.round(torch.cat([c - e / 2, c + e / 2], dim=-1) * 8) / 8
    scores = torch.stack([torch.randperm(n, generator=gen) for _ in range(g)]).float() / n + 0.01
    return boxes, scores


def reference_nms(boxes, scores, valid, groups, iou_threshold, max_out) -> list[torch.Tensor]:
    """Per problem, batched_nms on the valid subset, as indices into N."""
    out = []
    for g in range(boxes.shape[0]):
        idx = valid[g].nonzero().squeeze(1)
        grp = groups[g, idx] if groups is not None else torch.zeros_like(idx)
        out.append(idx[torchvision.ops.batched_nms(boxes[g, idx], scores[g, idx], grp, iou_threshold)][:max_out])
    return out


def pyramid(gen: torch.Generator, b: int, c: int, h0: int, w0: int, levels: int = 4, dtype=torch.float32):
    """FPN-like features: level l is ceil(h0 / 2**l) x ceil(w0 / 2**l), as strided convs give."""
    return [torch.randn(b, c, -(-h0 // 2**i), -(-w0 // 2**i), generator=gen, dtype=dtype) for i in range(levels)]


def roi_boxes(gen: torch.Generator, b: int, image_hw: tuple[int, int]) -> torch.Tensor:
    """[B, R, 4] boxes over all FPN levels plus the corner cases the kernel has rules for."""
    h, w = image_hw
    special = torch.tensor(
        [
            [10.0, 10.0, 10.0, 30.0],  # zero width
            [20.0, 20.0, 20.0, 20.0],  # a point: zero area, level k_min
            [40.0, 10.0, 30.0, 30.0],  # x2 < x1: NaN level in torchvision, pools to zero
            [-30.0, -20.0, w + 25.0, h + 40.0],  # over every border
            [w - 16.0, h - 12.0, float(w), float(h)],  # touching the bottom-right border
            [0.0, 0.0, 8.0, 8.0],  # touching the top-left border
            [w + 10.0, 5.0, w + 90.0, 60.0],  # entirely right of the image: samples beyond W
            [-90.0, -70.0, -6.0, -5.0],  # entirely above-left: samples below -1
            [4.0, 4.0, 4.5, 4.25],  # sub-pixel
            [-200.0, -150.0, 500.0, 450.0],  # huge: level 5
            [8.0, 12.0, 160.0, 172.0],  # ~150 px: level 3
            [-40.0, -30.0, 280.0, 260.0],  # ~300 px: level 4
            # Level 2 (scale 1/4), 112 px tall: at output size 7 the bins are 4 feature rows and
            # a sample lands exactly on y = -1, resp. y = H_0, where the kernel's bounds are
            # inclusive (the sample is clamped onto the map, not dropped).
            [10.0, -8.0, 60.0, 104.0],
            [10.0, h - 100.0, 60.0, h + 12.0],
        ]
    )
    n_random = 20
    centre = torch.rand(b, n_random, 2, generator=gen) * torch.tensor([w, h])
    # Log-uniform sizes from 1 to 700 px cover levels 2..5 (canonical 224 px -> level 4).
    extent = torch.exp(torch.rand(b, n_random, 2, generator=gen) * torch.log(torch.tensor(700.0)))
    random = torch.cat([centre - extent / 2, centre + extent / 2], dim=-1)
    return torch.cat([special.expand(b, -1, -1), random], dim=1)


def reference_roi_align(features, boxes, output_size, sampling_ratio=2):
    """torchvision.ops.MultiScaleRoIAlign with image size (4 H_0, 4 W_0), as [B, R, C, S, S]."""
    names = [f"p{i}" for i in range(len(features))]
    pooler = torchvision.ops.MultiScaleRoIAlign(names, output_size, sampling_ratio)
    h0, w0 = features[0].shape[-2:]
    image_sizes = [(4 * h0, 4 * w0)] * boxes.shape[0]
    out = pooler(OrderedDict(zip(names, features)), list(boxes), image_sizes)
    return out.view(*boxes.shape[:2], *out.shape[1:])


def nms_sample(seed: int = 0, g: int = 2, n: int = 40):
    """Clustered boxes [g, n, 4] with scores [g, n], some invalid candidates and three groups [g, n]."""
    gen = torch.Generator().manual_seed(seed)
    boxes, scores = clustered_boxes(gen, g, n, clusters=4)
    valid = torch.rand(g, n, generator=gen) > 0.2
    groups = torch.randint(0, 3, (g, n), generator=gen)
    return boxes, scores, valid, groups


def roi_sample(seed: int = 0, requires_grad: bool = False):
    """A four-level pyramid of 2 images, 3 channels (16 x 20 at level 0), and RoIs [2, R, 4] over it."""
    gen = torch.Generator().manual_seed(seed)
    features = [f.requires_grad_(requires_grad) for f in pyramid(gen, 2, 3, 16, 20)]
    return features, roi_boxes(gen, 2, (64, 80))


def compile_inputs(seed: int):
    """Both ops' inputs at once: NMS on [2, 120] clustered boxes (4 groups), RoIAlign on a 4-channel pyramid."""
    gen = torch.Generator().manual_seed(seed)
    boxes, scores = clustered_boxes(gen, 2, 120, clusters=6)
    valid = torch.rand(2, 120, generator=gen) > 0.1
    groups = torch.randint(0, 4, (2, 120), generator=gen)
    features = pyramid(gen, 2, 4, 16, 20)
    rois = roi_boxes(gen, 2, (64, 80))
    return boxes, scores, valid, groups, features, rois
