"""Inductor with freezing, for inference with fixed weights: an explicit opt-in, never a default.

Freezing makes the weights constants of the compiled graphs: inductor folds batch norm into the
convolutions, precomputes what depends on weights only, and prepacks the weights for oneDNN and
MKL. The price is that the graphs keep the weights they were compiled with, so a later
``load_state_dict`` or optimizer step would be ignored silently. :class:`FrozenInference` refuses
to run after such a change instead (it watches the parameters' and buffers' version counters).

Two details of torch 2.9 shape it. The option must be set while dynamo traces (dynamo turns the
parameters into constants then), so it is patched in around every call rather than passed to
``torch.compile``. And dynamo keeps compiled graphs per code object: two models of one class, one
compiled with freezing and one without, would share graphs, and one would run the other's (with
the other's weights baked in). Each :class:`FrozenInference` therefore compiles a forward with a
code object of its own.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
import torch._inductor.config
from torch import nn


def own_forward(model: nn.Module) -> Callable[..., Any]:
    """``model.forward`` bound to ``model``, with an equal but distinct code object: compiled, it
    gets graphs of its own, never shared with another compile of the model's class."""
    fn = type(model).forward
    code = fn.__code__.replace()
    own = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    return types.MethodType(own, model)


class FrozenInference:
    """``model`` compiled by inductor with freezing, for inference: call it as the model.

    For :class:`mrcnn.model.MaskRCNN`: ``FrozenInference(model)(batch)`` with an
    :class:`~mrcnn.structures.ImageBatch` [B, 3, H, W] on a canvas returns the same
    :class:`~mrcnn.structures.Detections` as ``model(batch)``, up to float rounding (batch norm
    folded into the convolutions sums in another order). One graph per canvas, as with
    ``torch.compile(model, fullgraph=True, dynamic=False)``, the default options here; pass
    ``fullgraph=False`` for models with graph breaks (torchvision's).

    The model is put in eval mode and every call runs under ``torch.no_grad()``. If any parameter
    or buffer changes in place after the first call (``load_state_dict``, an optimizer step), the
    next call raises ``RuntimeError``: build a new ``FrozenInference`` for new weights.
    """

    def __init__(self, model: nn.Module, **compile_options: Any) -> None:
        self.model = model.eval()
        options = {"fullgraph": True, "dynamic": False, **compile_options}
        self._compiled = torch.compile(own_forward(model), **options)
        self._versions: tuple[int, ...] | None = None

    def _weight_versions(self) -> tuple[int, ...]:
        # Every in-place write to a tensor (copy_ in load_state_dict, an optimizer's update) bumps it.
        return tuple(t._version for t in (*self.model.parameters(), *self.model.buffers()))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        versions = self._weight_versions()
        if self._versions is None:
            self._versions = versions
        elif versions != self._versions:
            raise RuntimeError(
                "the model's weights changed after they were frozen into its compiled graphs "
                "(load_state_dict or another in-place update): build a new FrozenInference for them"
            )
        with torch.no_grad(), torch._inductor.config.patch(freezing=True):
            return self._compiled(*args, **kwargs)
