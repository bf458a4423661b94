"""Memory layout of the convolutions' activations (``Config.channels_last``).

Two moves: into NHWC before the convolutions when the config puts them in channels_last on the
input's device, and back to contiguous NCHW where torchvision's RoIAlign kernel would otherwise
copy at every call.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mrcnn.config import Config

# The device types where ``channels_last="auto"`` runs the convolutions in NHWC in eager: where it
# was measured to cut latency (the CPU: docs/model.md). CUDA is left NCHW until measured there.
AUTO_CHANNELS_LAST = frozenset({"cpu"})


def channels_last_on(cfg: Config, device: torch.device) -> bool:
    """Whether the convolutions run in channels_last on ``device``: ``cfg.channels_last`` True on
    CPU and CUDA; "auto" on :data:`AUTO_CHANNELS_LAST` in eager only; never on XLA (no strides).

    Under ``torch.compile`` (and torch.export), "auto" keeps NCHW: inductor picks the convolutions'
    layout itself, and an NHWC input measured no faster there (slower at COCO size)."""
    if cfg.channels_last == "auto":
        return device.type in AUTO_CHANNELS_LAST and not torch.compiler.is_compiling()
    return bool(cfg.channels_last) and device.type in ("cpu", "cuda")


def place_conv_weights(model: nn.Module, cfg: Config) -> None:
    """Put ``model``'s 4-D parameters (conv weights) in the layout its convolutions run in on the
    device the model is on: NHWC where :func:`channels_last_on` says so outside a graph (``True``,
    and ``"auto"`` on the CPU), so that no eager convolution converts its weight at every call;
    ``"auto"`` elsewhere makes them NCHW again; ``False`` leaves them as loaded. XLA has no strides.

    Names, shapes and values are unchanged, and ``load_state_dict`` copies into this layout. Under
    ``torch.compile`` the weights are graph inputs (constants once frozen) whose layout inductor
    reads; measured in docs/model.md.
    """
    first = next(model.parameters(), None)
    if first is None or cfg.channels_last is False or first.device.type not in ("cpu", "cuda"):
        return
    layout = torch.channels_last if channels_last_on(cfg, first.device) else torch.contiguous_format
    for p in model.parameters():
        if p.dim() == 4 and not p.is_contiguous(memory_format=layout):
            p.data = p.data.contiguous(memory_format=layout)


def conv_layout(x: Tensor, cfg: Config) -> Tensor:
    """[N, C, H, W] in the convolutions' layout (:func:`channels_last_on` for its device): every
    convolution after it then keeps that layout."""
    if channels_last_on(cfg, x.device):
        return x.contiguous(memory_format=torch.channels_last)
    return x


def contiguous_nchw(x: Tensor) -> Tensor:
    """[B, C, H, W] in any layout -> contiguous (NCHW), as ``x.contiguous()``.

    Eager on the CPU, a channels_last map is copied as one 2-D transpose per image ([H*W, C] ->
    [C, H*W]): PyTorch's blocked transpose, about 5x faster here than the strided copy of
    ``contiguous()``. Compiled, the compiler writes the transpose itself.
    """
    if x.is_contiguous() or x.device.type != "cpu" or torch.compiler.is_compiling():
        return x.contiguous()
    b, c, h, w = x.shape
    rows = x.permute(0, 2, 3, 1).reshape(b, h * w, c)  # a view when x is channels_last
    out = x.new_empty((b, c, h * w))
    for i in range(b):
        out[i].copy_(rows[i].t())
    return out.view(b, c, h, w)
