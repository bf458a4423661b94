"""The ResNet stem's max pool with aten's CPU kernels kept whole in a compiled training step.

Inductor lowers ``max_pool2d`` and its backward into loops of its own. On the CPU its backward
loop ran slower than aten's kernel (docs/training.md), and in a training step of the
tiny preset that loop was the slowest kernel the compiler wrote. ``mrcnn::max_pool2d_kept`` is
aten's ``max_pool2d_with_indices`` inside a custom op with aten's backward registered for it, so a
compiled step calls both kernels as eager does: the same values, bit for bit.

No ``from __future__ import annotations`` here: ``torch.library.custom_op`` reads the schema from
real annotation objects.
"""

import torch
from torch import Tensor, nn


@torch.library.custom_op("mrcnn::max_pool2d_kept", mutates_args=())
def _max_pool2d_kept(x: Tensor, kernel: int, stride: int, padding: int) -> tuple[Tensor, Tensor]:
    return torch.ops.aten.max_pool2d_with_indices(x, [kernel, kernel], [stride, stride], [padding, padding])


@_max_pool2d_kept.register_fake
def _max_pool2d_kept_fake(x: Tensor, kernel: int, stride: int, padding: int) -> tuple[Tensor, Tensor]:
    return torch.ops.aten.max_pool2d_with_indices(x, [kernel, kernel], [stride, stride], [padding, padding])


@torch.library.custom_op("mrcnn::max_pool2d_kept_backward", mutates_args=())
def _max_pool2d_kept_backward(
    grad: Tensor, x: Tensor, indices: Tensor, kernel: int, stride: int, padding: int
) -> Tensor:
    return torch.ops.aten.max_pool2d_with_indices_backward(
        grad, x, [kernel, kernel], [stride, stride], [padding, padding], [1, 1], False, indices
    )


@_max_pool2d_kept_backward.register_fake
def _max_pool2d_kept_backward_fake(
    grad: Tensor, x: Tensor, indices: Tensor, kernel: int, stride: int, padding: int
) -> Tensor:
    return torch.ops.aten.max_pool2d_with_indices_backward(
        grad, x, [kernel, kernel], [stride, stride], [padding, padding], [1, 1], False, indices
    )


def _setup_context(ctx, inputs, output) -> None:
    x, kernel, stride, padding = inputs
    ctx.save_for_backward(x, output[1])
    ctx.window = (kernel, stride, padding)


def _backward(ctx, grad: Tensor, _grad_indices: Tensor):
    x, indices = ctx.saved_tensors
    return _max_pool2d_kept_backward(grad, x, indices, *ctx.window), None, None, None


_max_pool2d_kept.register_autograd(_backward, setup_context=_setup_context)


def _square(value: int | tuple[int, ...]) -> int | None:
    """An nn.MaxPool2d parameter as one int, or None where the two sides differ."""
    if isinstance(value, int):
        return value
    return value[0] if len(set(value)) == 1 else None


class StemMaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` (same parameters, no state) that goes through :data:`_max_pool2d_kept`
    where a compiled CPU step will differentiate it, so that the compiler calls aten's kernels
    instead of its own backward loop. Anywhere else (eager, XLA, CUDA, inference, an export) it
    is the plain module: x [B, C, H, W] -> [B, C, H', W'] either way."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        window = tuple(_square(v) for v in (self.kernel_size, self.stride, self.padding))
        plain = _square(self.dilation) == 1 and not self.ceil_mode and not self.return_indices
        # (kernel, stride, padding) where the kept op can take the pool's place, else None.
        self.kept_window = window if plain and None not in window else None

    @classmethod
    def like(cls, pool: nn.MaxPool2d) -> "StemMaxPool2d":
        return cls(pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.return_indices, pool.ceil_mode)

    def forward(self, x: Tensor) -> Tensor:
        window = self.kept_window
        if window and torch.compiler.is_compiling() and x.device.type == "cpu" and x.requires_grad:
            return _max_pool2d_kept(x, *window)[0]
        return super().forward(x)
