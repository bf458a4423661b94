"""Your own cases, with no edit to the harness: a module named in ``$MRCNN_BENCH_CASES``.

    export MRCNN_BENCH_CASES=my_cases PYTHONPATH=bench/examples
    mrcnn-bench list                                        # tv_v2/eager and static/eager+k32 among the cases
    mrcnn-bench run --cases torchvision/eager,tv_v2/eager,static/eager,static/eager+k32 --out out/mine

Two kinds of case:

- another model: torchvision's ``maskrcnn_resnet50_fpn_v2`` as a second reference, called as
  torchvision's models are (a list of images in, a list of dicts out). Its architecture differs from
  the v1 model whose state_dict the harness makes, so it starts from a seeded random init: its
  latency is comparable, its parity with torchvision's v1 is not;
- the static model with another config: the detection count K at 32 instead of the preset's.

A package of yours can declare the module as an entry point instead of the variable::

    [project.entry-points."mrcnn_bench.cases"]
    mine = "my_package.my_cases"
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.models.detection import maskrcnn_resnet50_fpn_v2

from mrcnn.config import Config
from mrcnn_bench.running.cases import Case, add_case, register_implementation

register_implementation("tv_v2", interface="torchvision", builder="my_cases:maskrcnn_v2")
add_case(Case("tv_v2"))
add_case(Case("static", tag="k32", overrides=(("box_detections_per_img", 32),)))


def maskrcnn_v2(cfg: Config, weights: dict[str, Tensor]) -> nn.Module:
    """torchvision's Mask R-CNN v2 at the run's sizes and class count (``weights`` is for v1: unused)."""
    torch.manual_seed(0)
    return maskrcnn_resnet50_fpn_v2(weights=None, weights_backbone=None, num_classes=cfg.num_classes,
                                    min_size=cfg.min_size, max_size=cfg.max_size,
                                    box_detections_per_img=cfg.box_detections_per_img)
