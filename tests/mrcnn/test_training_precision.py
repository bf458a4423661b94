"""Mixed precision in training: bf16 autocast on the CPU stays near fp32, fp16 with GradScaler on CUDA
stays finite over steps of varying ground truth.
"""

from __future__ import annotations

import pytest
import torch

from mrcnn.losses import check_targets
from mrcnn.model import MaskRCNN
from mrcnn.structures import ImageBatch, Targets
from mrcnn.transform import to_image_batch
from mrcnn.weights import textured_images
from tests.helpers.training import LOSS_NAMES, SMALL_SIZES, random_targets, small_cfg


def test_bf16_autocast_on_cpu(tiny_cfg):
    cfg = small_cfg(tiny_cfg)
    torch.manual_seed(0)
    model = MaskRCNN(cfg).train()
    batch = to_image_batch(textured_images(SMALL_SIZES, seed=0), cfg)
    targets = random_targets(cfg, batch, [3, 2], seed=0)
    torch.manual_seed(1)
    with torch.no_grad():
        fp32 = model(batch, targets)
    torch.manual_seed(1)  # the same random sampling keys
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = model(batch, targets)
    sum(bf16.values()).backward()
    bf16 = {k: v.detach() for k, v in bf16.items()}
    for name in LOSS_NAMES:
        assert bf16[name].dtype == torch.float32 and torch.isfinite(bf16[name]), name
        assert abs(float(bf16[name] - fp32[name])) <= 0.05 * abs(float(fp32[name])) + 0.01, (
            name,
            float(bf16[name]),
            float(fp32[name]),
        )
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 + GradScaler needs a CUDA GPU; none is visible")
def test_fp16_gradscaler_on_cuda(tiny_cfg):
    cfg = small_cfg(tiny_cfg)
    model = MaskRCNN(cfg).train().cuda()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    batch = to_image_batch(textured_images(SMALL_SIZES, seed=0), cfg)
    for step, counts in enumerate(([3, 2], [0, 1], [4, 4])):
        targets = random_targets(cfg, batch, counts, seed=step)
        check_targets(targets, cfg, batch)  # on the host, before the copy
        cuda_batch = ImageBatch(*(t.cuda() for t in batch))
        with torch.autocast("cuda", dtype=torch.float16):
            losses = model(cuda_batch, Targets(*(t.cuda() for t in targets)))
        assert all(torch.isfinite(v) for v in losses.values())
        optimizer.zero_grad()
        scaler.scale(sum(losses.values())).backward()
        scaler.step(optimizer)
        scaler.update()
    assert all(torch.isfinite(p).all() for p in model.parameters())
