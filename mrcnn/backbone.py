"""ResNet + FPN, built from torchvision's own modules so its weights load with their own names.

Shapes are fixed by the input canvas alone: [B, 3, H, W] -> levels "0".."3" at strides 4..32 and
"pool" at stride 64, each with ``cfg.fpn_channels`` channels. :func:`masked_features` runs the same
modules with the canvas padding masked so that it changes nothing (``cfg.mask_padding``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from torchvision.models import resnet
from torchvision.models.detection.backbone_utils import BackboneWithFPN
from torchvision.ops import FrozenBatchNorm2d
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool

from mrcnn.config import Config, level_stride
from mrcnn.ops.max_pool import StemMaxPool2d
from mrcnn.structures import ImageBatch, canvas_of

_LAYERS = ["layer4", "layer3", "layer2", "layer1", "conv1"]


class MaskedBackboneWithFPN(BackboneWithFPN):
    """torchvision's ``BackboneWithFPN`` (same modules and state_dict names) that can mask its padding
    and fold its frozen batch norms.

    ``forward(images)`` is torchvision's; with ``extents`` or ``fold_norms`` it is
    :func:`masked_features`. Either way the model calls this module, so forward hooks on it see
    every image batch.
    """

    checkpointing = False  # cfg.activation_checkpointing: recompute activations in training's backward

    def forward(self, x: Tensor, extents: Tensor | None = None, fold_norms: bool = False) -> dict[str, Tensor]:
        """images [B, 3, H, W] (extents [B, 2] or None) -> {"0".."3", "pool": [B, C, H_l, W_l]}."""
        recompute = self.checkpointing and self.training and torch.is_grad_enabled()
        if extents is None and not fold_norms and not recompute:
            return super().forward(x)
        levels = masked_features(self, x, extents, fold_norms, recompute)
        return dict(zip(("0", "1", "2", "3", "pool"), levels, strict=True))


def build_backbone(cfg: Config) -> MaskedBackboneWithFPN:
    """torchvision ``_resnet_fpn_extractor`` semantics, with a configurable FPN width."""
    body = getattr(resnet, f"resnet{cfg.backbone_depth}")(weights=None, norm_layer=FrozenBatchNorm2d)
    # Freeze the stem and early stages as torchvision does (trainable_backbone_layers).
    trainable = _LAYERS[: cfg.trainable_backbone_layers] + (["bn1"] if cfg.trainable_backbone_layers == 5 else [])
    for name, parameter in body.named_parameters():
        if not any(name.startswith(layer) for layer in trainable):
            parameter.requires_grad_(False)
    # Compiled training on the CPU calls aten's max-pool kernels rather than inductor's backward loop.
    body.maxpool = StemMaxPool2d.like(body.maxpool)
    stage2 = body.inplanes // 8  # 256 for Bottleneck ResNets, 64 for BasicBlock ones
    backbone = MaskedBackboneWithFPN(
        body,
        return_layers={f"layer{k}": str(k - 1) for k in range(1, 5)},
        in_channels_list=[stage2 * 2 ** (k - 1) for k in range(1, 5)],
        out_channels=cfg.fpn_channels,
        extra_blocks=LastLevelMaxPool(),
    )
    backbone.checkpointing = cfg.activation_checkpointing
    return backbone


# ------------------------------------------------------------------------------------------------
# Padding that changes nothing: torchvision pads each batch only to its own size rounded up to
# ``size_divisible`` (the "extent") and every convolution zero-pads at that edge. On a larger static
# canvas the padded area stops being zero after the first conv + BN + ReLU, and each later kernel
# wider than 1 would mix it into the image edge. Zeroing the features outside the extent before
# each such kernel reproduces torchvision's maps inside the extent, with fixed shapes.


def padded_extents(image_sizes: Tensor, size_divisible: int) -> Tensor:
    """[B, 2] resized (h, w) -> [B, 2] torchvision's padded size: each rounded up to ``size_divisible``."""
    return (image_sizes + size_divisible - 1) // size_divisible * size_divisible


def sizes_on_host(extents: Tensor) -> bool:
    """Whether the call can read the batch's sizes on the host: eager, with them on the CPU. Graphs
    (compiled, exported, XLA, CUDA) never read them."""
    return not torch.compiler.is_compiling() and extents.device.type == "cpu"


