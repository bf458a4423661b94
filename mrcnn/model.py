"""Static-shape Mask R-CNN: the whole pipeline with shapes fixed by the config.

    ImageBatch [B, 3, H, W] -> backbone + FPN -> RPN (P proposals) -> RoI heads (K detections)
    -> mask branch (K masks) -> Detections [B, K, ...]

In training mode, ``forward(batch, targets)`` returns torchvision's five losses instead; the
proposals then go to the RoI heads' sampler rather than to detection.

``predict`` wraps inference for a list of images: transform (host) -> forward -> postprocess (host).

Where ``cfg.mask_detection_buckets`` says so (by default: eager on the CPU), ``predict`` runs in
two stages instead (:class:`mrcnn.staged.StagedDetector`): ``box_stage`` (everything up to the K
detections), a host read of the valid counts, then ``mask_stage`` on the smallest bucket of n
slots that holds them.
Training has the same split (``box_training_stage``, ``mask_training_stage``) for
``cfg.mask_train_buckets`` (:class:`mrcnn.staged.StagedTrainer`). An eval-mode ``forward`` stays
the single graph.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from mrcnn.backbone import (
    build_backbone,
    eager_crop,
    edge_extended,
    fold_norms_on,
    largest_extent,
    padded_extents,
    sizes_on_host,
)
from mrcnn.backbone import fills_canvas as batch_fills_canvas
from mrcnn.config import Canvas, Config, get_config
from mrcnn.layout import channels_last_on, contiguous_nchw, conv_layout, place_conv_weights
from mrcnn.losses import check_targets, masks_are_cropped
from mrcnn.ops import resolve_impl
from mrcnn.postprocess import postprocess
from mrcnn.roi_heads import RoIHeads
from mrcnn.rpn import RegionProposalNetwork
from mrcnn.staged import StagedDetector, packed_mask_rois, packs_mask_training, stages_masks
from mrcnn.structures import BoxDetections, Detections, ImageBatch, MaskTrainingRoIs, Targets, canvas_of
from mrcnn.transform import group_by_canvas, to_image_batch


class MaskRCNN(nn.Module):
    """Mask R-CNN whose submodule names match torchvision's, so its state_dict loads strictly."""

    def __init__(self, cfg: Config | str = "coco_r50_fpn") -> None:
        super().__init__()
        self.cfg = get_config(cfg) if isinstance(cfg, str) else cfg
        self.backbone = build_backbone(self.cfg)
        self.rpn = RegionProposalNetwork(self.cfg)
        self.roi_heads = RoIHeads(self.cfg)
        place_conv_weights(self, self.cfg)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> MaskRCNN:
        """Every move (``to``, ``cuda``, ``float``, ...) then puts the conv weights in the layout
        of the convolutions on the new device (:func:`mrcnn.layout.place_conv_weights`)."""
        module = super()._apply(fn, recurse)
        place_conv_weights(self, self.cfg)
        return module

    def forward(
        self, batch: ImageBatch, targets: Targets | None = None, fills_canvas: bool = False
    ) -> Detections | dict[str, Tensor]:
        """batch.tensors [B, 3, H, W] on a canvas bucket -> Detections with K slots per image.

        Training mode needs ``targets`` (padded, canvas coordinates; see
        :class:`~mrcnn.structures.Targets`) and returns torchvision's losses as scalars:
        ``loss_objectness``, ``loss_rpn_box_reg``, ``loss_classifier``, ``loss_box_reg``,
        ``loss_mask``. Evaluation mode ignores ``targets``, as torchvision does. Where
        ``cfg.mask_train_buckets`` says so (by default: eager on the CPU), a call trains the mask
        branch on the batch's sampled positives packed into the smallest bucket that holds them
        (same losses; one host read).

        Targets on the CPU are validated here (:func:`mrcnn.losses.check_targets`) unless the call
        is being compiled; validate on the host before moving a batch to an accelerator.

        ``fills_canvas``: the caller found on the host (:func:`mrcnn.backbone.fills_canvas`) that no
        feature of this batch needs masking, so a graph skips the masks (same outputs; a compiled
        forward then keeps one graph per canvas and value). Eager on the CPU finds that itself, and
        raises ValueError when told so of a batch that needs them.
        """
        if self.training:
            losses, pooled, rois, targets = self.box_training_stage(batch, targets, fills_canvas)
            images = None
            if packs_mask_training(self.cfg, batch.tensors.device):
                # Eager: the mask branch on the batch's positives packed into the smallest bucket
                # (one host read). A compiled forward keeps all Q slots: same loss, no graph break.
                rois, images = packed_mask_rois(rois, self.cfg.mask_train_slots)
            losses["loss_mask"] = self.mask_training_stage(pooled, targets, rois, canvas_of(batch), images)
            return losses
        features, pooled, extents = self.features(batch, fills_canvas)
        proposals, _ = self.rpn(features, batch.image_sizes, canvas_of(batch), extents=extents)
        det = self.roi_heads(pooled, proposals, batch.image_sizes)
        # Explicit constructor: dynamo cannot trace NamedTuple._replace of a new instance.
        return Detections(det.boxes, det.scores, det.labels, det.masks, det.valid & batch.valid[:, None])

    def box_training_stage(
        self, batch: ImageBatch, targets: Targets | None, fills_canvas: bool = False
    ) -> tuple[dict[str, Tensor], list[Tensor], MaskTrainingRoIs, Targets]:
        """Training up to the mask branch: one fixed-shape function per canvas.

        Returns the RPN's and box branch's losses (``loss_objectness``, ``loss_rpn_box_reg``,
        ``loss_classifier``, ``loss_box_reg``), the pooled P2..P5 features, the mask branch's Q
        training slots (positives first) and the targets as the mask loss reads them; the mask
        loss is :meth:`mask_training_stage` on any prefix of the slots that holds the positives, or
        on the positives packed into one row. ``fills_canvas``: as in :meth:`forward`.
        """
        if not self.training:
            raise RuntimeError("box_training_stage is training only (call model.train())")
        if targets is None:
            raise ValueError("targets are required in training mode (call model.eval() for inference)")
        canvas = canvas_of(batch)
        if not torch.compiler.is_compiling():
            check_targets(targets, self.cfg, batch)
        if self.cfg.mask_padding and not masks_are_cropped(targets, self.cfg, canvas):
            # torchvision samples each image's own-size ground-truth mask, clamped at its edge.
            masks = edge_extended(targets.masks, batch.image_sizes, canvas)
            targets = Targets(targets.boxes, targets.labels, masks, targets.valid)
        features, pooled, extents = self.features(batch, fills_canvas)
        proposals, losses = self.rpn(features, batch.image_sizes, canvas, targets, batch.valid, extents)
        box_losses, rois = self.roi_heads.box_loss(pooled, proposals, targets, batch.valid)
        losses.update(box_losses)
        return losses, pooled, rois, targets

    def mask_training_stage(
        self,
        pooled: list[Tensor],
        targets: Targets,
        rois: MaskTrainingRoIs,
        canvas: Canvas,
        images: Tensor | None = None,
    ) -> Tensor:
        """``loss_mask`` on the training slots ``rois``, [B, n] (a prefix of :meth:`box_training_stage`'s
        that holds every positive) or, with ``images`` [1, n], the batch's positives packed into one
        row (:func:`mrcnn.staged.pack_positives`). One fixed-shape function per (canvas, n)."""
        return self.roi_heads.mask_branch_loss(pooled, targets, rois, canvas, images)

    def features(
        self, batch: ImageBatch, fills_canvas: bool = False
    ) -> tuple[list[Tensor], list[Tensor], Tensor | None]:
        """-> (P2..P6 for the RPN, P2..P5 for RoIAlign, extents [B, 2] or None).

        With ``cfg.mask_padding`` every image sees the canvas as torchvision sees its own padding
        (the image's size rounded up to ``size_divisible``; in training, the batch's largest):
        features are zeroed outside that extent before each kernel wider than 1, and RoIAlign reads
        the edge as torchvision's clamps it. Graphs run on the whole canvas, masked. Eager on the
        CPU runs the backbone on the batch's largest extent instead
        (:func:`mrcnn.backbone.eager_crop`), masked only where the extents differ; every level is
        then that crop's (the RPN head pads its outputs to the canvas, RoIAlign needs no canvas).
        ``fills_canvas`` (as in :meth:`forward`): graphs skip the masks too.
        """
        canvas = canvas_of(batch)
        extents = masked = None
        crop = canvas
        if self.cfg.mask_padding:
            extents = padded_extents(batch.image_sizes, self.cfg.size_divisible)
            if self.training:
                # torchvision trains on batches padded to the largest image's extent, so each image's
                # losses depend on that; inference matches torchvision running each image alone.
                extents = largest_extent(extents, batch.valid).expand_as(extents)
            # Eager on the CPU runs the backbone on the batch's largest extent only, without masks
            # where that is every image's: torchvision's work, not the canvas's.
            crop, masked = eager_crop(extents, canvas)
            if fills_canvas:
                if sizes_on_host(extents) and (masked is not None or crop != canvas):
                    raise ValueError(
                        f"fills_canvas=True, but the batch's padded extents {extents.tolist()} do not all "
                        f"fill its canvas {canvas}: pass mrcnn.backbone.fills_canvas(batch, ...)"
                    )
                masked = None
        images = batch.tensors if crop == canvas else batch.tensors[..., : crop[0], : crop[1]]
        fold = fold_norms_on(self.cfg, images.device)
        features = list(self.backbone(conv_layout(images, self.cfg), masked, fold).values())  # P2..P6
        # RoIAlign clamps its samples at the map's last row and column: at the crop's edge that is
        # torchvision's clamp for the largest extent; smaller extents get their edge copied past them.
        pooled = features[:4] if masked is None else [edge_extended(f, masked, crop) for f in features[:4]]
        return features, self._pooling_layout(pooled), extents

    def _pooling_layout(self, levels: list[Tensor]) -> list[Tensor]:
        """P2..P5 in the layout RoIAlign reads. torchvision's roi_align kernels make their input
        contiguous (NCHW) at every call, box and mask branch alike, and on the CPU that copy of a
        channels_last map is a slow strided one; so when the convolutions run in channels_last the
        levels are made NCHW once here, by :func:`contiguous_nchw`. The gather form (``tensor`` impl)
        reads NHWC rows as they are.

        Compiled for inference on the CPU, the compiler lays its convolutions' outputs out
        channels_last whatever the input's layout, and hands the RoIAlign op the maps as it laid
        them out, so the box and the mask branch each copied every level to NCHW again. A clone
        to the contiguous format here has the compiler write each level NCHW once, for both."""
        device = levels[0].device
        if resolve_impl(self.cfg.ops_impl, device) != "torchvision":
            return levels
        if torch.compiler.is_compiling():
            if self.training or device.type != "cpu":
                return levels  # not measured there
            return [f.clone(memory_format=torch.contiguous_format) for f in levels]
        if not channels_last_on(self.cfg, device):
            return levels
        return [contiguous_nchw(f) for f in levels]

    def box_stage(self, batch: ImageBatch, fills_canvas: bool = False) -> tuple[BoxDetections, list[Tensor]]:
        """Inference up to the detections, without masks: one fixed-shape function per canvas.

        Returns the K detections per image (valid ones first, best first; none valid on padding
        images of the batch) and the pooled P2..P5 features that :meth:`mask_stage` reads.
        ``fills_canvas``: as in :meth:`forward`.
        """
        if self.training:
            raise RuntimeError("box_stage is inference only (call model.eval())")
        canvas = canvas_of(batch)
        features, pooled, extents = self.features(batch, fills_canvas)
        proposals, _ = self.rpn(features, batch.image_sizes, canvas, extents=extents)
        det = self.roi_heads.detect_boxes(pooled, proposals, batch.image_sizes)
        return BoxDetections(det.boxes, det.scores, det.labels, det.valid & batch.valid[:, None]), pooled

    def mask_stage(self, pooled: list[Tensor], det: BoxDetections, images: Tensor | None = None) -> Tensor:
        """The mask branch on the n slots of ``det``: [B, n] (a prefix of :meth:`box_stage`'s K) or,
        with ``images`` [1, n] naming each slot's image, the batch's detections packed into one row
        (:func:`mrcnn.staged.pack_slots`) -> masks [B or 1, n, M, M], zero on slots that are not
        valid. One fixed-shape function per (canvas, n)."""
        return self.roi_heads.masks(pooled, det, images)

    @torch.no_grad()
    def predict(self, images: list[Tensor], batch_size: int | None = None) -> list[dict[str, Tensor]]:
        """torchvision-style inference: list of [3, h, w] images -> list of dicts in image coordinates.

        Images are grouped by canvas bucket (one forward per bucket, so a portrait and a landscape
        image each get their tight canvas); ``batch_size`` pads each group's batch to that size.
        Where ``cfg.mask_detection_buckets`` stages the mask branch on this device
        (:func:`mrcnn.staged.stages_masks`: by default, eager on the CPU) each batch goes through
        :class:`StagedDetector` instead of ``forward`` (same outputs, the mask branch on fewer slots).
        """
        device = next(self.parameters()).device
        # A model compiled in place (nn.Module.compile) runs its compiled forward: "auto" keeps it.
        compiled = getattr(self, "_compiled_call_impl", None) is not None
        detect = StagedDetector(self) if stages_masks(self.cfg, device, compiled) else self
        groups = group_by_canvas(images, self.cfg)
        results: list[dict[str, Tensor]] = [{} for _ in images]
        for indices in groups.values():
            # Resize on the host: on XLA, resizing each original size on the device would compile anew.
            batch = to_image_batch([images[i].cpu() for i in indices], self.cfg, batch_size)
            # Compiled, the single graph skips the padding masks where the host finds none needed.
            told = detect is self and compiled and batch_fills_canvas(batch, self.cfg.size_divisible)
            batch = ImageBatch(*(t.to(device) for t in batch))
            out = self(batch, fills_canvas=True) if told else detect(batch)
            for i, result in zip(indices, postprocess(out, batch)):
                results[i] = result
        return results
