"""Static-shape Mask R-CNN: the whole pipeline with shapes fixed by the config.

    ImageBatch [B, 3, H, W] -> backbone + FPN -> RPN (P proposals) -> RoI heads (K detections)
    -> mask branch (K masks) -> Detections [B, K, ...]

In training mode, ``forward(batch, targets)`` returns torchvision's five losses instead; the
proposals then go to the RoI heads' sampler rather than to detection.

``predict`` wraps inference for a list of images: transform (host) -> forward -> postprocess (host).

With ``cfg.mask_detection_buckets``, inference runs in two stages instead (:class:`StagedDetector`):
``box_stage`` (everything up to the K detections), a host read of the valid counts, then
``mask_stage`` on the smallest bucket of n slots that holds them. ``forward`` stays the single graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mrcnn.backbone import build_backbone, edge_extended, padded_extents
from mrcnn.config import Canvas, Config, get_config
from mrcnn.layout import contiguous_nchw, conv_layout
from mrcnn.losses import check_targets, masks_are_cropped
from mrcnn.ops import resolve_impl
from mrcnn.postprocess import postprocess
from mrcnn.roi_heads import RoIHeads
from mrcnn.rpn import RegionProposalNetwork
from mrcnn.structures import BoxDetections, Detections, ImageBatch, Targets
from mrcnn.transform import group_by_canvas, to_image_batch


class MaskRCNN(nn.Module):
    """Mask R-CNN whose submodule names match torchvision's, so its state_dict loads strictly."""

    def __init__(self, cfg: Config | str = "coco_r50_fpn") -> None:
        super().__init__()
        self.cfg = get_config(cfg) if isinstance(cfg, str) else cfg
        self.backbone = build_backbone(self.cfg)
        self.rpn = RegionProposalNetwork(self.cfg)
        self.roi_heads = RoIHeads(self.cfg)
        if self.cfg.channels_last:
            # Conv weights in NHWC: 4-D parameters only, names and shapes unchanged, and
            # load_state_dict copies a checkpoint into this layout.
            self.to(memory_format=torch.channels_last)

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
        images = conv_layout(batch.tensors, self.cfg)
        if not self.cfg.mask_padding:
            features = list(self.backbone(images).values())
            return features, self._pooling_layout(features[:4]), None
        canvas = (batch.tensors.shape[-2], batch.tensors.shape[-1])
        extents = padded_extents(batch.image_sizes, self.cfg.size_divisible)
        if self.training:
            # torchvision trains on batches padded to the largest image's extent, so each image's
            # losses depend on that; inference matches torchvision running each image alone.
            largest = torch.where(batch.valid[:, None], extents, 0).amax(0, keepdim=True)
            extents = largest.expand_as(extents)
        features = list(self.backbone(images, extents).values())  # P2..P6
        pooled = [edge_extended(f, extents, canvas) for f in features[:4]]
        return features, self._pooling_layout(pooled), extents

    def _pooling_layout(self, levels: list[Tensor]) -> list[Tensor]:
        """P2..P5 in the layout RoIAlign reads. torchvision's roi_align kernels make their input
        contiguous (NCHW) at every call, box and mask branch alike, and on the CPU that copy of a
        channels_last map is a slow strided one; so with ``cfg.channels_last`` the levels are made
        NCHW once here, by :func:`contiguous_nchw`. The gather form (``tensor`` impl) reads NHWC rows
        as they are."""
        if not self.cfg.channels_last or resolve_impl(self.cfg.ops_impl, levels[0].device) != "torchvision":
            return levels
        return [contiguous_nchw(f) for f in levels]

    def box_stage(self, batch: ImageBatch) -> tuple[BoxDetections, list[Tensor]]:
        """Inference up to the detections, without masks: one fixed-shape function per canvas.

        Returns the K detections per image (valid ones first, best first; none valid on padding
        images of the batch) and the pooled P2..P5 features that :meth:`mask_stage` reads.
        """
        if self.training:
            raise RuntimeError("box_stage is inference only (call model.eval())")
        canvas = (batch.tensors.shape[-2], batch.tensors.shape[-1])
        features, pooled, extents = self.features(batch)
        proposals, _ = self.rpn(features, batch.image_sizes, canvas, extents=extents)
        det = self.roi_heads.detect_boxes(pooled, proposals, batch.image_sizes)
        return BoxDetections(det.boxes, det.scores, det.labels, det.valid & batch.valid[:, None]), pooled

    def mask_stage(self, pooled: list[Tensor], det: BoxDetections) -> Tensor:
        """The mask branch on the n slots of ``det`` (a prefix of :meth:`box_stage`'s K): -> masks
        [B, n, M, M], zero on slots that are not valid. One fixed-shape function per (canvas, n)."""
        return self.roi_heads.masks(pooled, det)

    @torch.no_grad()
    def predict(self, images: list[Tensor], batch_size: int | None = None) -> list[dict[str, Tensor]]:
        """torchvision-style inference: list of [3, h, w] images -> list of dicts in image coordinates.

        Images are grouped by canvas bucket (one forward per bucket, so a portrait and a landscape
        image each get their tight canvas); ``batch_size`` pads each group's batch to that size.
        With ``cfg.mask_detection_buckets`` each batch goes through :class:`StagedDetector` instead
        of ``forward`` (same outputs, the mask branch on fewer slots).
        """
        detect = StagedDetector(self) if self.cfg.mask_detection_buckets else self
        device = next(self.parameters()).device
        groups = group_by_canvas(images, self.cfg)
        results: list[dict[str, Tensor]] = [{} for _ in images]
        for indices in groups.values():
            # Resize on the host: on XLA, resizing each original size on the device would compile anew.
            batch = to_image_batch([images[i].cpu() for i in indices], self.cfg, batch_size)
            batch = ImageBatch(*(t.to(device) for t in batch))
            for i, result in zip(indices, postprocess(detect(batch), batch)):
                results[i] = result
        return results


