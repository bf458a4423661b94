"""Memory layout of the convolutions' activations (``Config.channels_last``).

Two moves: into NHWC before the convolutions that ``cfg.channels_last`` puts in channels_last, and
back to contiguous NCHW where torchvision's RoIAlign kernel would otherwise copy at every call.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mrcnn.config import Config


def conv_layout(x: Tensor, cfg: Config) -> Tensor:
    """[N, C, H, W] in the convolutions' layout: channels_last with ``cfg.channels_last`` on CPU and
    CUDA (every convolution then keeps NHWC), as given elsewhere (XLA has no strides)."""
    if cfg.channels_last and x.device.type in ("cpu", "cuda"):
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
