"""Checks that an exported program or an AOTInductor package needs nothing but libtorch's C++ kernels.

An AOTInductor package loaded from C++ can only call ops whose kernels are registered in C++; a
kernel written in Python (every ``mrcnn::`` op, ``prims::`` ops, an aten op overridden from Python)
is not, and ``torchvision::`` ops are not in libtorch. :func:`check_exportable` rejects such ops
in an exported program, :func:`check_aoti_package` in the ops a built package calls by name.
"""

from __future__ import annotations

import json
import os
import re
import zipfile

import torch
from torch import Tensor

# "<key>[alias] (inactive): registered at <file>:<line> :: ..." lines of torch._C._dispatch_dump.
_REGISTRATION = re.compile(r"^(\w+)(?:\[alias\])?(?: \(inactive\))?: registered at (\S+):\d+ ::", re.MULTILINE)
# Dispatch keys whose kernel serves a plain CPU call in a process without Python.
_CPU_KERNEL_KEYS = frozenset(
    {"CPU", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional", "CompositeImplicitAutograd"}
)


def has_cpp_cpu_kernel(op_name: str) -> bool:
    """Whether the dispatcher holds a CPU-capable kernel of ``op_name`` ("ns::name") registered from C++.

    Kernels registered with ``torch.library`` from Python (``custom_op``, ``Library.impl``, and the
    ``prims::`` ops) are recorded with the ``.py`` file that registered them; such an op has no
    kernel in a C++ process.
    """
    try:
        dump = torch._C._dispatch_dump(op_name)
    except RuntimeError:  # not registered at all
        return False
    return any(key in _CPU_KERNEL_KEYS and not where.endswith(".py") for key, where in _REGISTRATION.findall(dump))


def _c_plus_plus_problem(op_name: str) -> str | None:
    """Why a C++ process linking only libtorch could not call ``op_name``, or None if it can."""
    cpp = has_cpp_cpu_kernel(op_name)
    if op_name.split("::", 1)[0] != "aten":
        where = "its C++ kernels are in another library" if cpp else "its kernels are written in Python"
        return f"{op_name}, not an aten op ({where})"
    return None if cpp else f"{op_name}, which has no C++ kernel for the CPU (only Python ones)"


def check_exportable(ep: torch.export.ExportedProgram) -> None:
    """Raise RuntimeError unless ``ep`` is static and made of aten ops with C++ kernels only.

    Static: no symbolic sizes (``range_constraints`` empty, every input and output size an int),
    hence no guard that could depend on the data. aten only: no ``mrcnn::`` op (all have Python
    kernels only: the ``*_tv`` ops, and the composite ones left undecomposed), no ``torchvision::``
    op (not in libtorch) and no op whose CPU kernels were all registered from Python (``prims::``,
    or an aten op someone overrode from Python), none of which a C++ process could run.
    """
    problems = []
    if ep.range_constraints:
        problems.append(f"symbolic sizes with range constraints {dict(ep.range_constraints)}")
    for node in ep.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, Tensor) and not all(isinstance(s, int) for s in val.shape):
            problems.append(f"node {node.name} has a symbolic shape {tuple(val.shape)}")
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            problem = _c_plus_plus_problem(node.target.name())
            if problem:
                problems.append(f"node {node.name} calls {problem}")
    if problems:
        raise RuntimeError("exported program is not static and aten-only: " + "; ".join(problems[:10]))


def aoti_extern_ops(path: str | os.PathLike) -> list[str]:
    """Ops that an AOTInductor package calls by name at run time, e.g. ``["mrcnn::nms_fixed_tv"]``.

    AOTInductor compiles most of a graph into the package and calls some aten kernels through its C
    shim (``aoti_torch_cpu_*``, linked against libtorch). Any other op becomes an extern node:
    listed in the model's ``<hash>.json`` (next to its ``.wrapper.cpp``) and called through the
    proxy executor, which looks the op up in the dispatcher of the process running the package.
    Raises ValueError for a package whose wrapper calls the proxy executor but lists no extern node.
    """
    ops: list[str] = []
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if "/data/aotinductor/" in n]
        wrappers = [n for n in names if n.endswith(".cpp")]
        proxy_calls = sum(z.read(n).decode(errors="replace").count("aoti_torch_proxy_executor_call_function(")
                          for n in wrappers)
        for name in names:
            if name.endswith(".json") and not name.endswith("_metadata.json"):
                ops += [entry["node"]["target"] for entry in json.loads(z.read(name)).get("nodes", [])]
    if proxy_calls and not ops:
        raise ValueError(f"{path}: the wrapper makes {proxy_calls} proxy-executor calls but no extern node is listed")
    return ops


def check_aoti_package(path: str | os.PathLike) -> None:
    """Raise RuntimeError unless every op the package calls by name has a C++ kernel in libtorch.

    The C++ example links libtorch only: an extern node naming an ``mrcnn::`` op (Python kernels),
    a ``torchvision::`` op or any op without a C++ CPU kernel would fail there at run time.
    """
    problems = [p for op in aoti_extern_ops(path) if (p := _c_plus_plus_problem(op))]
    if problems:
        raise RuntimeError(f"{path}: AOTInductor package calls ops C++ could not run: " + "; ".join(problems[:10]))
