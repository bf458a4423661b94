"""Weights: torchvision checkpoints in, and deterministic non-trivial weights for tests and benches.

The static model keeps torchvision's module names, so a torchvision ``maskrcnn_resnet50_fpn``
state_dict loads with ``strict=True`` through :func:`load_torchvision_weights`; nothing anywhere
renames keys by hand.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

import torch
from torch import Tensor, nn
from torchvision.ops import FrozenBatchNorm2d

from mrcnn.config import Config, get_config
from mrcnn.exits import UsageError
from mrcnn.reference import torchvision_model
from mrcnn.torch_files import read_torch_file


def read_state_dict(path: str | os.PathLike) -> dict[str, Tensor]:
    """A state_dict file (or a checkpoint holding one under "model", as torchvision's reference scripts
    and ``mrcnn train`` write); ValueError naming the file when it is not one."""
    if not os.path.isfile(path):
        raise UsageError(f"weights file not found: {path}")
    state = read_torch_file(path, "weights file")
    if isinstance(state, Mapping) and "model" in state and isinstance(state["model"], Mapping):
        state = state["model"]
    if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
        raise UsageError(f"{path}: not a state_dict (a mapping of parameter names to tensors)")
    return dict(state)


def load_torchvision_weights(model: nn.Module, weights: Mapping[str, Tensor] | str | os.PathLike) -> nn.Module:
    """Load a torchvision Mask R-CNN state_dict (or a path to one) into ``model``, strictly.

    Raises ``ValueError`` naming the missing and unexpected keys when the checkpoint does not
    match the model's architecture (for example a v2 checkpoint into a v1 config).
    """
    if isinstance(weights, (str, os.PathLike)):
        weights = read_state_dict(weights)
    own = model.state_dict()
    # torchvision's FrozenBatchNorm2d drops BatchNorm's step counter when loading; so do we. It is
    # present when the checkpoint came from a model trained with ordinary BatchNorm.
    weights = {k: v for k, v in weights.items() if k in own or not k.endswith(".num_batches_tracked")}
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    shapes = [k for k in set(own) & set(weights) if own[k].shape != weights[k].shape]
    if missing or unexpected or shapes:

        def head(keys: list[str]) -> str:
            return ", ".join(keys[:5]) + (f" (+{len(keys) - 5} more)" if len(keys) > 5 else "")

        raise UsageError(
            "checkpoint does not match the model: "
            f"{len(missing)} missing [{head(missing)}], {len(unexpected)} unexpected [{head(unexpected)}], "
            f"{len(shapes)} with other shapes [{head(sorted(shapes))}]"
        )
    model.load_state_dict(weights, strict=True)
    return model


def textured_images(sizes: tuple[tuple[int, int], ...], seed: int = 0) -> list[Tensor]:
    """Deterministic [3, h, w] float images in [0, 1]: smooth colour fields plus noise.

    Enough structure for the heads to disagree across RoIs; used for calibration, tests and benches.
    """
    g = torch.Generator().manual_seed(seed)
    images = []
    for h, w in sizes:
        coarse = torch.rand(3, h // 16 + 1, w // 16 + 1, generator=g)
        img = torch.nn.functional.interpolate(coarse[None], size=(h, w), mode="bilinear", align_corners=False)[0]
        images.append((0.7 * img + 0.3 * torch.rand(3, h, w, generator=g)).clamp(0, 1))
    return images


def calibration_images(cfg: Config, seed: int = 0) -> list[Tensor]:
    """The default calibration batch of :func:`synthetic_weights`: textured and white-noise images.

    Statistics taken on smooth textured images alone are narrower than what photographs produce
    (sharp edges, every frequency), and through a deep backbone the gap compounds until a photo's
    objectness and class scores saturate (sigmoid and softmax give exactly 1.0 in fp32). Then
    torchvision's own detections depend on how its sort orders equal scores, and parity measures
    tie-breaking instead of the model. White noise in the same batch widens every statistic.
    """
    sizes = ((cfg.min_size, int(cfg.min_size * 1.3)), (cfg.min_size, cfg.min_size))
    g = torch.Generator().manual_seed(seed)
    return textured_images(sizes, seed) + [torch.rand(3, h, w, generator=g) for h, w in sizes]


@torch.no_grad()
def synthetic_weights(
    cfg: Config | str = "coco_r50_fpn", seed: int = 0, images: list[Tensor] | None = None
) -> dict[str, Tensor]:
    """Deterministic, data-calibrated random weights that make Mask R-CNN produce real detections.

    Plain random init gives near-constant objectness and near-uniform class scores (1/91 each,
    below the 0.05 threshold), so nothing is detected and NMS has nothing to do. Here every frozen
    batch-norm gets the statistics of its input on calibration images (so activations stay O(1)
    through the ResNet), and each head's last layer is rescaled so its outputs spread: objectness
    and class logits with standard deviation ~2.5, non-zero box deltas, and mask logits far from 0.
    The result gives dozens of detections per image with distinct scores, which makes parity
    against torchvision a real test. Returns a torchvision-compatible state_dict.

    ``images`` ([3, h, w] in [0, 1]) replace the default calibration batch: smooth textured images
    and as many white-noise images (:func:`calibration_images`).
    """
    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    torch.manual_seed(seed)
    model = torchvision_model(cfg).eval()
    images = calibration_images(cfg, seed) if images is None else images
    calibrate(model, images)
    return {k: v.clone() for k, v in model.state_dict().items()}


@torch.no_grad()
def calibrate(model: nn.Module, images: list[Tensor], shortcut: bool | None = None) -> None:
    """Calibrate a torchvision Mask R-CNN in place on ``images`` ([3, h, w] in [0, 1]), as
    :func:`synthetic_weights` describes: one pass for the frozen norms and the first head layer, then
    one per head layer.

    ``shortcut`` (None: wherever it is exact) replays the backbone's features after the first pass and
    ends each pass at its layer's module; False runs every pass whole (the tests compare the two).
    """
    frozen = [m for m in model.modules() if isinstance(m, FrozenBatchNorm2d)]
    hooks = [m.register_forward_pre_hook(_standardise_once) for m in frozen]
    # Every pass but the first sees the backbone as the first pass left it (its frozen norms are all
    # it calibrates), so its features are replayed, and a pass stops once its layer's module has run:
    # what follows cannot change what the pass measures. Where a frozen norm lies outside the
    # backbone, every pass runs whole, as it must for that norm's statistics.
    if shortcut is None:
        shortcut = {id(m) for m in frozen} <= {id(m) for m in model.backbone.modules()}
    stages = [  # (layer, target std of its output, the module whose end closes its pass), in data order
        (model.rpn.head.cls_logits, 2.5, model.rpn.head),
        (model.rpn.head.bbox_pred, 0.1, model.rpn.head),
        (model.roi_heads.box_predictor.cls_score, 2.5, model.roi_heads.box_predictor),
        (model.roi_heads.box_predictor.bbox_pred, 1.0, model.roi_heads.box_predictor),
        (model.roi_heads.mask_predictor.mask_fcn_logits, 4.0, model.roi_heads.mask_predictor),
    ]
    backbone, features = model.backbone, []
    try:
        for layer, target, last in stages:  # one pass per stage: each rescale changes what later stages see
            seen: list[Tensor] = []
            handles = [layer.register_forward_hook(lambda _m, _i, out, seen=seen: seen.append(out.detach()))]
            if shortcut:
                handles.append(last.register_forward_hook(_end_pass))
                if not features:
                    handles.append(backbone.register_forward_hook(lambda _m, _i, out: features.append(out)))
            with contextlib.suppress(_PassDone):
                model(images)
            for h in handles + hooks:
                h.remove()
            hooks = []
            if shortcut and features:
                model.backbone = _Replay(features[0])
            if seen:
                _standardise_outputs(layer, torch.cat([o.transpose(0, 1).flatten(1) for o in seen], 1), target)
    finally:
        model.backbone = backbone


class _PassDone(Exception):
    """Raised by :func:`_end_pass`: a calibration pass has what it measures."""


def _end_pass(*_: object) -> None:
    raise _PassDone


class _Replay(nn.Module):
    """Stands in for the calibrated backbone: its features ({level: [N, C, h, w]}) of the calibration batch."""

    def __init__(self, features: Mapping[str, Tensor]) -> None:
        super().__init__()
        self.features = features

    def forward(self, _tensors: Tensor) -> Mapping[str, Tensor]:
        return self.features


def _standardise_once(module: FrozenBatchNorm2d, inputs: tuple[Tensor, ...]) -> None:
    """Forward pre-hook: set a frozen BN's statistics to those of its first input."""
    x = inputs[0]
    module.running_mean.copy_(x.mean(dim=(0, 2, 3)))
    module.running_var.copy_(x.var(dim=(0, 2, 3)))
    module.weight.fill_(1.0)
    module.bias.zero_()


def _standardise_outputs(layer: nn.Module, outputs: Tensor, target: float) -> None:
    """Rescale a Linear/Conv layer so each output channel has mean 0 and std ``target``.

    outputs: [C_out, N] what the layer produced on the calibration data. Centring per channel is
    what makes the predicted class (and mask pixels) vary from RoI to RoI instead of one class
    winning everywhere.
    """
    mean, std = outputs.mean(1), outputs.std(1).clamp(min=1e-6)
    scale = target / std
    layer.weight.mul_(scale.view(-1, *([1] * (layer.weight.dim() - 1))))
    layer.bias.sub_(mean).mul_(scale)
