"""The CUDA paths: the static model on a GPU against torchvision on the same GPU, and against the CPU.

Detections of both op paths on photographs at off-canvas sizes, fullgraph inductor with one graph
per canvas bucket, NMS and RoIAlign (values and gradients) against the CPU, and the training losses
and head gradients against torchvision's on the GPU. Without a CUDA device every test skips, saying so.

TF32 is turned off for the module: on Ampere and later it rounds convolution and matmul inputs to a
10-bit mantissa, and the comparisons would then measure TF32 rather than the model.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from mrcnn.export.compare import match_outputs
from mrcnn.model import MaskRCNN
from mrcnn.ops import multilevel_roi_align, nms_fixed, resolve_impl
from mrcnn.reference import torchvision_model
from mrcnn.structures import ImageBatch, Targets
from mrcnn.transform import select_canvas, to_image_batch
from mrcnn.weights import load_torchvision_weights
from tests.helpers.photos import OFF_CANVAS_SIZES, PHOTOS, assert_detections_match, photo
from tests.helpers.training import assert_parity, pad_targets

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device visible: these tests compare the CUDA paths with torchvision and the CPU "
    "(run them on a GPU machine, docs/gpu_tpu.md)",
)
pytest.importorskip("matplotlib.cbook", reason="the sample photographs ship with matplotlib")

# Off-canvas sizes (their torchvision padding is smaller than their canvas), landscape and portrait.
GPU_SIZES = OFF_CANVAS_SIZES[:3] + OFF_CANVAS_SIZES[5:8]


@pytest.fixture(scope="module", autouse=True)
def no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(scope="module")
def images():
    return [photo(PHOTOS[i % 2], size) for i, size in enumerate(GPU_SIZES)]


def _cpu(detections: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.cpu() for k, v in detections.items()}


def _static(cfg, weights, device: str, **overrides) -> MaskRCNN:
    return load_torchvision_weights(MaskRCNN(cfg.replace(**overrides)).eval(), weights).to(device)


@pytest.fixture(scope="module")
def reference(tiny_cfg, tiny_weights, images):
    """torchvision's detections on the GPU, each image alone."""
    tv = torchvision_model(tiny_cfg).eval()
    tv.load_state_dict(tiny_weights)
    tv = tv.cuda()
    with torch.no_grad():
        return [_cpu(tv([img.cuda()])[0]) for img in images]


def test_auto_uses_torchvision_kernels_on_the_gpu():
    assert resolve_impl("auto", torch.device("cuda")) == "torchvision"


@pytest.mark.parametrize("ops_impl", ["auto", "tensor"])
def test_detections_match_torchvision_on_the_gpu(tiny_cfg, tiny_weights, images, reference, ops_impl):
    """Each image on its canvas bucket gives torchvision's GPU detections (>= 98% both ways)."""
    out = [_cpu(d) for d in _static(tiny_cfg, tiny_weights, "cuda", ops_impl=ops_impl).predict(images)]
    assert_detections_match(reference, out, f"cuda, {ops_impl} ops vs torchvision on cuda")


def test_gpu_detections_match_the_cpu(tiny_cfg, tiny_weights, images):
    cpu = _static(tiny_cfg, tiny_weights, "cpu").predict(images)
    gpu = [_cpu(d) for d in _static(tiny_cfg, tiny_weights, "cuda").predict(images)]
    assert_detections_match(cpu, gpu, "cuda vs cpu")


def test_fullgraph_inductor_on_the_gpu_compiles_once_per_canvas(tiny_cfg, tiny_weights, images):
    """torch.compile(fullgraph=True) on CUDA: one graph per canvas bucket, eager's detections."""
    model = _static(tiny_cfg, tiny_weights, "cuda")
    batches = [ImageBatch(*(t.cuda() for t in to_image_batch([img], tiny_cfg))) for img in images]
    canvases = {select_canvas([tuple(img.shape[-2:])], tiny_cfg) for img in images}
    assert len(canvases) >= 2
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        for batch in batches:
            det, expected = compiled(batch), model(batch)
            # Paired, not element-wise: Triton's reductions round differently from cuDNN's, and a swap
            # of two near-equal scores shifts every later slot (seen on an H200: 27 of 100 slots).
            agreement = match_outputs(expected, det)  # Detections: (boxes, scores, labels, masks, valid)
            assert agreement["matched"] >= 0.98 and agreement["min_mask_iou"] >= 0.9, agreement
    assert counters["stats"]["unique_graphs"] == len(canvases), dict(counters["stats"])
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])


