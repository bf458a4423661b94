"""Region proposal network with a fixed number of proposals per image.

torchvision keeps however many boxes survive its filters; here every filter becomes a mask:
top-k per level (static k), decode, clip, small boxes marked invalid, per-level NMS with a fixed
output size, then the best ``post_nms_top_n`` by objectness. Padded slots carry valid=False.

Training adds torchvision's RPN losses: every anchor is matched to the padded ground truth
(Matcher(fg, bg, allow_low_quality_matches=True)), and a fixed number of anchors per image is
sampled (``rpn_batch_size_per_image``) with random keys plus top-k.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.models.detection.rpn import RPNHead

from mrcnn.anchors import Anchors
from mrcnn.backbone import canvas_level_size, canvas_levels
from mrcnn.box_ops import RPN_BOX_WEIGHTS, box_iou, clip_boxes, decode_boxes, large_enough
from mrcnn.config import Config
from mrcnn.losses import rpn_losses
from mrcnn.matching import BELOW_LOW_THRESHOLD, BETWEEN_THRESHOLDS, match, sample_balanced
from mrcnn.ops import nms_fixed_segments, resolve_impl
from mrcnn.structures import Proposals, Targets

_MIN_PROPOSAL_SIZE = 1e-3  # torchvision's RegionProposalNetwork.min_size


def flatten_head_outputs(maps: list[Tensor], channels_per_anchor: int) -> Tensor:
    """[B, A*c, H, W] per level -> [B, sum_l H*W*A, c], ordered (level, y, x, anchor) like anchors."""
    flat = []
    for m in maps:
        b, _, h, w = m.shape
        flat.append(m.view(b, -1, channels_per_anchor, h, w).permute(0, 3, 4, 1, 2).reshape(b, -1, channels_per_anchor))
    return torch.cat(flat, 1)


class RegionProposalNetwork(nn.Module):
    """``head`` is torchvision's RPNHead, so ``rpn.head.*`` weights load unchanged."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.anchors = Anchors(cfg)
        self.head = RPNHead(cfg.fpn_channels, cfg.num_anchors_per_location)

    def forward(
        self,
        features: list[Tensor],
        image_sizes: Tensor,
        canvas: tuple[int, int],
        targets: Targets | None = None,
        image_valid: Tensor | None = None,
        extents: Tensor | None = None,
    ) -> tuple[Proposals, dict[str, Tensor]]:
        """features: FPN levels [B, C, H_l, W_l] of the canvas (eager: of its top-left crop that
        holds every extent); image_sizes [B, 2] -> (Proposals, losses).

        With ``targets`` (training) the losses are ``loss_objectness`` and ``loss_rpn_box_reg``;
        ``image_valid`` [B] bool leaves the padding slots of an incomplete batch out of them.
        Without, the dict is empty. ``extents`` [B, 2] (torchvision's padded sizes, see
        :func:`mrcnn.backbone.padded_extents`) restricts the anchors to those torchvision has: on its
        feature maps for that size and at its strides.
        """
        objectness_maps, delta_maps = self.head(features)
        if tuple(features[0].shape[-2:]) != canvas_level_size(canvas, 0):
            # Eager's crop of the canvas (mrcnn.backbone.eager_crop): the head ran on the crop's maps,
            # which is what the canvas's give inside every extent; outside, no anchor is ``inside``.
            objectness_maps, delta_maps = canvas_levels(objectness_maps, canvas), canvas_levels(delta_maps, canvas)
        feature_sizes = [tuple(f.shape[-2:]) for f in objectness_maps]
        anchors = self.anchors(canvas, feature_sizes, extents)  # [A_total, 4], or [B, A_total, 4]
        inside = None if extents is None else self.anchors.inside(canvas, feature_sizes, extents)  # [B, A_total]
        objectness = flatten_head_outputs(objectness_maps, 1)[..., 0]  # [B, A_total]
        deltas = flatten_head_outputs(delta_maps, 4)  # [B, A_total, 4]
        # Proposals are not differentiated through (torchvision detaches them too), and are decoded
        # in fp32 even under autocast: bf16 cannot hold box coordinates to a pixel.
        proposals = self.propose(
            objectness.detach().float(), deltas.detach().float(), anchors, feature_sizes, image_sizes, inside
        )
        if targets is None:
            return proposals, {}
        if inside is None:
            return proposals, self.loss(objectness, deltas, anchors, targets, image_valid)
        # rpn_losses takes one anchor set for the batch: give it the canvas's, with each matched box
        # moved by the same offset as its anchor, so every box encoding stays that of its own anchor.
        shared = self.anchors(canvas, feature_sizes)
        return proposals, self.loss(objectness, deltas, anchors, targets, image_valid, inside, shared)

    def loss(
        self,
        objectness: Tensor,
        deltas: Tensor,
        anchors: Tensor,
        targets: Targets,
        image_valid: Tensor | None,
        inside: Tensor | None = None,
        shared: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """torchvision's assign_targets_to_anchors + fg_bg_sampler + compute_loss, fixed shapes.

        anchors [A, 4], or [B, A, 4] with ``inside`` [B, A] (anchors torchvision has) and ``shared``
        [A, 4] (the canvas's anchors, which the loss encodes against).
        """
        cfg = self.cfg
        gt_boxes = targets.boxes.to(anchors.dtype)
        with torch.no_grad():
            iou = box_iou(gt_boxes, anchors if anchors.dim() == 3 else anchors[None])  # [B, G, A]
            if inside is not None:  # anchors torchvision lacks neither match nor make low-quality matches
                iou = torch.where(inside[:, None, :], iou, -1.0)
            matches = match(iou, targets.valid, cfg.rpn_fg_iou_thresh, cfg.rpn_bg_iou_thresh, True)
            labels = torch.where(matches >= 0, 1, 0)
            labels = torch.where(matches == BELOW_LOW_THRESHOLD, 0, labels)
            labels = torch.where(matches == BETWEEN_THRESHOLDS, -1, labels)
            if image_valid is not None:
                labels = torch.where(image_valid[:, None], labels, -1)
            if inside is not None:
                labels = torch.where(inside, labels, -1)
            samples = sample_balanced(labels, cfg.rpn_batch_size_per_image, cfg.rpn_positive_fraction)
            matched_boxes = gt_boxes.gather(1, matches.clamp(min=0)[..., None].expand(-1, -1, 4))
            if shared is not None:
                matched_boxes = matched_boxes + (shared[None] - anchors)
                anchors = shared
        return rpn_losses(objectness, deltas, anchors, matched_boxes, samples)

    def propose(
        self,
        objectness: Tensor,
        deltas: Tensor,
        anchors: Tensor,
        feature_sizes: list[tuple[int, int]],
        image_sizes: Tensor,
        inside: Tensor | None = None,
    ) -> Proposals:
        """objectness [B, A], deltas [B, A, 4], anchors [A, 4] or [B, A, 4] -> P proposals per image.

        ``inside`` [B, A] bool: anchors that may become proposals. The others rank last in each
        level's top-k and stay invalid, so the candidates are torchvision's whenever its map holds
        at least k anchors, and its whole map (plus invalid slots) otherwise.
        """
        cfg = self.cfg
        if inside is not None:
            objectness = torch.where(inside, objectness, float("-inf"))
        pre_nms = cfg.rpn_pre_nms_top_n_train if self.training else cfg.rpn_pre_nms_top_n_test
        post_nms = cfg.rpn_post_nms_top_n_train if self.training else cfg.rpn_post_nms_top_n_test

        # Top-k per level. k is fixed by the canvas, so every index tensor has a static size.
        index, sizes = [], []
        start = 0
        for h, w in feature_sizes:
            count = h * w * cfg.num_anchors_per_location
            sizes.append(k := min(pre_nms, count))
            index.append(objectness[:, start : start + count].topk(k, dim=1).indices + start)
            start += count
        index = torch.cat(index, 1)  # [B, N], N = sum(sizes), level by level

        scores = torch.sigmoid(objectness.gather(1, index))
        picked_deltas = deltas.gather(1, index[..., None].expand(-1, -1, 4))
        picked_anchors = anchors[index] if anchors.dim() == 2 else anchors.gather(1, index[..., None].expand(-1, -1, 4))
        boxes = decode_boxes(picked_deltas[:, :, None], picked_anchors, RPN_BOX_WEIGHTS)[:, :, 0]
        boxes = clip_boxes(boxes, image_sizes)
        valid = large_enough(boxes, _MIN_PROPOSAL_SIZE) & (scores >= cfg.rpn_score_thresh)
        if inside is not None:
            valid &= inside.gather(1, index)

        # NMS within each level, one problem per level; the result is score-ordered, so its first
        # post_nms are the proposals.
        keep, keep_valid = nms_fixed_segments(
            boxes,
            scores,
            valid,
            sizes,
            cfg.rpn_nms_thresh,
            post_nms,
            impl=resolve_impl(cfg.ops_impl, boxes.device),
            iterations=cfg.nms_iterations,
        )
        boxes = boxes.gather(1, keep[..., None].expand(-1, -1, 4))
        scores = torch.where(
            keep_valid, scores.gather(1, keep), torch.zeros((), dtype=scores.dtype, device=scores.device)
        )
        return Proposals(boxes, scores, keep_valid)
