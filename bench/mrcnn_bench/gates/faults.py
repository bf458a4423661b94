"""Deliberate training bugs that show the accuracy gate has teeth (tests and that demonstration only).

Each fault replaces one function that ``mrcnn.roi_heads`` calls while computing the box head's
training targets, from outside the model and only inside a ``with inject_fault(name):`` block,
the way a real bug would change it; inference and the RPN are untouched. No config field or
model code knows about them. Their effect on the gate: ``results/accuracy/teeth.md``.

``box_coder``
    the box head's regression targets are encoded with torchvision's RPN weights (1, 1, 1, 1)
    instead of ``cfg.bbox_reg_weights`` (10, 10, 5, 5), while inference still decodes with the
    right ones: the learned box refinement comes out 5-10 times too small.
``mask_shift``
    the mask targets are shifted by :data:`MASK_SHIFT_PIXELS` pixels right and down inside each
    RoI (zero-filled), i.e. mask targets misaligned with their RoIs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch

import mrcnn.roi_heads
from mrcnn_bench.base.errors import UsageError

MASK_SHIFT_PIXELS = 3
RPN_BOX_WEIGHTS = (1.0, 1.0, 1.0, 1.0)  # torchvision's RegionProposalNetwork box coder weights

Fn = Callable[..., torch.Tensor]


def _box_coder_fault(original: Fn) -> Fn:
    def encode_with_rpn_weights(targets: torch.Tensor, reference: torch.Tensor, weights: Any) -> torch.Tensor:
        return original(targets, reference, RPN_BOX_WEIGHTS)

    return encode_with_rpn_weights


def _mask_shift_fault(original: Fn) -> Fn:
    def shifted_mask_targets(*args: Any, **kwargs: Any) -> torch.Tensor:
        target = original(*args, **kwargs)  # [..., M, M]
        s = MASK_SHIFT_PIXELS
        shifted = torch.zeros_like(target)
        shifted[..., s:, s:] = target[..., :-s, :-s]
        return shifted

    return shifted_mask_targets


# fault name -> (function of mrcnn.roi_heads it replaces, factory: original -> replacement)
FAULTS: dict[str, tuple[str, Callable[[Fn], Fn]]] = {
    "box_coder": ("encode_boxes", _box_coder_fault),
    "mask_shift": ("mask_targets", _mask_shift_fault),
}


def check_fault(name: str | None) -> None:
    """ValueError unless ``name`` is None or one of :data:`FAULTS`."""
    if name is not None and name not in FAULTS:
        raise UsageError(f"unknown fault {name!r}; choose one of {sorted(FAULTS)}")


@contextlib.contextmanager
def inject_fault(name: str | None) -> Iterator[None]:
    """Patch ``mrcnn.roi_heads`` with fault ``name`` (module docstring) inside the block; None: no fault."""
    check_fault(name)
    if name is None:
        yield
        return
    attr, factory = FAULTS[name]
    with mock.patch.object(mrcnn.roi_heads, attr, factory(getattr(mrcnn.roi_heads, attr))):
        yield
