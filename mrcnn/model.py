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

from mrcnn.backbone import build_backbone
from mrcnn.config import Config, get_config
from mrcnn.losses import check_targets
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
        features = list(self.backbone(batch.tensors).values())  # P2..P6
        if training:
            proposals, losses = self.rpn(features, batch.image_sizes, canvas, targets, batch.valid)
            # RoIAlign reads P2..P5.
            losses.update(self.roi_heads.loss(features[:4], proposals, targets, canvas, batch.valid))
            return losses
        proposals, _ = self.rpn(features, batch.image_sizes, canvas)
        det = self.roi_heads(features[:4], proposals, batch.image_sizes)  # RoIAlign reads P2..P5
        # Explicit constructor: dynamo cannot trace NamedTuple._replace of a new instance.
        return Detections(det.boxes, det.scores, det.labels, det.masks, det.valid & batch.valid[:, None])

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
