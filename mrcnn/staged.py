"""Two-stage forms of the model, with the mask branch on a bucket of slots chosen on the host.

The single graph (``MaskRCNN.forward``) runs the mask branch on a fixed number of slots whatever the
batch holds: K detections at inference, the Q-slot positive quota in training. Here the first stage
ends where the mask branch starts, one host read takes the batch's count (its valid detections at
inference, its sampled positives in training), and the second stage runs on the smallest bucket of
slots that holds them. For one image, valid detections fill the first slots, so a prefix holds
them; a batch packs every image's slots into one row, whichever image they come from, and each
RoI is pooled from its own image. The outputs equal the single graph's: masks are put back in
their slots, and the mask loss, a mean over the positives, is the same on any slots that hold them.
Each stage is a fixed-shape function: one graph per canvas for the first, one per (canvas, bucket)
for the second when they are compiled.

:class:`StagedDetector` is inference (``cfg.mask_detection_buckets``, where :func:`stages_masks`
says so), :class:`StagedTrainer` the training forward (``cfg.mask_train_buckets``; the eager
``forward`` packs the mask branch's slots itself where :func:`packs_mask_training` says so).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Self, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mrcnn.backbone import fills_canvas
from mrcnn.config import Canvas, Config
from mrcnn.structures import BoxDetections, Detections, ImageBatch, MaskTrainingRoIs, Targets, canvas_of

Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]
SlotTuple = TypeVar("SlotTuple", BoxDetections, MaskTrainingRoIs)

# The device types where ``mask_detection_buckets="auto"`` stages ``predict`` and
# ``mask_train_buckets="auto"`` packs the eager training forward's mask slots: where the mask branch
# on a bucket was measured faster than on all slots in eager (the CPU: docs/model.md,
# docs/training.md). XLA keeps the single graph (the host read would split each call into two
# device programs); CUDA is left on it until measured there.
AUTO_STAGED = frozenset({"cpu"})


def stages_masks(cfg: Config, device: torch.device, compiled: bool = False) -> bool:
    """Whether inference on ``device`` runs the mask branch on a bucket (:class:`StagedDetector`):
    set buckets always; "auto" on :data:`AUTO_STAGED` in eager only. ``compiled``: the caller runs
    the model compiled (``nn.Module.compile``, a compiled row), which "auto" keeps whole, since the
    stages are other functions than the compiled ``forward``."""
    if cfg.mask_detection_buckets == "auto":
        return device.type in AUTO_STAGED and not compiled and not torch.compiler.is_compiling()
    return bool(cfg.mask_detection_buckets)


def packs_mask_training(cfg: Config, device: torch.device) -> bool:
    """Whether the eager training forward on ``device`` trains the mask branch on the batch's
    positives packed into a bucket (:func:`packed_mask_rois`): set buckets always; "auto" on
    :data:`AUTO_STAGED` only, and not with ``mask_rois_per_image`` (which subsamples the slots
    instead). Never while compiling: a graph keeps all Q slots, with no host read inside it."""
    if torch.compiler.is_compiling():
        return False
    if cfg.mask_train_buckets == "auto":
        return device.type in AUTO_STAGED and not cfg.mask_rois_per_image
    return bool(cfg.mask_train_buckets)


def mask_bucket(buckets: Sequence[int], count: int) -> int:
    """The smallest of ``buckets`` (increasing) that holds ``count`` slots."""
    for n in buckets:
        if n >= count:
            return n
    raise ValueError(f"{count} slots exceed the largest mask bucket ({buckets[-1]})")


def host_int(count: Tensor) -> int:
    """A scalar count on the device -> int: the one host read of a staged call.

    On XLA the pending graph runs first, with the count among its outputs, so that the first
    stage's outputs stay on the device.
    """
    if count.device.type == "xla":
        # Imported here: only XLA tensors need it, and the library runs without torch_xla.
        import torch_xla

        # Reading the count alone would leave the first stage to be computed again with the second.
        torch_xla.sync()
    # A copy to the host rather than int() on the device tensor: on XLA, .item() runs as a CPU
    # fallback op (aten::_local_scalar_dense); the copy is a plain transfer.
    return int(count.cpu())


def first_slots(slots: Any, n: int) -> Any:
    """The first n slots of every [B, K, ...] tensor of a slot NamedTuple (BoxDetections, MaskTrainingRoIs)."""
    return type(slots)(*(t[:, :n] for t in slots))


def packed_size(slots: Sequence[int], keep: Tensor) -> int:
    """keep [B, m] -> n = B * s, the packed slots the batch's mask branch runs on: s the smallest of
    ``slots`` (per image, increasing) that holds the batch's kept slots shared evenly,
    ceil(total / B), capped at m. Reads the total on the host. For one image, s holds its count."""
    b, m = keep.shape
    total = host_int(keep.sum()) if keep.numel() else 0
    return b * min(mask_bucket(slots, -(-total // max(b, 1))), m)


def pack_slots(slots: SlotTuple, keep: Tensor, n: int) -> tuple[SlotTuple, Tensor, Tensor]:
    """[B, m] slots, keep [B, m] bool -> ([1, n] slots, images [1, n], order [n]): every image's
    kept slots in turn, then others to fill n; the image each packed slot belongs to, and its flat
    index b * m + j in the batch.

    A stable sort on "not kept" keeps the image order and, within an image, the slots' own.
    """
    order = torch.argsort((~keep).flatten().to(torch.uint8), stable=True)[:n]
    packed = type(slots)(*(t.flatten(0, 1).index_select(0, order)[None] for t in slots))
    return packed, torch.div(order, keep.shape[1], rounding_mode="floor")[None], order


def pack_positives(rois: MaskTrainingRoIs, n: int) -> tuple[MaskTrainingRoIs, Tensor]:
    """[B, m] training slots -> ([1, n] slots, images [1, n]): every image's positives in turn,
    then non-positive slots to fill n (out of the loss), and the image each slot belongs to.

    The mask loss is a mean over the positives, so it is the same on any packing that holds them
    all; packing lets one image's many positives use the slots another image's few leave free.
    """
    packed, images, _ = pack_slots(rois, rois.positive, n)
    return packed, images


def packed_mask_rois(rois: MaskTrainingRoIs, slots: Sequence[int]) -> tuple[MaskTrainingRoIs, Tensor]:
    """The mask branch's training slots packed into the smallest bucket that holds every positive
    (:func:`packed_size`, :func:`pack_positives`)."""
    return pack_positives(rois, packed_size(slots, rois.positive))


def compile_stages(cfg: Config, buckets: Sequence[int], **options: Any) -> Wrap:
    """A wrap that puts a stage under ``torch.compile(fullgraph=True, dynamic=False, **options)``.

    ``dynamic=False`` keeps every bucket a static graph (dynamo's automatic dynamic shapes would
    make the slot count symbolic at the second bucket). The second stage is one function compiled
    up to canvases x buckets times, the first up to canvases x 2 (with and without the padding
    masks: ``fills_canvas``); that can be more than dynamo's default recompile limit (8), so the
    calls raise that limit to the number of graphs the config can need.
    """
    # Imported here: dynamo's config, needed only by compiled stages, costs a second at import.
    import torch._dynamo

    options = {"fullgraph": True, "dynamic": False, **options}
    graphs = len(cfg.canvases) * max(len(buckets), 2)

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        compiled = torch.compile(fn, **options)

        def call(*args: Any) -> Any:
            limit = max(graphs, torch._dynamo.config.recompile_limit)
            with torch._dynamo.config.patch(recompile_limit=limit):
                return compiled(*args)

        return call

    return wrap


def _identity(fn: Callable[..., Any]) -> Callable[..., Any]:
    return fn


class _Staged:
    """Two wrapped stages of a model and the bookkeeping of the buckets they ran on.

    Subclasses name the model's two stage methods (``stages``) and the config's bucket sizes
    (``buckets_field``, a Config property ending with the largest). Wrapped (compiled) stages are
    told whether the batch fills its canvas (:func:`mrcnn.backbone.fills_canvas`, a host read), so
    that the first stage's graph skips the padding masks where no image needs them; eager finds
    that itself.
    """

    stages: tuple[str, str]
    buckets_field: str

    def __init__(self, model: nn.Module, wrap: Wrap | None = None, warm_ahead: bool = False):
        # model: a mrcnn.model.MaskRCNN (not imported: the model imports this module).
        self.model = model
        self.buckets: tuple[int, ...] = getattr(model.cfg, self.buckets_field)
        self.tells_fills = wrap is not None
        wrap = wrap or _identity
        self.first_stage, self.second_stage = (wrap(getattr(model, name)) for name in self.stages)
        self.used: dict[tuple[Canvas, int], int] = {}  # batches run on each (canvas, bucket)
        self.warm_ahead = warm_ahead
        self._warm: set[Canvas] = set()

    @classmethod
    def compiled(cls, model: nn.Module, warm_ahead: bool = False, **options: Any) -> Self:
        """Both stages compiled (:func:`compile_stages`)."""
        return cls(model, compile_stages(model.cfg, getattr(model.cfg, cls.buckets_field), **options), warm_ahead)

    def _fills(self, batch: ImageBatch) -> bool:
        """The first stage's ``fills_canvas`` for ``batch``, passed by position: a wrap need only
        forward ``*args``."""
        return self.tells_fills and fills_canvas(batch, self.model.cfg.size_divisible, self.model.training)

    def _count(self, canvas: Canvas, n: int) -> None:
        self.used[canvas, n] = self.used.get((canvas, n), 0) + 1


class StagedDetector(_Staged):
    """ImageBatch -> Detections in two stages, the mask branch on a detection-count bucket.

    Runs ``model.box_stage``, reads the batch's number of valid detections on the host (the one
    sync), and runs ``model.mask_stage`` on n slots (:meth:`bucket`): for one image its first n,
    n the smallest of ``cfg.mask_buckets`` that holds its count (in eager with "auto" buckets, every
    size from 1 to K is a bucket: n is the count); for a batch of B, its valid
    detections packed into one row of n = B * s, s the smallest bucket that holds them shared
    evenly over the B images. The masks are put back in their K slots, zeros elsewhere, so the
    result has ``forward``'s shapes and equals it on every image of the batch that is not padding
    (masks up to float rounding: the heads see other RoIs beside them).

    ``wrap`` wraps each stage (any function -> function); :meth:`compiled` is the
    ``torch.compile`` form, with one static graph per canvas for the box stage and one per
    (canvas, n) used for the mask stage. :meth:`warmup` builds them all ahead; ``warm_ahead``
    builds every bucket of a canvas at its first batch instead, so that which graphs exist never
    depends on how many objects the images hold. ``used`` counts the batches run on each
    (canvas, n) so far.
    """

    stages = ("box_stage", "mask_stage")
    buckets_field = "mask_buckets"

    def __init__(self, model: nn.Module, wrap: Wrap | None = None, warm_ahead: bool = False):
        super().__init__(model, wrap, warm_ahead)
        if wrap is None and model.cfg.mask_detection_buckets == "auto":
            # Eager builds no graph per bucket, so "auto" gives it every size: the mask branch runs
            # on the slots the detections fill (for one image, torchvision's work).
            self.buckets = tuple(range(1, model.cfg.box_detections_per_img + 1))

    def __call__(self, batch: ImageBatch) -> Detections:
        det, pooled = self.first_stage(batch, self._fills(batch))
        canvas = canvas_of(batch)
        if self.warm_ahead and canvas not in self._warm:
            for n in self.widths(det.valid.shape[0]):
                self._masks(pooled, det, n)
            self._warm.add(canvas)
        n = self.bucket(det.valid)
        masks = self._masks(pooled, det, n)
        self._count(canvas, n)
        return Detections(det.boxes, det.scores, det.labels, masks, det.valid)

    def bucket(self, valid: Tensor) -> int:
        """valid [B, K] -> n, the mask stage's slots for the batch (reads the count on the host)."""
        return packed_size(self.buckets, valid)

    def widths(self, batch_size: int) -> tuple[int, ...]:
        """Every n the mask stage can run on for batches of ``batch_size`` images."""
        return tuple(batch_size * s for s in self.buckets)

    def _masks(self, pooled: list[Tensor], det: BoxDetections, n: int) -> Tensor:
        """The masks of ``det``'s valid slots, run on n slots -> [B, K, M, M]."""
        b, k = det.valid.shape
        if b == 1:  # valid detections fill the first slots: a prefix holds them, nothing to move
            masks = self.second_stage(pooled, first_slots(det, n))
            return F.pad(masks, (0, 0, 0, 0, 0, k - n)) if n < k else masks
        packed, images, order = pack_slots(det, det.valid, n)
        masks = self.second_stage(pooled, packed, images)[0]
        # Slots not packed, and packed slots that are not valid, hold zeros.
        return masks.new_zeros(b * k, *masks.shape[1:]).index_copy(0, order, masks).view(b, k, *masks.shape[1:])

    @torch.no_grad()
    def warmup(self, canvases: Sequence[Canvas] | None = None, batch_size: int = 1) -> None:
        """Run every (canvas, bucket) once on blank images (all of ``cfg.canvases`` by default), so
        that compiled stages are built before the first real batch of ``batch_size`` images (the
        first stage with and without the padding masks). Call it under the autocast the real calls
        use, if any."""
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
            # Told of the canvas's fill, the first stage has a graph for each answer: build both.
            for fills in (True, False) if self.tells_fills else (False,):
                det, pooled = self.first_stage(blank, fills)
            for n in self.widths(batch_size):
                self._masks(pooled, det, n)


