"""Mask branch: fixed K RoIs per image in, [B, K, M, M] mask probabilities out.

The modules are torchvision's MaskRCNNHeads and MaskRCNNPredictor (weight-compatible names);
what changes is that the RoIs are always the K detection slots, valid or not. In training the
RoIs are a fixed number of sampled slots per image, weighted by whether they hold a positive.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor

from mrcnn.config import Config
from mrcnn.layout import conv_layout
from mrcnn.ops import multilevel_roi_align, resolve_impl


def build_mask_modules(cfg: Config) -> tuple[nn.Module, nn.Module]:
    head = MaskRCNNHeads(cfg.fpn_channels, list(cfg.mask_layers), cfg.mask_dilation)
    predictor = MaskRCNNPredictor(cfg.mask_layers[-1], cfg.mask_dim_reduced, cfg.num_classes)
    return head, predictor


def pooling_features(features: list[Tensor], impl: str) -> list[Tensor]:
    """The FPN levels as the RoIAlign kernels should read them.

    Under autocast the levels are fp16/bf16. torchvision's roi_align kernels have no bf16 backward
    on the CPU, and the kernel wrapper gives the RoIs the features' dtype, in which box coordinates
    lose whole pixels; torchvision's own roi_align autocasts to fp32 for the same reasons. So the
    torchvision impl pools from fp32 copies (fp32 inputs pass through untouched).
    """
    if impl == "torchvision" and features[0].dtype in (torch.float16, torch.bfloat16):
        return [f.float() for f in features]
    return features


def mask_logits(
    cfg: Config,
    head: nn.Module,
    predictor: nn.Module,
    features: list[Tensor],
    boxes: Tensor,
    images: Tensor | None = None,
) -> Tensor:
    """features: P2..P5 [B, C, H_l, W_l]; boxes [B', R, 4] -> logits [B', R, num_classes, M, M].

    ``images`` [B', R] names the image each RoI is pooled from (packed training slots); None pools
    row b of ``boxes`` from image b (B' = B).
    """
    b, r = boxes.shape[:2]
    impl = resolve_impl(cfg.ops_impl, boxes.device)
    pooled = multilevel_roi_align(
        pooling_features(features, impl), boxes, cfg.mask_roi_size, sampling_ratio=2, impl=impl, images=images
    )  # [B', R, C, S, S]
    logits = predictor(head(conv_layout(pooled.flatten(0, 1), cfg)))  # RoIAlign writes NCHW
    return logits.view(b, r, *logits.shape[1:])


def class_mask_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """logits [B, K, num_classes, M, M], labels [B, K] -> each RoI's own class map [B, K, M, M]."""
    index = labels[:, :, None, None, None].expand(-1, -1, 1, *logits.shape[-2:])
    return logits.gather(2, index)[:, :, 0]


def mask_probabilities(logits: Tensor, labels: Tensor) -> Tensor:
    """logits [B, K, num_classes, M, M], labels [B, K] -> sigmoid of each RoI's class map [B, K, M, M]."""
    return class_mask_logits(logits, labels).sigmoid()
