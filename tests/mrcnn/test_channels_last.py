"""``Config.channels_last``: the convolutions in NHWC, with NCHW's outputs and state_dict.

Outputs are compared with ``channels_last=False``'s (same weights, same input): NHWC convolutions
sum in another order, so boxes, scores and masks agree to float rounding and valid and labels
exactly. ``True`` converts the conv weights; ``"auto"``, the default, puts only the activations in
NHWC, and only on the devices of ``AUTO_CHANNELS_LAST`` (the CPU).
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

from mrcnn.config import get_config
from mrcnn.layout import channels_last_on
from mrcnn.model import MaskRCNN, contiguous_nchw
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, textured_images
from tests.helpers.detections import assert_same_detections
from tests.helpers.training import random_targets, small_cfg

# Two sizes on the tiny preset's (320, 448) canvas, one of them off its extent (masked padding).
SIZES = ((240, 320), (230, 300))


def _static(cfg, weights, **overrides):
    return load_torchvision_weights(MaskRCNN(cfg.replace(**overrides)).eval(), weights)


def _layouts(model: nn.Module) -> list[str]:
    """Hooks that record every convolution whose input or output is not channels_last."""
    found: list[str] = []

    def check(name: str):
        def hook(_module, inputs, output):
            if not all(t.is_contiguous(memory_format=torch.channels_last) for t in (inputs[0], output)):
                found.append(name)

        return hook

    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d | nn.ConvTranspose2d):
            module.register_forward_hook(check(name))
    return found


@pytest.mark.parametrize("layout", [True, "auto"])
@pytest.mark.parametrize("impl", ["torchvision", "tensor"])
def test_outputs_equal_nchw(tiny_cfg, tiny_weights, impl, layout):
    batch = to_image_batch(textured_images(SIZES, seed=2), tiny_cfg)
    nchw = _static(tiny_cfg, tiny_weights, ops_impl=impl, channels_last=False)
    nhwc = _static(tiny_cfg, tiny_weights, ops_impl=impl, channels_last=layout)
    not_nhwc = _layouts(nhwc)
    with torch.no_grad():
        expected, got = nchw(batch), nhwc(batch)
    assert int(expected.valid.sum()) > 50  # the weights detect things: the comparison is not vacuous
    assert_same_detections(got, expected)
    # Backbone, FPN, RPN head and mask head: every convolution reads and writes NHWC; the padding
    # masks (masked_features, edge_extended) keep the layout.
    assert not_nhwc == []


def test_weights_keep_their_names_and_load(tiny_cfg, tiny_weights):
    model = _static(tiny_cfg, tiny_weights, channels_last=True)
    state = model.state_dict()
    assert list(state) == list(MaskRCNN(tiny_cfg).state_dict())
    assert all(torch.equal(state[k], v) for k, v in tiny_weights.items() if k in state)
    convs = [m.weight for m in model.modules() if isinstance(m, nn.Conv2d | nn.ConvTranspose2d)]
    # load_state_dict copied the checkpoint into the NHWC parameters.
    assert all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)
    assert not all(w.is_contiguous() for w in convs)


def _conv_weights(model):
    return [m.weight for m in model.modules() if isinstance(m, nn.Conv2d | nn.ConvTranspose2d)]


def test_auto_is_the_default_and_puts_the_weights_in_the_layout_of_the_device(tiny_cfg, tiny_weights, monkeypatch):
    """"auto" keeps the conv weights in the layout eager convolutions run in on the model's device
    (no per-call conversion): NHWC on the CPU, and NCHW again after a move to a device where the
    activations stay NCHW (here the CPU, made such a device)."""
    assert get_config("tiny").channels_last == "auto"
    model = _static(tiny_cfg, tiny_weights, channels_last="auto")
    convs = _conv_weights(model)
    assert all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)
    assert not all(w.is_contiguous() for w in convs)  # 1x1 kernels are both
    monkeypatch.setattr("mrcnn.layout.AUTO_CHANNELS_LAST", frozenset())
    model.to(torch.float32)  # any move re-places the weights
    assert all(w.is_contiguous() for w in _conv_weights(model))
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in tiny_weights.items() if k in state)
    # False leaves the weights as loaded.
    assert all(w.is_contiguous() for w in _conv_weights(_static(tiny_cfg, tiny_weights, channels_last=False)))


@pytest.mark.parametrize(
    ("layout", "device", "expected"),
    [
        ("auto", "cpu", True),
        ("auto", "cuda", False),  # not measured there yet
        ("auto", "xla", False),
        (True, "cpu", True),
        (True, "cuda", True),
        (True, "xla", False),  # no strides on XLA
        (False, "cpu", False),
    ],
)
def test_layout_resolves_by_device(tiny_cfg, layout, device, expected):
    assert channels_last_on(tiny_cfg.replace(channels_last=layout), torch.device(device)) is expected


def test_auto_keeps_nchw_under_compile(tiny_cfg):
    """Compiled, "auto" leaves the layout to the compiler (what a compiled model traces)."""
    cfg = tiny_cfg.replace(channels_last="auto")
    torch._dynamo.reset()
    traced = torch.compile(lambda x: torch.tensor(channels_last_on(cfg, x.device)), backend="eager", fullgraph=True)
    assert channels_last_on(cfg, torch.device("cpu")) and not bool(traced(torch.zeros(1)))


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_bad_layout_is_refused(value):
    with pytest.raises(ValueError, match="channels_last must be True, False or 'auto'"):
        get_config("tiny", channels_last=value)


def test_contiguous_nchw_equals_contiguous():
    x = torch.randn(2, 16, 9, 7).contiguous(memory_format=torch.channels_last)
    for t in (x, x.contiguous(), torch.randn(1, 256, 70, 90).contiguous(memory_format=torch.channels_last)):
        out = contiguous_nchw(t)
        assert out.is_contiguous() and torch.equal(out, t)


def test_training_losses_equal_nchw(tiny_cfg, tiny_weights):
    cfg = small_cfg(tiny_cfg)
    batch = to_image_batch(textured_images(((128, 112), (100, 128)), seed=4), cfg)
    targets = random_targets(cfg, batch, [3, 2], seed=5)
    losses = {}
    for layout in (False, True, "auto"):
        model = load_torchvision_weights(MaskRCNN(cfg.replace(channels_last=layout)), tiny_weights).train()
        torch.manual_seed(0)  # the samplers' random keys
        losses[layout] = model(batch, targets)
        sum(losses[layout].values()).backward()
    for name, value in losses[False].items():
        for layout in (True, "auto"):
            torch.testing.assert_close(losses[layout][name], value, rtol=1e-5, atol=0, msg=f"{name} {layout}")


@pytest.mark.slow
def test_compiled_one_graph_per_canvas(tiny_cfg, tiny_weights):
    model = _static(tiny_cfg, tiny_weights, channels_last=True)
    default = _static(tiny_cfg, tiny_weights, channels_last=False)
    batches = [to_image_batch([img], tiny_cfg) for img in textured_images(SIZES, seed=11)]
    assert len({tuple(b.tensors.shape) for b in batches}) == 1
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    with torch.no_grad():
        for batch in batches:
            assert_same_detections(compiled(batch), default(batch))
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert not counters["recompiles"], dict(counters["recompiles"])


@pytest.mark.slow
@pytest.mark.xla
def test_ignored_on_xla(tiny_cfg, tiny_weights):
    """On XLA (no strides) the field changes nothing: the same outputs for every setting there."""
    pytest.importorskip("torch_xla", reason="torch_xla is not installed")
    import torch_xla  # optional backend: imported only where the test runs

    cfg = small_cfg(tiny_cfg, ops_impl="tensor")
    device = torch_xla.device()
    images = textured_images(((128, 112),), seed=6)
    out = [_static(cfg, tiny_weights, channels_last=cl).to(device).predict(images)[0] for cl in (False, True, "auto")]
    for key in ("boxes", "scores", "labels", "masks"):
        assert torch.equal(out[0][key], out[1][key]) and torch.equal(out[0][key], out[2][key]), key
