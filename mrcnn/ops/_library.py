"""Choosing between the two implementations of each op.

Every op in :mod:`mrcnn.ops` comes twice, with identical fixed output shapes:

- ``"tensor"``: pure torch ops (sort, topk, gather, matmul, where). No ``.item()``, no
  ``nonzero``, no boolean indexing, no Python branch on tensor values. This is the form XLA can
  compile, because torchvision's kernels have no XLA lowering and would fall back to the CPU.
- ``"torchvision"``: torchvision's C++/CUDA kernels inside a ``torch.library.custom_op``
  (namespace ``mrcnn``) whose fake kernel returns the fixed shapes, so
  ``torch.compile(fullgraph=True)`` sees through it while the real kernel may use dynamic shapes.
  On CPU and CUDA it is several times faster than the tensor form.

The custom ops are defined in this package's modules without ``from __future__ import
annotations``: ``torch.library.custom_op`` reads the schema from real annotation objects.
"""

import torch

NAMESPACE = "mrcnn"
IMPLS = ("tensor", "torchvision")


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
