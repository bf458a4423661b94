"""Region proposal network with a fixed number of proposals per image.

torchvision keeps however many boxes survive its filters; here every filter becomes a mask:
top-k per level (static k), decode, clip, small boxes marked invalid, per-level NMS with a fixed
output size, then the best ``post_nms_top_n`` by objectness. Padded slots carry valid=False.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.models.detection.rpn import RPNHead

from mrcnn.anchors import Anchors
from mrcnn.box_ops import clip_boxes, decode_boxes, large_enough
from mrcnn.config import Config
from mrcnn.ops import nms_fixed, resolve_impl
from mrcnn.structures import Proposals

_RPN_BOX_WEIGHTS = (1.0, 1.0, 1.0, 1.0)
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

    def forward(self, features: list[Tensor], image_sizes: Tensor, canvas: tuple[int, int]) -> Proposals:
        """features: FPN levels [B, C, H_l, W_l]; image_sizes [B, 2] -> Proposals with P boxes per image."""
        cfg = self.cfg
        objectness_maps, delta_maps = self.head(features)
        feature_sizes = [tuple(f.shape[-2:]) for f in features]
        anchors = self.anchors(canvas, feature_sizes)  # [A_total, 4]
        objectness = flatten_head_outputs(objectness_maps, 1)[..., 0].detach()  # [B, A_total]
        deltas = flatten_head_outputs(delta_maps, 4).detach()  # [B, A_total, 4]

        pre_nms = cfg.rpn_pre_nms_top_n_train if self.training else cfg.rpn_pre_nms_top_n_test
        post_nms = cfg.rpn_post_nms_top_n_train if self.training else cfg.rpn_post_nms_top_n_test

        # Top-k per level. k is fixed by the canvas, so every index tensor has a static size.
        index, level = [], []
        start = 0
        for lvl, (h, w) in enumerate(feature_sizes):
            count = h * w * cfg.num_anchors_per_location
            k = min(pre_nms, count)
            index.append(objectness[:, start : start + count].topk(k, dim=1).indices + start)
            level.append(torch.full((k,), lvl, dtype=torch.int64, device=objectness.device))
            start += count
        index = torch.cat(index, 1)  # [B, N]
        level = torch.cat(level).expand_as(index)

        scores = torch.sigmoid(objectness.gather(1, index))
        picked_deltas = deltas.gather(1, index[..., None].expand(-1, -1, 4))
        boxes = decode_boxes(picked_deltas[:, :, None], anchors[index], _RPN_BOX_WEIGHTS)[:, :, 0]
        boxes = clip_boxes(boxes, image_sizes)
        valid = large_enough(boxes, _MIN_PROPOSAL_SIZE) & (scores >= cfg.rpn_score_thresh)

        # NMS within each level; the result is score-ordered, so its first post_nms are the proposals.
        keep, keep_valid = nms_fixed(
            boxes, scores, valid, cfg.rpn_nms_thresh, post_nms, groups=level,
            impl=resolve_impl(cfg.ops_impl, boxes.device), iterations=cfg.nms_iterations,
        )
        boxes = boxes.gather(1, keep[..., None].expand(-1, -1, 4))
        scores = torch.where(keep_valid, scores.gather(1, keep), torch.zeros((), dtype=scores.dtype, device=scores.device))
        return Proposals(boxes, scores, keep_valid)

