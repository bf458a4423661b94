"""Static-shape Mask R-CNN: the whole pipeline with shapes fixed by the config.

    ImageBatch [B, 3, H, W] -> backbone + FPN -> RPN (P proposals) -> RoI heads (K detections)
    -> mask branch (K masks) -> Detections [B, K, ...]

In training mode, ``forward(batch, targets)`` returns torchvision's five losses instead; the
proposals then go to the RoI heads' sampler rather than to detection.

``predict`` wraps inference for a list of images: transform (host) -> forward -> postprocess (host).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mrcnn.backbone import build_backbone, edge_extended, padded_extents
from mrcnn.config import Config, get_config
from mrcnn.losses import check_targets, masks_are_cropped
from mrcnn.postprocess import postprocess
from mrcnn.roi_heads import RoIHeads
from mrcnn.rpn import RegionProposalNetwork
from mrcnn.structures import Detections, ImageBatch, Targets
from mrcnn.transform import group_by_canvas, to_image_batch


class MaskRCNN(nn.Module):
    """Mask R-CNN whose submodule names match torchvision's, so its state_dict loads strictly."""

    def __init__(self, cfg: Config | str = "coco_r50_fpn") -> None:
        super().__init__()
        self.cfg = get_config(cfg) if isinstance(cfg, str) else cfg
        self.backbone = build_backbone(self.cfg)
        self.rpn = RegionProposalNetwork(self.cfg)
        self.roi_heads = RoIHeads(self.cfg)

    def forward(self, batch: ImageBatch, targets: Targets | None = None) -> Detections | dict[str, Tensor]:
        """batch.tensors [B, 3, H, W] on a canvas bucket -> Detections with K slots per image.

        Training mode needs ``targets`` (padded, canvas coordinates; see
        :class:`~mrcnn.structures.Targets`) and returns torchvision's losses as scalars:
        ``loss_objectness``, ``loss_rpn_box_reg``, ``loss_classifier``, ``loss_box_reg``,
        ``loss_mask``. Evaluation mode ignores ``targets``, as torchvision does.

        Targets on the CPU are validated here (:func:`mrcnn.losses.check_targets`) unless the call
        is being compiled; validate on the host before moving a batch to an accelerator.
        """
        canvas = (batch.tensors.shape[-2], batch.tensors.shape[-1])
        training = self.training
        if training:
            if targets is None:
                raise ValueError("targets are required in training mode (call model.eval() for inference)")
            if not torch.compiler.is_compiling():
                check_targets(targets, self.cfg, batch)
            if self.cfg.mask_padding and not masks_are_cropped(targets, self.cfg, canvas):
                # torchvision samples each image's own-size ground-truth mask, clamped at its edge.
                masks = edge_extended(targets.masks, batch.image_sizes, canvas)
                targets = Targets(targets.boxes, targets.labels, masks, targets.valid)
        features, pooled, extents = self.features(batch)
        if training:
            proposals, losses = self.rpn(features, batch.image_sizes, canvas, targets, batch.valid, extents)
            losses.update(self.roi_heads.loss(pooled, proposals, targets, canvas, batch.valid))
            return losses
        proposals, _ = self.rpn(features, batch.image_sizes, canvas, extents=extents)
        det = self.roi_heads(pooled, proposals, batch.image_sizes)
        # Explicit constructor: dynamo cannot trace NamedTuple._replace of a new instance.
        return Detections(det.boxes, det.scores, det.labels, det.masks, det.valid & batch.valid[:, None])

    def features(self, batch: ImageBatch) -> tuple[list[Tensor], list[Tensor], Tensor | None]:
        """-> (P2..P6 for the RPN, P2..P5 for RoIAlign, extents [B, 2] or None).

        With ``cfg.mask_padding`` every image sees the canvas as torchvision sees its own padding
        (the image's size rounded up to ``size_divisible``; in training, the batch's largest):
        features are zeroed outside that extent before each kernel wider than 1, and RoIAlign reads
        the edge as torchvision's clamps it.
        """
        if not self.cfg.mask_padding:
            features = list(self.backbone(batch.tensors).values())
            return features, features[:4], None
        canvas = (batch.tensors.shape[-2], batch.tensors.shape[-1])
        extents = padded_extents(batch.image_sizes, self.cfg.size_divisible)
        if self.training:
            # torchvision trains on batches padded to the largest image's extent, so each image's
            # losses depend on that; inference matches torchvision running each image alone.
            largest = torch.where(batch.valid[:, None], extents, 0).amax(0, keepdim=True)
            extents = largest.expand_as(extents)
        features = list(self.backbone(batch.tensors, extents).values())  # P2..P6
        return features, [edge_extended(f, extents, canvas) for f in features[:4]], extents

    @torch.no_grad()
    def predict(self, images: list[Tensor], batch_size: int | None = None) -> list[dict[str, Tensor]]:
        """torchvision-style inference: list of [3, h, w] images -> list of dicts in image coordinates.

        Images are grouped by canvas bucket (one forward per bucket, so a portrait and a landscape
        image each get their tight canvas); ``batch_size`` pads each group's batch to that size.
        """
        device = next(self.parameters()).device
        groups = group_by_canvas(images, self.cfg)
        results: list[dict[str, Tensor]] = [{} for _ in images]
        for indices in groups.values():
            # Resize on the host: on XLA, resizing each original size on the device would compile anew.
            batch = to_image_batch([images[i].cpu() for i in indices], self.cfg, batch_size)
            batch = ImageBatch(*(t.to(device) for t in batch))
            for i, result in zip(indices, postprocess(self(batch), batch)):
                results[i] = result
        return results
