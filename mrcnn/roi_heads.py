"""Box branch: fixed P proposals in, fixed K detections out, then the mask branch on those K.

torchvision's postprocess_detections drops low scores and empty boxes and keeps what NMS leaves.
Here those become masks on a fixed candidate list: the ``box_pre_nms_top_n`` best (box, class)
pairs go into per-class NMS with K outputs. Every box that survives torchvision's NMS and ranks in
its top K is among those candidates as long as fewer than ``box_pre_nms_top_n`` candidates are
needed to find K survivors, because NMS only looks at higher-scoring boxes of the same class.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead

from mrcnn.box_ops import clip_boxes, decode_boxes, large_enough
from mrcnn.config import Config
from mrcnn.mask_head import build_mask_modules, mask_logits, mask_probabilities
from mrcnn.ops import multilevel_roi_align, nms_fixed, resolve_impl
from mrcnn.structures import Detections, Proposals

_BOX_ROI_SIZE = 7
_MIN_DETECTION_SIZE = 1e-2  # torchvision's postprocess_detections remove_small_boxes


class RoIHeads(nn.Module):
    """Holds torchvision's box and mask modules under torchvision's attribute names."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.box_head = TwoMLPHead(cfg.fpn_channels * _BOX_ROI_SIZE**2, cfg.representation_size)
        self.box_predictor = FastRCNNPredictor(cfg.representation_size, cfg.num_classes)
        self.mask_head, self.mask_predictor = build_mask_modules(cfg)

    def box_logits(self, features: list[Tensor], boxes: Tensor) -> tuple[Tensor, Tensor]:
        """boxes [B, R, 4] -> class logits [B, R, num_classes], deltas [B, R, num_classes, 4]."""
        b, r = boxes.shape[:2]
        pooled = multilevel_roi_align(
            features, boxes, _BOX_ROI_SIZE, sampling_ratio=2, impl=resolve_impl(self.cfg.ops_impl, boxes.device)
        )
        class_logits, deltas = self.box_predictor(self.box_head(pooled.flatten(0, 1)))
        return class_logits.view(b, r, -1), deltas.view(b, r, -1, 4)

    def detect(self, class_logits: Tensor, deltas: Tensor, proposals: Proposals, image_sizes: Tensor) -> Detections:
        """Static postprocess_detections: [B, P, ...] head outputs -> K detections per image (no masks)."""
        cfg = self.cfg
        b, p, c = class_logits.shape
        boxes = clip_boxes(decode_boxes(deltas, proposals.boxes, cfg.bbox_reg_weights), image_sizes)  # [B,P,C,4]
        scores = F.softmax(class_logits, -1)
        labels = torch.arange(c, device=scores.device).expand(b, p, c)

        # Every (proposal, foreground class) pair is a candidate; filters become a valid mask.
        boxes, scores, labels = boxes[:, :, 1:].reshape(b, -1, 4), scores[:, :, 1:].reshape(b, -1), labels[:, :, 1:].reshape(b, -1)
        valid = (scores > cfg.box_score_thresh) & large_enough(boxes, _MIN_DETECTION_SIZE)
        valid &= proposals.valid[:, :, None].expand(b, p, c - 1).reshape(b, -1)

        # Keep the best candidates only: NMS cost grows with the square of their number.
        top = torch.where(valid, scores, torch.full_like(scores, -1.0)).topk(cfg.box_pre_nms_top_n, dim=1).indices
        boxes = boxes.gather(1, top[..., None].expand(-1, -1, 4))
        scores, labels, valid = scores.gather(1, top), labels.gather(1, top), valid.gather(1, top)

        keep, keep_valid = nms_fixed(
            boxes, scores, valid, cfg.box_nms_thresh, cfg.box_detections_per_img, groups=labels,
            impl=resolve_impl(cfg.ops_impl, boxes.device), iterations=cfg.nms_iterations,
        )
        zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
        return Detections(
            boxes=torch.where(keep_valid[..., None], boxes.gather(1, keep[..., None].expand(-1, -1, 4)), zero),
            scores=torch.where(keep_valid, scores.gather(1, keep), zero),
            labels=torch.where(keep_valid, labels.gather(1, keep), torch.zeros_like(keep)),
            masks=scores.new_zeros(()),  # filled by the mask branch
            valid=keep_valid,
        )

    def forward(self, features: list[Tensor], proposals: Proposals, image_sizes: Tensor) -> Detections:
        """features: P2..P5 [B, C, H_l, W_l] -> Detections with K slots per image."""
        class_logits, deltas = self.box_logits(features, proposals.boxes)
        det = self.detect(class_logits, deltas, proposals, image_sizes)
        logits = mask_logits(self.cfg, self.mask_head, self.mask_predictor, features, det.boxes)
        masks = mask_probabilities(logits, det.labels) * det.valid[..., None, None]
        return Detections(det.boxes, det.scores, det.labels, masks, det.valid)