@pytest.mark.parametrize("impl", ["torchvision", "tensor"])
def test_ops_on_the_gpu_match_the_cpu(impl):
    """Fixed-size NMS (the same kept indices) and multi-level RoIAlign (values and gradients)."""
    gen = torch.Generator().manual_seed(0)
    xy = torch.rand(2, 300, 2, generator=gen) * 200
    boxes = torch.cat([xy, xy + 8 + torch.rand(2, 300, 2, generator=gen) * 60], -1)
    scores = torch.rand(2, 300, generator=gen)
    valid = torch.rand(2, 300, generator=gen) > 0.1
    groups = torch.randint(0, 4, (2, 300), generator=gen)
    on_cpu = nms_fixed(boxes, scores, valid, 0.5, 50, groups=groups, impl=impl)
    on_gpu = nms_fixed(boxes.cuda(), scores.cuda(), valid.cuda(), 0.5, 50, groups=groups.cuda(), impl=impl)
    (keep_c, valid_c), (keep_g, valid_g) = on_cpu, (t.cpu() for t in on_gpu)
    assert torch.equal(valid_g, valid_c) and torch.equal(keep_g[valid_g], keep_c[valid_c])

    features = [torch.randn(2, 8, 64 >> i, 80 >> i, generator=gen) for i in range(4)]
    rois = boxes[:, :64] * torch.tensor([1.2, 1.0, 1.2, 1.0])
    upstream = torch.randn(2, 64, 8, 7, 7, generator=gen)

    def run(device: str):
        # A copy each time: on the CPU .to() returns the tensor itself, and requires_grad_ on it would make
        # the CUDA copy a non-leaf, whose .grad stays None.
        leaves = [f.detach().to(device, copy=True).requires_grad_() for f in features]
        out = multilevel_roi_align(leaves, rois.to(device), 7, sampling_ratio=2, impl=impl)
        (out * upstream.to(device)).sum().backward()
        return out.detach().cpu(), [f.grad.cpu() for f in leaves]

    (out_c, grads_c), (out_g, grads_g) = run("cpu"), run("cuda")
    torch.testing.assert_close(out_g, out_c, atol=1e-5, rtol=1e-5)
    for g_gpu, g_cpu in zip(grads_g, grads_c):
        torch.testing.assert_close(g_gpu, g_cpu, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("impl", ["torchvision", "tensor"])
def test_training_losses_on_the_gpu_match_torchvision_on_the_gpu(parity_setup, tiny_weights, impl):
    """The loss-parity batch of tests/mrcnn/test_training_parity.py, both models on CUDA: losses and head
    gradients within 1e-4 (CUDA's RoIAlign backward adds with atomics, so not bit for bit)."""
    cfg, images, per_image = parity_setup
    tv = torchvision_model(cfg)
    tv.load_state_dict(tiny_weights)
    tv = tv.cuda().train()
    ref = tv([i.cuda() for i in images], [{k: v.cuda() for k, v in t.items()} for t in per_image])
    sum(ref.values()).backward()
    ref_grads = {n: p.grad.cpu() for n, p in tv.named_parameters() if p.grad is not None}

    batch = to_image_batch(images, cfg)
    targets = pad_targets(per_image, 8, tuple(batch.tensors.shape[-2:]))
    model = load_torchvision_weights(MaskRCNN(cfg.replace(ops_impl=impl)), tiny_weights).cuda().train()
    losses = model(ImageBatch(*(t.cuda() for t in batch)), Targets(*(t.cuda() for t in targets)))
    sum(losses.values()).backward()
    grads = {n: p.grad.cpu() for n, p in model.named_parameters() if p.grad is not None}
    assert_parity(
        {k: v.detach().cpu() for k, v in losses.items()},
        grads,
        {k: v.detach().cpu() for k, v in ref.items()},
        ref_grads,
        exact_kernels=False,
    )
