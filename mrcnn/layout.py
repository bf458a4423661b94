"""Memory layout of the convolutions' activations (``Config.channels_last``).

Two moves: into NHWC before the convolutions when the config puts them in channels_last on the
input's device, and back to contiguous NCHW where torchvision's RoIAlign kernel would otherwise
copy at every call.
"""

from __future__ import annotations

import torch
from torch import Tensor

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