def eager_crop(extents: Tensor, canvas: tuple[int, int]) -> tuple[tuple[int, int], Tensor | None]:
    """[B, 2] extents (:func:`padded_extents`) on ``canvas`` -> (the part of the canvas the backbone
    runs on, the extents :func:`masked_features` masks there, or None for no masks).

    Graphs (compiled, exported, XLA, CUDA): the whole canvas, masked, so one graph serves every size
    and no call waits on the device. Eager on the CPU, where the sizes are on the host already: the
    batch's largest extent, masked only where the extents differ. For one image that is
    torchvision's own work, its padded size, with no masks; the RPN head pads its outputs to the
    canvas (:func:`canvas_levels`), RoIAlign reads the crop's maps as they are.
    """
    if not sizes_on_host(extents):
        return canvas, extents
    largest = extents.amax(0)
    crop = (int(largest[0]), int(largest[1]))
    return crop, None if bool((extents == largest).all()) else extents


def fills_canvas(batch: ImageBatch, size_divisible: int, training: bool = False) -> bool:
    """Whether no feature of ``batch`` needs masking: every image's padded extent
    (:func:`padded_extents`; padding slots have the canvas's) is the whole canvas, or in training,
    where every image takes the largest valid image's extent, that one is. The model then skips
    the masks when told so (``forward(..., fills_canvas=True)``).

    A host read: False where the sizes are on a device, so that deciding never waits on it.
    """
    if batch.image_sizes.device.type != "cpu":
        return False
    extents = padded_extents(batch.image_sizes, size_divisible)
    if training:
        extents = largest_extent(extents, batch.valid)
    return bool((extents == torch.tensor(canvas_of(batch))).all())


def largest_extent(extents: Tensor, valid: Tensor) -> Tensor:
    """[B, 2] extents, [B] valid -> [1, 2] the largest valid image's: the extent torchvision pads a
    training batch to."""
    return torch.where(valid[:, None], extents, 0).amax(0, keepdim=True)


