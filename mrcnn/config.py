"""Model configuration: every size that makes the graph static lives here.

Field names follow torchvision's ``MaskRCNN`` keyword arguments (``rpn_pre_nms_top_n_test``,
``box_detections_per_img``, ...) so a reader can cross-check the two. The fields that have no
torchvision counterpart are the static sizes: ``canvases`` (the padded input buckets),
``box_pre_nms_top_n`` (candidates kept before per-class NMS), ``nms_iterations`` (work done by the
pure-tensor NMS), ``max_gt_instances`` and ``gt_mask_size`` (padded ground truth).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from mrcnn.exits import UsageError

# torchvision's box-head RoIAlign output (MultiScaleRoIAlign(output_size=7)); the box head's input
# size depends on it, so torchvision weights fix it.
BOX_ROI_SIZE = 7

Canvas = tuple[int, int]  # (height, width) of a padded input bucket, multiples of size_divisible

# The mask branch's buckets of ``mask_detection_buckets="auto"`` (those below K, then K) and of
# ``mask_train_buckets="auto"`` (those below Q, then Q): powers of two, so that a batch's mask
# branch runs on at most twice the slots it fills and compiled stages build few graphs.
AUTO_MASK_BUCKETS = (8, 16, 32, 64, 128, 256, 512)
# The largest canvas side a config may name: one 3 x 16384 x 16384 fp32 image is 3.2 GB already, and
# a larger one fails deep inside an allocation rather than here.
MAX_CANVAS_SIDE = 16384
# Sizes and counts for which 0 or less means nothing (a zero divisor, an empty layer, no proposals).
_POSITIVE = (
    "fpn_channels", "min_size", "max_size", "size_divisible", "rpn_pre_nms_top_n_train", "rpn_pre_nms_top_n_test",
    "rpn_post_nms_top_n_train", "rpn_post_nms_top_n_test", "rpn_batch_size_per_image", "representation_size",
    "box_pre_nms_top_n", "box_batch_size_per_image", "mask_dilation", "mask_dim_reduced", "mask_roi_size",
    "max_gt_instances", "gt_mask_size", "nms_iterations",
)
# Fields that take a value of another type as well, checked by their own rules below.
_EITHER = ("channels_last", "fold_batch_norm", "mask_detection_buckets", "mask_train_buckets")


def _ending_with(buckets: tuple[int, ...] | str, largest: int) -> tuple[int, ...]:
    """A bucket field's sizes in use: ``buckets`` (those of :data:`AUTO_MASK_BUCKETS` below
    ``largest`` for "auto"), ending with ``largest``, which is appended when the last is smaller."""
    sizes = tuple(n for n in AUTO_MASK_BUCKETS if n < largest) if buckets == "auto" else tuple(buckets)
    return sizes if sizes and sizes[-1] == largest else (*sizes, largest)


def level_stride(canvas: int, size: int) -> int:
    """The power-of-two stride of a feature map ``size`` long on a side ``canvas`` long.

    Maps are ceil(canvas / stride) long, so a plain division is off for the coarse levels. An
    integer loop rather than log2: under dynamic shapes (sizes are SymInts) it traces as guards.
    """
    stride = 1
    while -(-canvas // stride) > size:
        stride *= 2
    return stride


def _default_canvases(min_size: int, max_size: int, divisible: int, mid: int) -> tuple[Canvas, ...]:
    """Square, a middle bucket for the common 3:4 photo, and the widest each way.

    torchvision resizes the short side to ``min_size`` unless the long side would pass
    ``max_size``. Buckets that fit the common cases tightly keep padding (wasted work) small,
    while staying few, because every bucket costs one compilation on XLA.
    """

    def up(x: int) -> int:
        return -(-x // divisible) * divisible

    short, long_ = up(min_size), up(max_size)
    mid = up(mid)
    return ((short, short), (short, mid), (short, long_), (mid, short), (long_, short))


@dataclass(frozen=True)
class Config:
    """Static Mask R-CNN configuration. Build presets with :func:`get_config`."""

    name: str = "coco_r50_fpn"

    # Backbone: torchvision ResNet + FPN, so torchvision weights load unchanged.
    backbone_depth: int = 50  # 18, 34, 50 or 101
    fpn_channels: int = 256
    trainable_backbone_layers: int = 3
    num_classes: int = 91  # including background; COCO uses category ids as labels

    # Transform (torchvision's GeneralizedRCNNTransform, evaluation path).
    min_size: int = 800
    max_size: int = 1333
    image_mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    image_std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    size_divisible: int = 32
    # Padded input buckets (H, W). An image batch goes to the smallest bucket holding all of it.
    canvases: tuple[Canvas, ...] = field(default_factory=lambda: _default_canvases(800, 1333, 32, 1067))
    # Zero features outside each image's own padded size (its size rounded up to size_divisible)
    # before every kernel wider than 1, so a larger canvas gives torchvision's detections for that
    # image. False: the canvas padding leaks into the image border (cheaper; cost measured by bench).
    mask_padding: bool = True

    # Anchors.
    anchor_sizes: tuple[int, ...] = (32, 64, 128, 256, 512)  # one size per FPN level
    aspect_ratios: tuple[float, ...] = (0.5, 1.0, 2.0)

    # RPN.
    rpn_pre_nms_top_n_train: int = 2000  # per level
    rpn_pre_nms_top_n_test: int = 1000
    rpn_post_nms_top_n_train: int = 2000  # per image: the static proposal count
    rpn_post_nms_top_n_test: int = 1000
    rpn_nms_thresh: float = 0.7
    rpn_fg_iou_thresh: float = 0.7
    rpn_bg_iou_thresh: float = 0.3
    rpn_batch_size_per_image: int = 256
    rpn_positive_fraction: float = 0.5
    rpn_score_thresh: float = 0.0

    # RoI heads.
    representation_size: int = 1024
    box_score_thresh: float = 0.05
    box_nms_thresh: float = 0.5
    box_detections_per_img: int = 100  # K, the static detection count
    box_pre_nms_top_n: int = 1000  # candidates (box, class) entering per-class NMS
    box_fg_iou_thresh: float = 0.5
    box_bg_iou_thresh: float = 0.5
    box_batch_size_per_image: int = 512
    box_positive_fraction: float = 0.25
    bbox_reg_weights: tuple[float, float, float, float] = (10.0, 10.0, 5.0, 5.0)
    # Training RoIs per image that the mask branch sees. 0: the positive quota,
    # int(box_batch_size_per_image * box_positive_fraction), which holds every sampled positive
    # (torchvision's loss). Smaller: a uniformly random subset of the sampled positives (an
    # unbiased estimate of the same mean loss), which bounds the mask head's fixed training cost;
    # it runs on every slot, filled or not. The measured speed and accuracy trade-off is in the
    # training results.
    mask_rois_per_image: int = 0
    # Mask-RoI buckets for training; torchvision's loss either way. Empty: the mask branch trains
    # on all Q slots of the positive quota, filled or not, in the one training graph. Sizes n,
    # positive, strictly increasing, at most Q (Q is appended when the last is smaller): the eager
    # training forward and :class:`mrcnn.staged.StagedTrainer` then read the batch's largest
    # sampled-positive count on the host and train the mask branch on the smallest n slots that
    # hold every positive (one graph per (canvas, n) when the stages are compiled). Positives fill
    # the first slots, so the loss is the same as on all Q; a compiled ``forward`` (no host read
    # inside a graph) keeps all Q. "auto" (the default) resolves by device
    # (mrcnn.staged.packs_mask_training): :data:`AUTO_MASK_BUCKETS` below Q in the eager forward on
    # the CPU, where that was measured faster; all Q elsewhere, under torch.compile, and with
    # ``mask_rois_per_image``. Measured: docs/training.md.
    mask_train_buckets: tuple[int, ...] | str = "auto"

    # Mask branch.
    mask_layers: tuple[int, ...] = (256, 256, 256, 256)
    mask_dilation: int = 1
    mask_dim_reduced: int = 256
    mask_roi_size: int = 14  # RoIAlign output; the predictor upsamples to 2x this
    # Detection-count buckets for the mask branch in ``predict``. Sizes n, positive, strictly
    # increasing, at most K (K is appended when the last is smaller): ``predict`` runs the box stage,
    # reads the valid counts on the host and runs the mask branch on the smallest n that holds every
    # image's valid detections in the batch (:class:`mrcnn.staged.StagedDetector`; one graph per
    # (canvas, n) when the stages are compiled). Outputs equal the single graph's. Empty: the mask
    # branch runs on all K slots, one graph per canvas (what XLA/TPU should use: the host read splits
    # each call in two). "auto" (the default) resolves by device (mrcnn.staged.stages_masks): staged
    # in eager on the CPU, where that was measured faster, on exactly the slots the detections fill
    # (eager builds no graphs; :data:`AUTO_MASK_BUCKETS` for compiled stages); the single graph
    # elsewhere, under torch.compile and for an in-place compiled model.
    # ``forward`` itself ignores this field. Measured: docs/model.md.
    mask_detection_buckets: tuple[int, ...] | str = "auto"

    # Ground truth padding (training and evaluation of padded batches).
    max_gt_instances: int = 100
    gt_mask_size: int = 112  # GT masks are cropped to their boxes at this resolution

    # Kernels. "auto": torchvision's kernels on cpu/cuda, pure tensor ops elsewhere (XLA).
    ops_impl: str = "auto"
    nms_iterations: int = 16  # fixed-point steps of the pure-tensor NMS
    # Memory layout of the convolutions: True runs the backbone, FPN, RPN head and mask head in
    # torch.channels_last (NHWC) on CPU and CUDA, their conv weights included (MaskRCNN converts
    # them; state_dict names and shapes are unchanged). "auto" (the default) resolves by the input's
    # device (mrcnn.layout.channels_last_on): NHWC activations in eager where that was measured
    # faster, the CPU, with the conv weights kept NHWC while the model is there (so no call
    # converts them); NCHW activations elsewhere and under torch.compile, where inductor picks the
    # layout itself. Same outputs up to float rounding either way. XLA has no strides and ignores
    # it. Measured: docs/model.md.
    channels_last: bool | str = "auto"
    # The ResNet's frozen batch norms folded into the convolutions before them (weight x scale, a
    # bias of the shift; made again at every call, so loading weights still counts): True
    # everywhere, graphs included; "auto" (the default) in eager on the CPU, where each norm is
    # otherwise two passes over its map (mrcnn.backbone.fold_norms_on), not under torch.compile or
    # on XLA, whose compilers fuse the norm themselves. Same outputs up to float rounding.
    # Measured: docs/model.md.
    fold_batch_norm: bool | str = "auto"
    # Training memory: the backward pass recomputes the activations of the trainable ResNet blocks
    # and of the FPN (torch.utils.checkpoint, non-reentrant) instead of keeping them from the
    # forward, so a step holds one block's at a time: less peak memory for one more forward of
    # those layers. No effect without gradients (inference). Same losses and gradients.
    # Measured: docs/training.md.
    activation_checkpointing: bool = False

    @property
    def mask_size(self) -> int:
        """M, the side of the mask probabilities in ``Detections.masks``."""
        return 2 * self.mask_roi_size

    @property
    def mask_buckets(self) -> tuple[int, ...]:
        """The mask branch's detection-count buckets when staged: ``mask_detection_buckets`` (those
        of :data:`AUTO_MASK_BUCKETS` below K for "auto") ending with K (``box_detections_per_img``),
        or (K,) alone when none are set."""
        return _ending_with(self.mask_detection_buckets, self.box_detections_per_img)

    @property
    def mask_positive_quota(self) -> int:
        """Q, the training slots the mask branch reads: the box sampler's positive quota,
        int(box_batch_size_per_image * box_positive_fraction), which holds every sampled positive."""
        return int(self.box_batch_size_per_image * self.box_positive_fraction)

    @property
    def mask_train_slots(self) -> tuple[int, ...]:
        """The mask branch's training-slot buckets when packed: ``mask_train_buckets`` (those of
        :data:`AUTO_MASK_BUCKETS` below Q for "auto") ending with Q (:attr:`mask_positive_quota`),
        or (Q,) alone when none are set."""
        return _ending_with(self.mask_train_buckets, self.mask_positive_quota)

    @property
    def box_roi_size(self) -> int:
        """Side of the box head's RoIAlign output."""
        return BOX_ROI_SIZE

    @property
    def num_anchors_per_location(self) -> int:
        return len(self.aspect_ratios)

    def replace(self, **changes) -> Config:
        return dataclasses.replace(self, **changes)

    def __post_init__(self) -> None:
        # Types first: a string where a number belongs would otherwise fail in a comparison below
        # (or deep inside torch) instead of naming the field.
        problems = self._type_problems()
        if problems:
            raise UsageError(f"invalid config {self.name!r}: " + "; ".join(problems))
        problems += [f"{name} must be a positive integer, got {getattr(self, name)}" for name in _POSITIVE
                     if getattr(self, name) <= 0]
        problems += [f"{f.name} must be in [0, 1], got {getattr(self, f.name)}" for f in dataclasses.fields(self)
                     if f.name.endswith(("_thresh", "_fraction")) and not 0.0 <= getattr(self, f.name) <= 1.0]
        if problems:  # the canvases' check below divides by size_divisible
            raise UsageError(f"invalid config {self.name!r}: " + "; ".join(problems))
        if self.backbone_depth not in (18, 34, 50, 101):
            problems.append(f"backbone_depth must be 18, 34, 50 or 101, got {self.backbone_depth}")
        if self.ops_impl not in ("auto", "torchvision", "tensor"):
            problems.append(f"ops_impl must be 'auto', 'torchvision' or 'tensor', got {self.ops_impl!r}")
        if not (isinstance(self.channels_last, bool) or self.channels_last == "auto"):
            problems.append(f"channels_last must be True, False or 'auto', got {self.channels_last!r}")
        if not (isinstance(self.fold_batch_norm, bool) or self.fold_batch_norm == "auto"):
            problems.append(f"fold_batch_norm must be True, False or 'auto', got {self.fold_batch_norm!r}")
        if not self.canvases:
            problems.append("canvases must name at least one (height, width) bucket")
        for canvas in self.canvases:
            if len(canvas) != 2 or any(int(s) <= 0 or int(s) % self.size_divisible for s in canvas):
                problems.append(f"canvas {canvas} must be two positive sizes divisible by {self.size_divisible}")
            elif max(canvas) > MAX_CANVAS_SIDE:
                problems.append(f"canvases: {canvas} has a side above {MAX_CANVAS_SIDE}")
        if len(self.anchor_sizes) != 5:
            problems.append("anchor_sizes needs one size per FPN level (5: P2..P6)")
        if self.num_classes < 2:
            problems.append("num_classes counts the background and must be at least 2")
        if self.box_pre_nms_top_n < self.box_detections_per_img:
            problems.append("box_pre_nms_top_n must be at least box_detections_per_img")
        for head in ("rpn", "box"):  # the matcher's thresholds: below bg background, from fg foreground
            fg, bg = getattr(self, f"{head}_fg_iou_thresh"), getattr(self, f"{head}_bg_iou_thresh")
            if not bg <= fg:
                problems.append(f"{head}_bg_iou_thresh {bg} must be <= {head}_fg_iou_thresh {fg}")
        if self.box_detections_per_img < 0:
            problems.append(f"box_detections_per_img must be >= 0, got {self.box_detections_per_img}")
        if self.mask_rois_per_image < 0:
            problems.append(f"mask_rois_per_image must be >= 0 (0: the positive quota), got {self.mask_rois_per_image}")
        problems += self._bucket_problems()
        if problems:
            raise UsageError(f"invalid config {self.name!r}: " + "; ".join(problems))

    def _type_problems(self) -> list[str]:
        """Each field's value against the type of its default: ints (not bools) where the default is
        an int, numbers where a float, a bool or a string where one, and tuples (or lists, made
        tuples) of numbers where a tuple; canvases hold pairs of ints."""
        problems = []
        for f in dataclasses.fields(self):
            if f.name in _EITHER:
                continue
            value = getattr(self, f.name)
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            if isinstance(default, tuple) and isinstance(value, list):  # e.g. from --set canvases=[[320,320]]
                object.__setattr__(self, f.name, value := tuple(tuple(v) if isinstance(v, list) else v for v in value))
            if not _same_kind(value, default, ints_only=f.name == "canvases"):
                problems.append(f"{f.name} must be {_kind(default)}, got {value!r}")
        return problems

    def _bucket_problems(self) -> list[str]:
        k = self.box_detections_per_img
        problems = self._buckets_problems("mask_detection_buckets", k, "box_detections_per_img")
        problems += self._buckets_problems("mask_train_buckets", self.mask_positive_quota, "the positive quota")
        if self.mask_train_buckets not in ((), "auto") and self.mask_rois_per_image:
            problems.append(
                "mask_train_buckets keeps torchvision's mask loss and mask_rois_per_image subsamples it: set one"
            )
        return problems

    def _buckets_problems(self, name: str, largest: int, largest_name: str) -> list[str]:
        buckets = getattr(self, name)
        if buckets == "auto":
            return []
        if isinstance(buckets, list):  # e.g. from ``--set mask_detection_buckets=[8,32]``
            object.__setattr__(self, name, buckets := tuple(buckets))
        what = f"{name} {buckets!r}"
        if not isinstance(buckets, tuple) or not all(isinstance(n, int) and not isinstance(n, bool) for n in buckets):
            return [f"{what} must be a tuple of ints, e.g. (8, 16, 32, 64) or 'auto'"]
        problems = []
        if any(n <= 0 for n in buckets):
            problems.append(f"{what} must be positive")
        if any(a >= b for a, b in itertools.pairwise(buckets)):
            problems.append(f"{what} must be strictly increasing")
        if buckets and buckets[-1] > largest:
            problems.append(f"{what} must not exceed {largest_name} ({largest}); a smaller last gets it appended")
        return problems


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return (_is_int(x) or isinstance(x, float)) and x == x and abs(x) != float("inf")


