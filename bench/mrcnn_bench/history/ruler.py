"""The ruler: a fixed amount of work timed beside every case, so that machine drift cancels in a ratio.

A machine that is 20% slower this minute is 20% slower for the case and for the ruler timed in the
same round, so ``case time / ruler time`` stays put while raw times move. That only holds if the
ruler itself never changes between the commits being compared. It is therefore built from
torchvision's own classes (pinned with torch) and this module's literals, with weights, images and
targets that this module makes from fixed seeds: nothing comes from the commit's ``mrcnn``, whose
presets, reference builder or synthetic weights a commit may change.

The architecture follows the tiny preset's shape (ResNet-18 FPN, narrow heads) so that the ruler
spends its time in the same kinds of kernels as the cases it is compared with; its settings are
frozen here on purpose and are not meant to track the preset.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models import resnet18
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.backbone_utils import BackboneWithFPN
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.mask_rcnn import MaskRCNN, MaskRCNNHeads, MaskRCNNPredictor
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool
from torchvision.ops.misc import FrozenBatchNorm2d

SEED = 0
IMAGE_SIZE = (240, 320)  # (height, width) of every ruler image
IMAGES = 3  # distinct images, cycled over the rounds like a workload's
TRAIN_BATCH = 2  # images per ruler training step
_CHANNELS = 64  # FPN and mask-head width
_NUM_CLASSES = 7  # background + 6


def ruler_images(count: int = IMAGES, size: tuple[int, int] = IMAGE_SIZE, seed: int = SEED) -> list[Tensor]:
    """``count`` smooth random images [3, h, w] in [0, 1]: low-resolution noise upsampled bilinearly."""
    g = torch.Generator().manual_seed(seed)
    h, w = size
    out = []
    for _ in range(count):
        coarse = torch.rand(1, 3, max(1, h // 16), max(1, w // 16), generator=g)
        fine = torch.rand(1, 3, h, w, generator=g) * 0.1
        out.append((F.interpolate(coarse, size=size, mode="bilinear", align_corners=False) * 0.9 + fine)[0])
    return out


def ruler_targets(
    count: int = TRAIN_BATCH, size: tuple[int, int] = IMAGE_SIZE, seed: int = SEED
) -> list[dict[str, Tensor]]:
    """Training targets for :func:`ruler_images`: three boxes per image with filled-rectangle masks."""
    g = torch.Generator().manual_seed(seed + 1)
    h, w = size
    targets = []
    for _ in range(count):
        x0 = torch.randint(0, w // 2, (3,), generator=g).float()
        y0 = torch.randint(0, h // 2, (3,), generator=g).float()
        boxes = torch.stack([x0, y0, x0 + w // 4 + 8, y0 + h // 4 + 8], 1)
        masks = torch.zeros(3, h, w, dtype=torch.uint8)
        for k, (a, b, c, d) in enumerate(boxes.long().tolist()):
            masks[k, b:d, a:c] = 1
        labels = torch.randint(1, _NUM_CLASSES, (3,), generator=g)
        targets.append({"boxes": boxes, "labels": labels, "masks": masks})
    return targets


def _standardise_frozen_bn(model: nn.Module, images: list[Tensor]) -> None:
    """Set every frozen BN's statistics from its first input, so the random network neither explodes
    nor vanishes (a random ResNet with identity BN overflows to inf by the last stage)."""

    def once(module: FrozenBatchNorm2d, inputs: tuple[Tensor, ...]) -> None:
        x = inputs[0]
        module.running_mean.copy_(x.mean(dim=(0, 2, 3)))
        module.running_var.copy_(x.var(dim=(0, 2, 3)).clamp(min=1e-6))
        handles.pop(module).remove()

    handles = {m: m.register_forward_pre_hook(once) for m in model.modules() if isinstance(m, FrozenBatchNorm2d)}
    with torch.no_grad():
        model.eval()(images[:1])
    for handle in handles.values():
        handle.remove()


def ruler_model() -> MaskRCNN:
    """torchvision's ``MaskRCNN`` with the ruler's frozen settings and seeded, calibrated weights (eval mode)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        body = resnet18(weights=None, norm_layer=FrozenBatchNorm2d)
        backbone = BackboneWithFPN(
            body,
            return_layers={f"layer{k}": str(k - 1) for k in range(1, 5)},
            in_channels_list=[64, 128, 256, 512],
            out_channels=_CHANNELS,
            extra_blocks=LastLevelMaxPool(),
        )
        model = MaskRCNN(
            backbone,
            num_classes=None,
            min_size=320,
            max_size=512,
            rpn_anchor_generator=AnchorGenerator(((16,), (32,), (64,), (128,), (256,)), ((0.5, 1.0, 2.0),) * 5),
            rpn_pre_nms_top_n_train=1000,
            rpn_post_nms_top_n_train=500,
            rpn_pre_nms_top_n_test=500,
            rpn_post_nms_top_n_test=300,
            box_head=TwoMLPHead(_CHANNELS * 7 * 7, 256),
            box_predictor=FastRCNNPredictor(256, _NUM_CLASSES),
            box_batch_size_per_image=128,
            mask_head=MaskRCNNHeads(_CHANNELS, (_CHANNELS, _CHANNELS), 1),
            mask_predictor=MaskRCNNPredictor(_CHANNELS, _CHANNELS, _NUM_CLASSES),
        )
    _standardise_frozen_bn(model, ruler_images())
    return model.eval()


class Ruler:
    """One ruler call per round: ``call(index)`` runs inference on image ``index`` (cycled), or one
    training step on the fixed batch. The training step uses SGD with lr 0, so every step does the
    same work on the same weights."""

    def __init__(self, phase: str = "inference") -> None:
        if phase not in ("inference", "training"):
            raise ValueError(f"ruler phase must be 'inference' or 'training', got {phase!r}")
        self.phase = phase
        self.model = ruler_model()
        self.images = ruler_images()
        self._step: Callable[[], Any] | None = None
        if phase == "training":
            self.model.train()
            params = [p for p in self.model.parameters() if p.requires_grad]
            optimizer = torch.optim.SGD(params, lr=0.0, momentum=0.9)
            images, targets = self.images[:TRAIN_BATCH], ruler_targets()

            def step() -> Any:
                optimizer.zero_grad(set_to_none=True)
                losses: OrderedDict[str, Tensor] = self.model(images, targets)
                sum(losses.values()).backward()
                optimizer.step()

            self._step = step

    def call(self, index: int) -> Any:
        if self._step is not None:
            return self._step()
        with torch.no_grad():
            return self.model([self.images[index % len(self.images)]])
