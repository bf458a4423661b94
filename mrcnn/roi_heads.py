"""Box branch: fixed P proposals in, fixed K detections out, then the mask branch on those K.

torchvision's postprocess_detections drops low scores and empty boxes and keeps what NMS leaves.
Here those become masks on a fixed candidate list: the ``box_pre_nms_top_n`` best (box, class)
pairs go into per-class NMS with K outputs. Every box that survives torchvision's NMS and ranks in
its top K is among those candidates as long as fewer than ``box_pre_nms_top_n`` candidates are
needed to find K survivors, because NMS only looks at higher-scoring boxes of the same class.

Training (:meth:`RoIHeads.loss`) follows torchvision's select_training_samples: the padded ground
truth is appended to the P proposals, every candidate is matched (Matcher(fg, bg)), and exactly
K = min(box_batch_size_per_image, P + G) candidates per image are sampled, positives first. The
mask branch takes the first int(box_batch_size_per_image * box_positive_fraction) sampled slots
(the positive quota, capped at K): they hold every sampled positive, and the loss counts only
those. ``mask_rois_per_image`` shortens that prefix to a random subset of the positives.
:meth:`RoIHeads.box_loss` and :meth:`RoIHeads.mask_branch_loss` are the two halves, so that the mask
branch can run on fewer slots that still hold every positive (``mask_train_buckets``: the batch's
positives packed into one row, whichever image they come from).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead

from mrcnn.box_ops import box_iou, clip_boxes, decode_boxes, encode_boxes, large_enough
from mrcnn.config import Config
from mrcnn.losses import fastrcnn_losses, mask_loss, mask_targets, masks_are_cropped
from mrcnn.mask_head import build_mask_modules, class_mask_logits, mask_logits, mask_probabilities, pooling_features
from mrcnn.matching import BELOW_LOW_THRESHOLD, BETWEEN_THRESHOLDS, match, sample_balanced
from mrcnn.ops import multilevel_roi_align, nms_fixed, resolve_impl
from mrcnn.structures import BoxDetections, Detections, MaskTrainingRoIs, Proposals, Targets

_MIN_DETECTION_SIZE = 1e-2  # torchvision's postprocess_detections remove_small_boxes


class RoIHeads(nn.Module):
    """Holds torchvision's box and mask modules under torchvision's attribute names."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.box_head = TwoMLPHead(cfg.fpn_channels * cfg.box_roi_size**2, cfg.representation_size)
        self.box_predictor = FastRCNNPredictor(cfg.representation_size, cfg.num_classes)
        self.mask_head, self.mask_predictor = build_mask_modules(cfg)

    def box_logits(self, features: list[Tensor], boxes: Tensor) -> tuple[Tensor, Tensor]:
        """boxes [B, R, 4] -> class logits [B, R, num_classes], deltas [B, R, num_classes, 4]."""
        b, r = boxes.shape[:2]
        impl = resolve_impl(self.cfg.ops_impl, boxes.device)
        pooled = multilevel_roi_align(
            pooling_features(features, impl), boxes, self.cfg.box_roi_size, sampling_ratio=2, impl=impl
        )
        class_logits, deltas = self.box_predictor(self.box_head(pooled.flatten(0, 1)))
        return class_logits.view(b, r, -1), deltas.view(b, r, -1, 4)

    def detect(self, class_logits: Tensor, deltas: Tensor, proposals: Proposals, image_sizes: Tensor) -> BoxDetections:
        """Static postprocess_detections: [B, P, ...] head outputs -> K detections per image (no masks)."""
        cfg = self.cfg
        b, p, c = class_logits.shape
        # Detection geometry and scores in fp32 even under autocast: bf16 boxes would move detections
        # by pixels, and torchvision's NMS kernel has no bf16 version.
        class_logits, deltas = class_logits.float(), deltas.float()
        boxes = clip_boxes(decode_boxes(deltas, proposals.boxes, cfg.bbox_reg_weights), image_sizes)  # [B,P,C,4]
        scores = F.softmax(class_logits, -1)
        labels = torch.arange(c, device=scores.device).expand(b, p, c)

        # Every (proposal, foreground class) pair is a candidate; filters become a valid mask.
        boxes, scores, labels = (
            boxes[:, :, 1:].reshape(b, -1, 4),
            scores[:, :, 1:].reshape(b, -1),
            labels[:, :, 1:].reshape(b, -1),
        )
        valid = (scores > cfg.box_score_thresh) & large_enough(boxes, _MIN_DETECTION_SIZE)
        valid &= proposals.valid[:, :, None].expand(b, p, c - 1).reshape(b, -1)

        # Keep the best candidates only: NMS cost grows with the square of their number.
        top = torch.where(valid, scores, torch.full_like(scores, -1.0)).topk(cfg.box_pre_nms_top_n, dim=1).indices
        boxes = boxes.gather(1, top[..., None].expand(-1, -1, 4))
        scores, labels, valid = scores.gather(1, top), labels.gather(1, top), valid.gather(1, top)

        keep, keep_valid = nms_fixed(
            boxes,
            scores,
            valid,
            cfg.box_nms_thresh,
            cfg.box_detections_per_img,
            groups=labels,
            impl=resolve_impl(cfg.ops_impl, boxes.device),
            iterations=cfg.nms_iterations,
        )
        zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
        return BoxDetections(
            boxes=torch.where(keep_valid[..., None], boxes.gather(1, keep[..., None].expand(-1, -1, 4)), zero),
            scores=torch.where(keep_valid, scores.gather(1, keep), zero),
            labels=torch.where(keep_valid, labels.gather(1, keep), torch.zeros_like(keep)),
            valid=keep_valid,
        )

    def forward(self, features: list[Tensor], proposals: Proposals, image_sizes: Tensor) -> Detections:
        """features: P2..P5 [B, C, H_l, W_l] -> Detections with K slots per image."""
        det = self.detect_boxes(features, proposals, image_sizes)
        return Detections(det.boxes, det.scores, det.labels, self.masks(features, det), det.valid)

    def detect_boxes(self, features: list[Tensor], proposals: Proposals, image_sizes: Tensor) -> BoxDetections:
        """The box branch: features P2..P5 and P proposals -> K detections per image, without masks.

        Valid detections fill the first slots, best first (``nms_fixed``'s order), so the mask
        branch may run on any prefix that holds them (:meth:`masks`).
        """
        class_logits, deltas = self.box_logits(features, proposals.boxes)
        return self.detect(class_logits, deltas, proposals, image_sizes)

    def masks(self, features: list[Tensor], det: BoxDetections, images: Tensor | None = None) -> Tensor:
        """The mask branch on the slots of ``det`` (all K, a prefix of n, or with ``images`` [B', n]
        slots of any images): -> [B', n, M, M] probabilities of each slot's class, zero where the
        slot is not valid. Each slot is pooled and run through the head on its own, so any slots
        that hold a detection give its values."""
        logits = mask_logits(self.cfg, self.mask_head, self.mask_predictor, features, det.boxes, images)
        return mask_probabilities(logits, det.labels) * det.valid[..., None, None]

    def loss(
        self,
        features: list[Tensor],
        proposals: Proposals,
        targets: Targets,
        canvas: tuple[int, int],
        image_valid: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """features: P2..P5; proposals [B, P]; padded targets -> the box and mask losses.

        Returns ``loss_classifier``, ``loss_box_reg`` and ``loss_mask`` (scalars). ``image_valid``
        [B] bool leaves the padding slots of an incomplete batch out of every loss.
        """
        losses, rois = self.box_loss(features, proposals, targets, image_valid)
        losses["loss_mask"] = self.mask_branch_loss(features, targets, rois, canvas)
        return losses

    def box_loss(
        self, features: list[Tensor], proposals: Proposals, targets: Targets, image_valid: Tensor | None = None
    ) -> tuple[dict[str, Tensor], MaskTrainingRoIs]:
        """Sampling and the box branch's losses -> (``loss_classifier`` and ``loss_box_reg``, the
        mask branch's training slots [B, m]: the positive quota, or ``mask_rois_per_image``)."""
        cfg = self.cfg
        dtype = proposals.boxes.dtype
        gt_boxes = targets.boxes.to(dtype)
        with torch.no_grad():
            # torchvision appends the ground truth to the proposals; padded slots stay invalid.
            boxes = torch.cat([proposals.boxes, gt_boxes], 1)  # [B, N = P + G, 4]
            candidate = torch.cat([proposals.valid, targets.valid], 1)
            if image_valid is not None:
                candidate = candidate & image_valid[:, None]
            matches = match(box_iou(gt_boxes, boxes), targets.valid, cfg.box_fg_iou_thresh, cfg.box_bg_iou_thresh)
            gt_index = matches.clamp(min=0)
            labels = targets.labels.gather(1, gt_index)
            labels = torch.where(matches == BELOW_LOW_THRESHOLD, 0, labels)
            labels = torch.where(matches == BETWEEN_THRESHOLDS, -1, labels)
            labels = torch.where(candidate, labels, -1)  # padding is never sampled
            samples = sample_balanced(labels, cfg.box_batch_size_per_image, cfg.box_positive_fraction)

            idx = samples.index
            # Padded slots get an empty box: whatever the padding held, the heads see finite input.
            rois = torch.where(samples.valid[..., None], boxes.gather(1, idx[..., None].expand(-1, -1, 4)), 0.0)
            roi_labels = torch.where(samples.positive, labels.gather(1, idx), 0)
            roi_gt = gt_index.gather(1, idx)
            matched = gt_boxes.gather(1, roi_gt[..., None].expand(-1, -1, 4))
            regression = torch.where(
                samples.positive[..., None], encode_boxes(matched, rois, cfg.bbox_reg_weights), 0.0
            )

        class_logits, deltas = self.box_logits(features, rois)
        losses = fastrcnn_losses(class_logits, deltas, roi_labels, regression, samples)

        # Positives fill the first slots in a uniformly random order, so the positive quota holds
        # every sampled positive and any shorter prefix a random subset of them.
        m = min(cfg.mask_positive_quota, idx.shape[1])
        if cfg.mask_rois_per_image:
            m = min(m, cfg.mask_rois_per_image)
        return losses, MaskTrainingRoIs(rois[:, :m], roi_labels[:, :m], roi_gt[:, :m], samples.positive[:, :m])

    def mask_branch_loss(
        self,
        features: list[Tensor],
        targets: Targets,
        rois: MaskTrainingRoIs,
        canvas: tuple[int, int],
        images: Tensor | None = None,
    ) -> Tensor:
        """features: P2..P5; padded targets; the mask branch's training slots -> ``loss_mask``.

        ``rois`` are [B, n] (any prefix of :meth:`box_loss`'s that holds every positive gives the
        same value) or, with ``images`` [B', n] naming each slot's image, slots of any images
        (the batch's positives packed into one row).
        """
        cfg = self.cfg
        if rois.boxes.shape[1] == 0:  # static: a config without positives has no mask loss to learn
            return sum(f.sum() for f in features) * 0.0
        with torch.no_grad():
            cropped = masks_are_cropped(targets, cfg, canvas)
            masks, gt_boxes, gt_index = targets.masks, targets.boxes, rois.gt_index
            if images is not None:
                # Slots of any image read the batch's ground truth as one image of B * G slots.
                gt_index = images * gt_boxes.shape[1] + gt_index
                masks, gt_boxes = masks.flatten(0, 1)[None], gt_boxes.flatten(0, 1)[None]
            target = mask_targets(masks, gt_boxes.to(rois.boxes.dtype), gt_index, rois.boxes, cfg.mask_size, cropped)
        logits = mask_logits(cfg, self.mask_head, self.mask_predictor, features, rois.boxes, images)
        return mask_loss(class_mask_logits(logits, rois.labels), target, rois.positive)
