"""Choosing between the two implementations of each op.

Every op in :mod:`mrcnn.ops` comes twice, with identical fixed output shapes:

- ``"tensor"``: pure torch ops (sort, topk, gather, matmul, where). No ``.item()``, no
  ``nonzero``, no boolean indexing, no Python branch on tensor values. This is the form XLA can
  compile, because torchvision's kernels have no XLA lowering and would fall back to the CPU.
  Each is a real operator too, ``mrcnn::nms_fixed`` and ``mrcnn::multilevel_roi_align``
  (:func:`define_composite`), whose only kernel is ``CompositeImplicitAutograd``: calling it runs
  the pure-tensor code, and any tracer (FakeTensor, ``torch.compile``, ``torch.export``'s
  decomposition, AOTAutograd, XLA) sees it decompose into aten ops. Autograd comes from those aten
  ops, and the fake kernel is the same code run on fake tensors, so neither is registered apart.
- ``"torchvision"``: torchvision's C++/CUDA kernels inside a ``torch.library.custom_op``
  (namespace ``mrcnn``) whose fake kernel returns the fixed shapes, so
  ``torch.compile(fullgraph=True)`` sees through it while the real kernel may use dynamic shapes.
  On CPU and CUDA it is several times faster than the tensor form.

The custom ops are defined in this package's modules without ``from __future__ import
annotations``: ``torch.library.custom_op`` reads the schema from real annotation objects.

Deployment. A kernel written in Python, which both kinds of ``mrcnn::`` op have, cannot run in a
process without Python (an AOTInductor package loaded from C++). ``torch.export`` keeps a
composite op as one node (it preserves ``CompositeImplicitAutograd`` ops), so
:func:`mrcnn.export.export_model` decomposes the ops of :data:`COMPOSITE_OPS` into aten ops before
packaging; the ``*_tv`` ops have no such decomposition and are never packaged.
"""

from collections.abc import Callable

import torch

NAMESPACE = "mrcnn"
IMPLS = ("tensor", "torchvision")

# mrcnn ops whose only kernel is CompositeImplicitAutograd -> that kernel, usable as a decomposition.
COMPOSITE_OPS: dict[torch._ops.OpOverload, Callable] = {}


def define_composite(name: str, schema: str, fn: Callable) -> torch._ops.OpOverload:
    """Define ``mrcnn::<name>`` with ``schema`` (arguments and returns) and ``fn`` as its only kernel.

    ``fn`` is registered for ``CompositeImplicitAutograd``, so it serves every backend, autograd
    (through the ops it calls) and fake tensors alike; it must be made of torch ops only and must
    not return its inputs or views of them (the schema declares no aliasing). Returns the overload.
    """
    qualname = f"{NAMESPACE}::{name}"
    torch.library.define(qualname, schema, tags=(torch.Tag.pt2_compliant_tag,))
    torch.library.impl(qualname, "CompositeImplicitAutograd", fn)
    op = getattr(getattr(torch.ops, NAMESPACE), name).default
    COMPOSITE_OPS[op] = fn
    return op


def resolve_impl(impl: str, device: torch.device | str) -> str:
    """Map ``impl`` to ``"tensor"`` or ``"torchvision"`` for tensors living on ``device``.

    ``"auto"`` picks torchvision's kernels where they exist (cpu, cuda) and the pure-tensor form
    anywhere else (xla, mps, ...). Explicit values pass through; anything else raises ValueError.
    """
    if impl == "auto":
        return "torchvision" if torch.device(device).type in ("cpu", "cuda") else "tensor"
    if impl not in IMPLS:
        raise ValueError(f"impl must be 'auto', 'tensor' or 'torchvision', got {impl!r}")
    return impl