def _same_kind(value: object, default: object, ints_only: bool = False) -> bool:
    """Whether ``value`` has the kind of ``default`` (see :meth:`Config._type_problems`)."""
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return _is_int(value)
    if isinstance(default, float):
        return _is_number(value)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, tuple):
        if not isinstance(value, tuple):
            return False
        if ints_only:  # canvases: pairs of ints
            return all(isinstance(v, tuple) and all(_is_int(s) for s in v) for v in value)
        return all(_is_number(v) for v in value)
    return True


def _kind(default: object) -> str:
    if isinstance(default, bool):
        return "True or False"
    if isinstance(default, int):
        return "an integer"
    if isinstance(default, float):
        return "a finite number"
    if isinstance(default, str):
        return "a string"
    return "a tuple of numbers, e.g. " + repr(default[:2] if isinstance(default, tuple) else default)


def _tiny() -> Config:
    """ResNet-18 FPN with narrow heads on 320-px images: CPU tests and minutes-long training."""
    return Config(
        name="tiny",
        backbone_depth=18,
        fpn_channels=64,
        trainable_backbone_layers=5,
        num_classes=7,  # background + the synthetic data set's 6 shape classes
        min_size=320,
        max_size=512,
        canvases=_default_canvases(320, 512, 32, 427),
        anchor_sizes=(16, 32, 64, 128, 256),
        rpn_pre_nms_top_n_train=1000,
        rpn_pre_nms_top_n_test=500,
        rpn_post_nms_top_n_train=500,
        rpn_post_nms_top_n_test=300,
        representation_size=256,
        box_batch_size_per_image=128,
        box_pre_nms_top_n=500,
        mask_layers=(64, 64),
        mask_dim_reduced=64,
        max_gt_instances=32,
        gt_mask_size=56,
    )


PRESETS = {"coco_r50_fpn": Config, "tiny": _tiny}


def get_config(name: str = "coco_r50_fpn", **overrides) -> Config:
    """Return preset ``name`` with ``overrides`` applied (any :class:`Config` field)."""
    if name not in PRESETS:
        raise UsageError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    cfg = PRESETS[name]()
    unknown = set(overrides) - {f.name for f in dataclasses.fields(Config)}
    if unknown:
        raise UsageError(f"unknown config field(s) {sorted(unknown)} for preset {name!r}")
    return cfg.replace(**overrides) if overrides else cfg
