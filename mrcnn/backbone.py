"""ResNet + FPN, built from torchvision's own modules so its weights load with their own names.

Shapes are fixed by the input canvas alone: [B, 3, H, W] -> levels "0".."3" at strides 4..32 and
"pool" at stride 64, each with ``cfg.fpn_channels`` channels.
"""

from __future__ import annotations

from torchvision.models import resnet
from torchvision.models.detection.backbone_utils import BackboneWithFPN
from torchvision.ops import FrozenBatchNorm2d
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool

from mrcnn.config import Config

_LAYERS = ["layer4", "layer3", "layer2", "layer1", "conv1"]


def build_backbone(cfg: Config) -> BackboneWithFPN:
    """torchvision ``_resnet_fpn_extractor`` semantics, with a configurable FPN width."""
    body = getattr(resnet, f"resnet{cfg.backbone_depth}")(weights=None, norm_layer=FrozenBatchNorm2d)
    # Freeze the stem and early stages as torchvision does (trainable_backbone_layers).
    trainable = _LAYERS[: cfg.trainable_backbone_layers] + (["bn1"] if cfg.trainable_backbone_layers == 5 else [])
    for name, parameter in body.named_parameters():
        if not any(name.startswith(layer) for layer in trainable):
            parameter.requires_grad_(False)
    stage2 = body.inplanes // 8  # 256 for Bottleneck ResNets, 64 for BasicBlock ones
    return BackboneWithFPN(
        body,
        return_layers={f"layer{k}": str(k - 1) for k in range(1, 5)},
        in_channels_list=[stage2 * 2 ** (k - 1) for k in range(1, 5)],
        out_channels=cfg.fpn_channels,
        extra_blocks=LastLevelMaxPool(),
    )
