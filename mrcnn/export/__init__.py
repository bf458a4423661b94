"""Python-free deployment: ``torch.export`` and AOTInductor packages of the static model.

One package serves one canvas bucket and one batch size, the same unit XLA compiles once::

    MaskRCNN (ops_impl="tensor") -> DeployableMaskRCNN(images [B, 3, H, W] f32, image_sizes [B, 2] i64)
        -> torch.export.export            -> ExportedProgram, saved as <stem>.exported.pt2
        -> aoti_compile_and_package (CPU)  -> <stem>.aoti.pt2: a shared library + weights in one zip,
                                              loadable from C++ (cpp/) with no Python at all

Why the pure-tensor ops. The model's NMS and multi-level RoIAlign come in two forms
(:mod:`mrcnn.ops`), each a ``torch.library`` operator: ``"torchvision"`` is
``mrcnn::nms_fixed_tv`` / ``mrcnn::multilevel_roi_align_tv``, torchvision's C++ kernels called from
a kernel written in Python behind a fake kernel; ``"tensor"`` is ``mrcnn::nms_fixed`` /
``mrcnn::multilevel_roi_align``, whose only kernel is ``CompositeImplicitAutograd``: the
pure-tensor code, which decomposes into aten ops. An AOTInductor package loaded from C++ can only
call ops whose kernels are registered in C++, and a Python kernel is not. So packages are built
from the ``"tensor"`` form. ``torch.export`` keeps each composite op as one node, so
:func:`export_model` then decomposes exactly those ops (:func:`decompose_mrcnn_ops`) into aten ops,
which AOTInductor compiles into the package (``embedding_bag``, ``topk``, ``sort`` run as libtorch's
own kernels). The exported graph therefore holds no ``mrcnn::`` or ``torchvision::`` op, nor any op
without a C++ kernel, which :func:`check_exportable` asserts; :func:`check_aoti_package` asserts
the same of the ops a built package calls by name. All four ops are checked with
``torch.library.opcheck`` in ``tests/mrcnn/test_ops_*.py``.

Shapes are static: the canvas and batch size are baked into the graph, ``range_constraints`` is
empty and no guard reads a tensor value (no graph breaks: export would raise on one). A package
carries its metadata (preset, canvas, batch size, dtype, ops impl, the config) inside the zip, so
:func:`load_exported` and the C++ example check every input against it and raise an error naming
what the package expected, instead of failing deep inside a kernel (or, with AOTInductor, reading
memory out of bounds).

Modules: :mod:`~mrcnn.export.core` (signature, metadata, export), :mod:`~mrcnn.export.checks`
(C++-only ops), :mod:`~mrcnn.export.package` (writing and reading package files),
:mod:`~mrcnn.export.deployed` (:func:`load_exported` -> :class:`DeployedModel`, callable like the
model), :mod:`~mrcnn.export.trust` (packages are code: only those this user built load, unless
trusted), :mod:`~mrcnn.export.compare` (outputs against eager), :mod:`~mrcnn.export.ppm` (images for the
C++ example) and :mod:`~mrcnn.export.cli` (``mrcnn export``).
"""

from mrcnn.export.checks import aoti_extern_ops, check_aoti_package, check_exportable, has_cpp_cpu_kernel
from mrcnn.export.compare import check_outputs, match_outputs, max_abs_diff
from mrcnn.export.core import (
    FORMATS,
    OUTPUT_NAMES,
    DeployableMaskRCNN,
    ExportMeta,
    decompose_mrcnn_ops,
    example_inputs,
    export_model,
    tensor_ops_model,
)
from mrcnn.export.deployed import DeployedModel, load_exported
from mrcnn.export.package import build_packages, compile_aoti, package_format, read_meta, save_exported
from mrcnn.export.ppm import read_ppm, write_ppm
from mrcnn.export.trust import UntrustedPackageError

__all__ = [
    "FORMATS",
    "OUTPUT_NAMES",
    "DeployableMaskRCNN",
    "DeployedModel",
    "ExportMeta",
    "UntrustedPackageError",
    "aoti_extern_ops",
    "build_packages",
    "check_aoti_package",
    "check_exportable",
    "check_outputs",
    "compile_aoti",
    "decompose_mrcnn_ops",
    "example_inputs",
    "export_model",
    "has_cpp_cpu_kernel",
    "load_exported",
    "match_outputs",
    "max_abs_diff",
    "package_format",
    "read_meta",
    "read_ppm",
    "save_exported",
    "tensor_ops_model",
    "write_ppm",
]