def mask_bucket(buckets: Sequence[int], count: int) -> int:
    """The smallest of ``buckets`` (increasing) that holds ``count`` detections."""
    for n in buckets:
        if n >= count:
            return n
    raise ValueError(f"{count} detections exceed the largest mask bucket ({buckets[-1]})")


class StagedDetector:
    """ImageBatch -> Detections in two stages, the mask branch on a detection-count bucket.

    Runs ``model.box_stage``, reads the largest valid count of the batch on the host (the one
    sync), and runs ``model.mask_stage`` on the first n slots, n the smallest of
    ``cfg.mask_buckets`` that holds it; the masks are padded back to K slots with zeros, so the
    result has ``forward``'s shapes and equals it on every image of the batch that is not padding
    (masks up to float rounding: the heads see fewer RoIs per call).

    ``wrap`` wraps each stage (any function -> function); :meth:`compiled` is the
    ``torch.compile`` form, with one static graph per canvas for the box stage and one per
    (canvas, n) used for the mask stage. :meth:`warmup` builds them all ahead; ``warm_ahead``
    builds every bucket of a canvas at its first batch instead, so that which graphs exist never
    depends on how many objects the images hold. ``used`` counts the batches run on each
    (canvas, n) so far.
    """

    def __init__(self, model: MaskRCNN, wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
                 warm_ahead: bool = False):
        self.model = model
        self.buckets = model.cfg.mask_buckets
        wrap = wrap or (lambda fn: fn)
        self.box_stage = wrap(model.box_stage)
        self.mask_stage = wrap(model.mask_stage)
        self.used: dict[tuple[Canvas, int], int] = {}
        self.warm_ahead = warm_ahead
        self._warm: set[Canvas] = set()

    @classmethod
    def compiled(cls, model: MaskRCNN, warm_ahead: bool = False, **options: Any) -> StagedDetector:
        """Both stages under ``torch.compile(fullgraph=True, dynamic=False, **options)``.

        ``dynamic=False`` keeps every bucket a static graph (dynamo's automatic dynamic shapes
        would make the slot count symbolic at the second bucket). The mask stage is one function
        compiled up to canvases x buckets times, more than dynamo's default recompile limit (8),
        so the calls raise that limit to the number of graphs the config can need.
        """
        # Imported here: dynamo's config, needed only by compiled stages, costs a second at import.
        import torch._dynamo

        options = {"fullgraph": True, "dynamic": False, **options}
        graphs = len(model.cfg.canvases) * len(model.cfg.mask_buckets)

        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            compiled = torch.compile(fn, **options)

            def call(*args: Any) -> Any:
                limit = max(graphs, torch._dynamo.config.recompile_limit)
                with torch._dynamo.config.patch(recompile_limit=limit):
                    return compiled(*args)

            return call

        return cls(model, wrap, warm_ahead)

    def __call__(self, batch: ImageBatch) -> Detections:
        det, pooled = self.box_stage(batch)
        canvas = (int(batch.tensors.shape[-2]), int(batch.tensors.shape[-1]))
        if self.warm_ahead and canvas not in self._warm:
            for n in self.buckets:
                self._masks(pooled, det, n)
            self._warm.add(canvas)
        n = self.bucket(det.valid)
        masks = self._masks(pooled, det, n)
        self.used[canvas, n] = self.used.get((canvas, n), 0) + 1
        return Detections(det.boxes, det.scores, det.labels, masks, det.valid)

    def bucket(self, valid: Tensor) -> int:
        """valid [B, K] -> the bucket for the batch (reads the counts on the host)."""
        if not valid.numel():
            return self.buckets[0]
        count = valid.sum(1).max()
        if count.device.type == "xla":
            # Imported here: only XLA tensors need it, and the library runs without torch_xla.
            import torch_xla

            # Run the box stage as one graph with the count, its outputs kept on the device;
            # reading the count alone would leave them to be computed again with the mask stage.
            torch_xla.sync()
        # A copy to the host rather than int() on the device tensor: on XLA, .item() runs as a CPU
        # fallback op (aten::_local_scalar_dense); the copy is a plain transfer.
        return mask_bucket(self.buckets, int(count.cpu()))

    def _masks(self, pooled: list[Tensor], det: BoxDetections, n: int) -> Tensor:
        k = det.valid.shape[1]
        masks = self.mask_stage(pooled, BoxDetections(*(t[:, :n] for t in det)))
        return F.pad(masks, (0, 0, 0, 0, 0, k - n)) if n < k else masks

    @torch.no_grad()
    def warmup(self, canvases: Sequence[Canvas] | None = None, batch_size: int = 1) -> None:
        """Run every (canvas, bucket) once on blank images (all of ``cfg.canvases`` by default), so
        that compiled stages are built before the first real batch. Call it under the autocast the
        real calls use, if any."""
        cfg = self.model.cfg
        device = next(self.model.parameters()).device
        for h, w in canvases or cfg.canvases:
            sizes = torch.tensor([[h, w]] * batch_size, device=device)
            blank = ImageBatch(
                torch.zeros(batch_size, 3, h, w, device=device),
                sizes,
                sizes,
                torch.ones(batch_size, dtype=torch.bool, device=device),
            )
            det, pooled = self.box_stage(blank)
            for n in self.buckets:
                self._masks(pooled, det, n)
