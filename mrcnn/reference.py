"""torchvision's own Mask R-CNN built to match a Config: the oracle for parity and the baseline row.

For ``coco_r50_fpn`` this is architecturally ``torchvision.models.detection.maskrcnn_resnet50_fpn``
(v1); other presets get the same torchvision classes with the preset's sizes. Its state_dict loads
strictly into :class:`mrcnn.model.MaskRCNN` built from the same config, and vice versa.
"""

from __future__ import annotations

from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.mask_rcnn import MaskRCNN as TorchvisionMaskRCNN
from torchvision.models.detection.rpn import RPNHead

from mrcnn.backbone import build_backbone
from mrcnn.config import Config, get_config
from mrcnn.mask_head import build_mask_modules


def torchvision_model(cfg: Config | str = "coco_r50_fpn") -> TorchvisionMaskRCNN:
    """A torchvision ``MaskRCNN`` with the architecture and inference settings of ``cfg``."""
    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    mask_head, mask_predictor = build_mask_modules(cfg)
    return TorchvisionMaskRCNN(
        build_backbone(cfg),
        num_classes=None,
        min_size=cfg.min_size,
        max_size=cfg.max_size,
        image_mean=list(cfg.image_mean),
        image_std=list(cfg.image_std),
        rpn_anchor_generator=AnchorGenerator(
            sizes=tuple((s,) for s in cfg.anchor_sizes),
            aspect_ratios=(tuple(cfg.aspect_ratios),) * len(cfg.anchor_sizes),
        ),
        rpn_head=RPNHead(cfg.fpn_channels, cfg.num_anchors_per_location),
        rpn_pre_nms_top_n_train=cfg.rpn_pre_nms_top_n_train,
        rpn_pre_nms_top_n_test=cfg.rpn_pre_nms_top_n_test,
        rpn_post_nms_top_n_train=cfg.rpn_post_nms_top_n_train,
        rpn_post_nms_top_n_test=cfg.rpn_post_nms_top_n_test,
        rpn_nms_thresh=cfg.rpn_nms_thresh,
        rpn_fg_iou_thresh=cfg.rpn_fg_iou_thresh,
        rpn_bg_iou_thresh=cfg.rpn_bg_iou_thresh,
        rpn_batch_size_per_image=cfg.rpn_batch_size_per_image,
        rpn_positive_fraction=cfg.rpn_positive_fraction,
        rpn_score_thresh=cfg.rpn_score_thresh,
        box_head=TwoMLPHead(cfg.fpn_channels * cfg.box_roi_size**2, cfg.representation_size),
        box_predictor=FastRCNNPredictor(cfg.representation_size, cfg.num_classes),
        box_score_thresh=cfg.box_score_thresh,
        box_nms_thresh=cfg.box_nms_thresh,
        box_detections_per_img=cfg.box_detections_per_img,
        box_fg_iou_thresh=cfg.box_fg_iou_thresh,
        box_bg_iou_thresh=cfg.box_bg_iou_thresh,
        box_batch_size_per_image=cfg.box_batch_size_per_image,
        box_positive_fraction=cfg.box_positive_fraction,
        bbox_reg_weights=cfg.bbox_reg_weights,
        mask_head=mask_head,
        mask_predictor=mask_predictor,
    )