class StagedTrainer(_Staged):
    """(ImageBatch, Targets) -> torchvision's five losses in two stages, the mask branch on a bucket.

    Runs ``model.box_training_stage`` (RPN and box losses, sampling), reads the batch's number of
    sampled positives on the host and runs ``model.mask_training_stage`` on them packed into
    n = B * s slots (:func:`packed_mask_rois`), s the smallest of ``cfg.mask_train_slots`` that
    holds them shared evenly over the B images. The losses, and so the gradients, equal the single
    graph's: padded slots are out of the mask loss either way.

    ``wrap`` wraps each stage; :meth:`compiled` is the ``torch.compile`` form, one static graph per
    canvas for the first stage and one per (canvas, n) used for the second, each with its backward.
    ``warm_ahead`` also runs the mask stage on every bucket of a canvas at its first batch (forward
    and backward, gradients discarded), so that which graphs exist never depends on the ground
    truth. ``used`` counts the batches run on each (canvas, n) so far.
    """

    stages = ("box_training_stage", "mask_training_stage")
    buckets_field = "mask_train_slots"

    def __call__(self, batch: ImageBatch, targets: Targets) -> dict[str, Tensor]:
        losses, pooled, rois, targets = self.first_stage(batch, targets, self._fills(batch))
        canvas = canvas_of(batch)
        if self.warm_ahead and canvas not in self._warm:
            self._warm_buckets(pooled, targets, rois, canvas)
            self._warm.add(canvas)
        rois, images = packed_mask_rois(rois, self.buckets)
        self._count(canvas, rois.boxes.shape[1])
        return {**losses, "loss_mask": self.second_stage(pooled, targets, rois, canvas, images)}

    def _warm_buckets(self, pooled: list[Tensor], targets: Targets, rois: MaskTrainingRoIs, canvas: Canvas) -> None:
        """Every bucket's forward and backward once, on detached features: no gradient reaches the
        first stage, and the mask head's gradients are put back as they were."""
        params = [p for p in self.model.roi_heads.parameters() if p.requires_grad]
        saved = [p.grad for p in params]
        detached = [f.detach().requires_grad_(f.requires_grad) for f in pooled]
        b, m = rois.positive.shape
        for s in self.buckets:
            if s > m:
                continue
            packed, images = pack_positives(rois, b * s)
            loss = self.second_stage(detached, targets, packed, canvas, images)
            if loss.requires_grad:
                loss.backward()
        for p, g in zip(params, saved):
            p.grad = g