def canvas_level_size(canvas: tuple[int, int], level: int) -> tuple[int, int]:
    """(h, w) of level ``level`` (0..4: P2..P6, strides 4..64) on ``canvas``: ceil(n / stride)."""
    stride = 4 * 2**level
    return -(-canvas[0] // stride), -(-canvas[1] // stride)


def canvas_levels(levels: list[Tensor], canvas: tuple[int, int]) -> list[Tensor]:
    """Per-level maps of a crop of the canvas (:func:`eager_crop`), in P2..P6 order (the FPN's
    levels, or the RPN head's outputs on them) -> the same zero-padded to the canvas's level sizes:
    [B, C, ceil(H / s), ceil(W / s)] at strides s = 4..64."""
    out = []
    for i, f in enumerate(levels):
        h, w = canvas_level_size(canvas, i)
        out.append(f if f.shape[-2:] == (h, w) else F.pad(f, (0, w - f.shape[-1], 0, h - f.shape[-2])))
    return out


def level_extents(extents: Tensor, stride: int) -> Tensor:
    """[B, 2] input extents -> [B, 2] torchvision's feature-map size at ``stride`` (a power of 2).

    Every stride-2 step of ResNet (7x7 pad 3, 3x3 pad 1, 1x1 pad 0, max-pool 3 pad 1) and the FPN's
    LastLevelMaxPool (kernel 1) maps n to ceil(n / 2), and repeated ceilings compose to ceil(n / s).
    """
    return (extents + stride - 1) // stride


def extent_mask(x: Tensor, extents: Tensor, canvas: tuple[int, int]) -> Tensor:
    """[B, 1, h, w] of x's dtype: 1 inside each image's extent at x's stride, 0 outside."""
    h, w = x.shape[-2:]
    stride = level_stride(canvas[0], h)
    limit = level_extents(extents, stride)
    rows = torch.arange(h, device=x.device)[None, :] < limit[:, :1]  # [B, h]
    cols = torch.arange(w, device=x.device)[None, :] < limit[:, 1:]  # [B, w]
    return (rows[:, None, :, None] & cols[:, None, None, :]).to(x.dtype)


# The device types where ``fold_batch_norm="auto"`` folds in eager: where it was measured to cut
# latency (the CPU: docs/model.md). CUDA is left unfolded until measured there.
AUTO_FOLD = frozenset({"cpu"})


def fold_norms_on(cfg: Config, device: torch.device) -> bool:
    """Whether the backbone folds its frozen batch norms into its convolutions (:func:`conv_norm`):
    ``cfg.fold_batch_norm`` True everywhere, graphs included; "auto" in eager on :data:`AUTO_FOLD`
    only (a compiler fuses the norm into its own kernels: inductor, XLA)."""
    if cfg.fold_batch_norm == "auto":
        return device.type in AUTO_FOLD and not torch.compiler.is_compiling()
    return bool(cfg.fold_batch_norm)


def conv_norm(conv: nn.Conv2d, norm: FrozenBatchNorm2d, x: Tensor, fold: bool = False) -> Tensor:
    """``norm(conv(x))``: x [B, C_in, H, W] -> [B, C_out, H', W'].

    A frozen batch norm is x * scale + shift per channel, two passes of their own over the map in
    eager. With ``fold`` it goes into the convolution instead: weight * scale and a bias of shift,
    one convolution, the same function up to float rounding. The folded weight is made at every
    call (a pass over the weights, far smaller than the maps), so nothing is baked in: a later
    ``load_state_dict`` or optimiser step counts, and gradients reach the weight through the fold.
    """
    if not fold:
        return norm(conv(x))
    weight, bias = folded_conv(conv, norm)
    return F.conv2d(x, weight, bias, conv.stride, conv.padding, conv.dilation, conv.groups)


def folded_conv(conv: nn.Conv2d, norm: FrozenBatchNorm2d) -> tuple[Tensor, Tensor]:
    """The weight [C_out, C_in, k, k] (in the conv weight's memory layout) and bias [C_out] of the
    one convolution that computes ``norm(conv(x))``: weight x scale, and the norm's shift (plus
    the conv's own bias x scale)."""
    scale = norm.weight * (norm.running_var + norm.eps).rsqrt()
    shift = norm.bias - norm.running_mean * scale
    if conv.bias is not None:
        shift = shift + conv.bias * scale
    return conv.weight * scale.reshape(-1, 1, 1, 1), shift


def _block(block: nn.Module, x: Tensor, zero: Callable[[Tensor], Tensor], fold: bool) -> Tensor:
    """torchvision's BasicBlock / Bottleneck forward with the inputs of its 3x3 conv zeroed outside."""
    downsample = block.downsample  # 1x1 conv + norm: reads no neighbours
    identity = x if downsample is None else conv_norm(downsample[0], downsample[1], x, fold)
    if isinstance(block, resnet.Bottleneck):
        out = block.relu(conv_norm(block.conv1, block.bn1, x, fold))
        out = block.relu(conv_norm(block.conv2, block.bn2, zero(out), fold))
        out = conv_norm(block.conv3, block.bn3, out, fold)
    else:
        out = block.relu(conv_norm(block.conv1, block.bn1, zero(x), fold))
        out = conv_norm(block.conv2, block.bn2, zero(out), fold)
    return block.relu(out + identity)


def masked_features(
    backbone: BackboneWithFPN, images: Tensor, extents: Tensor | None, fold: bool = False, recompute: bool = False
) -> list[Tensor]:
    """images [B, 3, H, W], extents [B, 2] -> P2..P6 [B, C, H_l, W_l], each zero outside the extent.

    Same modules and weights as ``backbone(images)``; inside each image's extent every level equals
    torchvision's on that image padded only to its extent. ``extents`` None masks nothing (the
    image is its extent); ``fold`` folds the frozen norms into the convolutions (:func:`conv_norm`).
    ``recompute`` keeps only the inputs of each trainable block and of the FPN for the backward
    pass, which runs them again (``torch.utils.checkpoint``): the same values for less memory.
    """
    canvas = (images.shape[-2], images.shape[-1])
    masks: dict[tuple[int, torch.dtype], Tensor] = {}  # one per stride: every 3x3 of a stage shares it

    def zero(x: Tensor) -> Tensor:
        if extents is None:
            return x
        if recompute:  # a recomputed region writes nothing outside itself: torch.compile traces it as pure
            return x * extent_mask(x, extents, canvas)
        key = (level_stride(canvas[0], x.shape[-2]), x.dtype)
        if key not in masks:
            masks[key] = extent_mask(x, extents, canvas)
        return x * masks[key]

    body = backbone.body
    x = body.relu(conv_norm(body.conv1, body.bn1, zero(images), fold))
    x = body.maxpool(zero(x))  # after ReLU x >= 0, so zeros pool like torchvision's -inf padding
    stages = []
    for name in ("layer1", "layer2", "layer3", "layer4"):
        for block in getattr(body, name):
            # A frozen block before the first trainable one keeps nothing for the backward pass anyway.
            if recompute and (x.requires_grad or any(p.requires_grad for p in block.parameters())):
                x = checkpoint(_block, block, x, zero, fold, use_reentrant=False)
            else:
                x = _block(block, x, zero, fold)
        stages.append(x)
    if recompute:
        return checkpoint(_pyramid, backbone.fpn, stages, zero, use_reentrant=False)
    return _pyramid(backbone.fpn, stages, zero)


def _pyramid(fpn: nn.Module, stages: list[Tensor], zero: Callable[[Tensor], Tensor]) -> list[Tensor]:
    """C2..C5 [B, C_k, H_k, W_k] -> P2..P6 [B, C, H_l, W_l]: torchvision's FPN with ``zero`` before each 3x3."""
    last = fpn.get_result_from_inner_blocks(stages[-1], -1)  # 1x1 lateral convs need no mask
    levels = [zero(fpn.get_result_from_layer_blocks(zero(last), -1))]
    for idx in range(len(stages) - 2, -1, -1):
        lateral = fpn.get_result_from_inner_blocks(stages[idx], idx)
        # Sizes double exactly between levels of a canvas and of an extent, so nearest upsampling
        # copies the same values as torchvision's inside the extent.
        last = lateral + upsample_nearest(last, lateral.shape[-2:])
        levels.insert(0, zero(fpn.get_result_from_layer_blocks(zero(last), idx)))
    # LastLevelMaxPool (kernel 1, stride 2) of a zeroed P5 is zero outside the P6 extent too.
    levels, _ = fpn.extra_blocks(levels, stages, [str(i) for i in range(len(levels))])
    return levels


def upsample_nearest(x: Tensor, size: Sequence[int]) -> Tensor:
    """x [B, C, h, w] -> [B, C, *size]: ``F.interpolate(x, size, mode="nearest")``.

    On XLA, when ``size`` is exactly (2h, 2w) (always, between FPN levels of a canvas), the same
    values come from an expand and a reshape instead: torch_xla lowers their backward (a sum), but
    runs ``upsample_nearest2d``'s backward on the CPU, a fallback inside every training step.
    """
    h, w = x.shape[-2:]
    if x.device.type != "xla" or tuple(size) != (2 * h, 2 * w):
        return F.interpolate(x, size=tuple(size), mode="nearest")
    b, c = x.shape[:2]
    return x[:, :, :, None, :, None].expand(b, c, h, 2, w, 2).reshape(b, c, 2 * h, 2 * w)


def edge_extended(feature: Tensor, extents: Tensor, canvas: tuple[int, int]) -> Tensor:
    """[B, C, h, w] zeroed outside the extent -> the same with row/column ``extent`` copied from extent - 1.

    (Also used on full-canvas ground-truth masks [B, G, H, W] with the image sizes as extents.)

    torchvision's roi_align clamps a sample in (n - 1, n] to row n - 1 of its n-row map; on the
    larger canvas the bilinear tap would read row n instead. A copy of row n - 1 there makes both
    kernels (and the tensor impl) read what torchvision reads. Samples lie inside boxes clipped to
    the image, so none reaches past row n.
    """
    h, w = feature.shape[-2:]
    stride = level_stride(canvas[0], h)
    limit = level_extents(extents, stride)
    rows = torch.arange(h, device=feature.device)[None, :]
    cols = torch.arange(w, device=feature.device)[None, :]
    below = (rows == limit[:, :1])[:, None, :, None]  # [B, 1, h, 1]
    beside = (cols == limit[:, 1:])[:, None, None, :]  # [B, 1, 1, w]
    feature = torch.where(below, F.pad(feature, (0, 0, 1, 0))[..., :h, :], feature)
    return torch.where(beside, F.pad(feature, (1, 0))[..., :w], feature)
