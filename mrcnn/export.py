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
``torch.library.opcheck`` in ``tests/test_ops.py``.

Shapes are static: the canvas and batch size are baked into the graph, ``range_constraints`` is
empty and no guard reads a tensor value (no graph breaks: export would raise on one). A package
carries its metadata (preset, canvas, batch size, dtype, ops impl, the config) inside the zip, so
:func:`load_exported` and the C++ example check every input against it and raise an error naming
what the package expected, instead of failing deep inside a kernel (or, with AOTInductor, reading
memory out of bounds).

Entry points: :func:`export_model`, :func:`save_exported`, :func:`compile_aoti`, :func:`load_exported`
(-> :class:`DeployedModel`, callable like the model), :class:`DeployOnFirstCall` (a benchmark row
that exports at its first call), and ``mrcnn export`` (:func:`add_arguments`, :func:`run`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import time
import warnings
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mrcnn.config import Canvas, Config, get_config
from mrcnn.structures import Detections, ImageBatch

__all__ = [
    "DeployOnFirstCall",
    "DeployableMaskRCNN",
    "DeployedModel",
    "ExportMeta",
    "add_arguments",
    "aoti_extern_ops",
    "check_aoti_package",
    "check_exportable",
    "compile_aoti",
    "decompose_mrcnn_ops",
    "export_model",
    "load_exported",
    "read_ppm",
    "run",
    "save_exported",
    "tensor_ops_model",
    "write_ppm",
]

FORMATS = ("exported", "aoti")
_META_FILE = "mrcnn_export.json"  # inside an exported .pt2 (torch.export.save's extra_files)
_META_KEY = "mrcnn.meta"  # inside an AOTInductor package (aot_inductor.metadata, read by C++ too)
OUTPUT_NAMES = ("boxes", "scores", "labels", "masks", "valid")


# ------------------------------------------------------------------------------------------------
# The exported signature


class DeployableMaskRCNN(nn.Module):
    """Flat tensor signature for export: (images, image_sizes) -> the Detections fields as a tuple.

    images [B, 3, H, W] float32 normalised and zero-padded to the canvas (as ``to_image_batch``
    makes them), image_sizes [B, 2] int64 (height, width) of each resized image. Every slot is
    treated as a real image; a caller padding a batch ignores the padded slots' outputs. Returns
    boxes [B, K, 4] (canvas coordinates), scores [B, K], labels [B, K] int64, masks [B, K, M, M],
    valid [B, K] bool.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: Tensor, image_sizes: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        valid = torch.ones(images.shape[0], dtype=torch.bool, device=images.device)
        det = self.model(ImageBatch(images, image_sizes, image_sizes, valid))
        return det.boxes, det.scores, det.labels, det.masks, det.valid


def tensor_ops_model(model: nn.Module) -> nn.Module:
    """``model`` itself if it already uses the pure-tensor ops, else an eval copy that does."""
    from mrcnn.model import MaskRCNN

    if model.cfg.ops_impl == "tensor":
        return model
    clone = MaskRCNN(model.cfg.replace(ops_impl="tensor")).eval()
    clone.load_state_dict(model.state_dict())
    return clone.to(next(model.parameters()).device)


# ------------------------------------------------------------------------------------------------
# Metadata that travels inside each package


@dataclasses.dataclass(frozen=True)
class ExportMeta:
    """What a package was built for; every input is checked against it."""

    format: str  # "exported" | "aoti"
    preset: str
    canvas: tuple[int, int]  # (H, W)
    batch_size: int
    dtype: str  # of images, e.g. "float32"
    ops_impl: str
    device: str
    num_detections: int  # K
    mask_size: int  # M
    config: dict[str, Any]  # the full Config, to rebuild the host-side transform
    torch_version: str = torch.__version__

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ExportMeta:
        d = json.loads(text)
        d["canvas"] = tuple(d["canvas"])
        return cls(**d)

    @property
    def cfg(self) -> Config:
        """The Config the package was exported from (lists from JSON turned back into tuples)."""

        def tuples(x: Any) -> Any:
            return tuple(tuples(v) for v in x) if isinstance(x, list) else x

        return Config(**{k: tuples(v) for k, v in self.config.items()})

    def describe(self) -> str:
        h, w = self.canvas
        return (
            f"{self.format} package of preset {self.preset!r} for canvas {h}x{w} (HxW), batch size "
            f"{self.batch_size}, {self.dtype} images on {self.device}"
        )

    def aoti_metadata(self) -> dict[str, str]:
        """Flat string metadata for AOTInductor; the C++ example reads the ``mrcnn.*`` keys."""
        cfg = self.config
        return {
            _META_KEY: self.to_json(),
            "mrcnn.preset": self.preset,
            "mrcnn.canvas_height": str(self.canvas[0]),
            "mrcnn.canvas_width": str(self.canvas[1]),
            "mrcnn.batch_size": str(self.batch_size),
            "mrcnn.min_size": str(cfg["min_size"]),
            "mrcnn.max_size": str(cfg["max_size"]),
            "mrcnn.image_mean": ",".join(repr(float(v)) for v in cfg["image_mean"]),
            "mrcnn.image_std": ",".join(repr(float(v)) for v in cfg["image_std"]),
            "mrcnn.num_detections": str(self.num_detections),
        }



def _meta_for(model: nn.Module, fmt: str, canvas: Canvas, batch_size: int, device: torch.device) -> ExportMeta:
    cfg: Config = model.cfg
    return ExportMeta(
        format=fmt,
        preset=cfg.name,
        canvas=(int(canvas[0]), int(canvas[1])),
        batch_size=int(batch_size),
        dtype="float32",
        ops_impl=cfg.ops_impl,
        device=device.type,
        num_detections=cfg.box_detections_per_img,
        mask_size=cfg.mask_size,
        config=json.loads(json.dumps(dataclasses.asdict(cfg))),
    )


# ------------------------------------------------------------------------------------------------
# Export, save, compile


def example_inputs(canvas: Canvas, batch_size: int, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Placeholder inputs of the exported signature: zeros, every image filling the canvas."""
    h, w = canvas
    images = torch.zeros(batch_size, 3, h, w, device=device)
    sizes = torch.tensor([[h, w]] * batch_size, dtype=torch.int64, device=device)
    return images, sizes


def export_model(
    model: nn.Module, canvas: Canvas, batch_size: int = 1, strict: bool = False
) -> torch.export.ExportedProgram:
    """``torch.export`` of ``model`` (a :class:`~mrcnn.model.MaskRCNN`) for one canvas and batch size.

    The model is switched to the pure-tensor ops (see the module docstring) and to eval mode.
    ``strict=True`` traces with TorchDynamo, which fails on any graph break. Raises
    ``RuntimeError`` when the result is not fully static or holds ops C++ could not run
    (:func:`check_exportable`).
    """
    canvas = (int(canvas[0]), int(canvas[1]))
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    cfg: Config = model.cfg
    if any(s % cfg.size_divisible for s in canvas):
        raise ValueError(f"canvas {canvas} must be a multiple of size_divisible={cfg.size_divisible}")
    model = tensor_ops_model(model.eval())
    device = next(model.parameters()).device
    with torch.no_grad():
        ep = torch.export.export(DeployableMaskRCNN(model), example_inputs(canvas, batch_size, device), strict=strict)
        ep = decompose_mrcnn_ops(ep)
    check_exportable(ep)
    return ep


def decompose_mrcnn_ops(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Replace each ``mrcnn::nms_fixed`` / ``mrcnn::multilevel_roi_align`` node by the aten ops of its kernel.

    ``torch.export`` preserves ``CompositeImplicitAutograd`` ops as single nodes, and these two have
    only a Python kernel, which neither a C++ process nor a reloaded program without ``mrcnn``
    imported could run. No other op is decomposed (``linear``, ``conv2d`` stay), though the
    re-trace writes the graph in inference IR (functional: ``relu_`` becomes ``relu``, ``reshape``
    becomes ``view``); the outputs are bit-identical. Returns ``ep`` itself when it holds none of them.
    """
    from mrcnn.ops._library import COMPOSITE_OPS

    present = {n.target for n in ep.graph.nodes if n.op == "call_function"} & COMPOSITE_OPS.keys()
    if not present:
        return ep
    return ep.run_decompositions({op: COMPOSITE_OPS[op] for op in present})


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


def save_exported(ep: torch.export.ExportedProgram, path: str | os.PathLike, meta: ExportMeta) -> Path:
    """``torch.export.save`` with ``meta`` stored inside the archive. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(ep, path, extra_files={_META_FILE: dataclasses.replace(meta, format="exported").to_json()})
    return path


def compile_aoti(ep: torch.export.ExportedProgram, path: str | os.PathLike, meta: ExportMeta) -> Path:
    """AOTInductor-compile ``ep`` for the CPU and package it (with its weights) at ``path``."""
    from torch._inductor import aoti_compile_and_package

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = dataclasses.replace(meta, format="aoti")
    out = aoti_compile_and_package(
        ep, package_path=str(path), inductor_configs={"aot_inductor.metadata": meta.aoti_metadata()}
    )
    return Path(out)


def build_packages(
    model: nn.Module,
    out_dir: str | os.PathLike,
    canvas: Canvas,
    batch_size: int = 1,
    formats: Sequence[str] = FORMATS,
    stem: str | None = None,
    strict: bool = False,
    log: Callable[[str], None] = lambda _msg: None,
) -> dict[str, Any]:
    """Export ``model`` and write one package per format into ``out_dir``; returns paths and timings."""
    unknown = set(formats) - set(FORMATS)
    if unknown or not formats:
        raise ValueError(f"formats must be a non-empty subset of {FORMATS}, got {list(formats)}")
    out_dir = Path(out_dir)
    model = tensor_ops_model(model.eval())
    stem = stem or f"{model.cfg.name}_{canvas[0]}x{canvas[1]}_b{batch_size}"
    t0 = time.perf_counter()
    ep = export_model(model, canvas, batch_size, strict=strict)
    info: dict[str, Any] = {"export_s": time.perf_counter() - t0, "paths": {}}
    log(f"exported in {info['export_s']:.1f} s")
    device = next(model.parameters()).device
    meta = _meta_for(model, "exported", canvas, batch_size, device)
    info["meta"] = dataclasses.asdict(meta)
    if "exported" in formats:
        t0 = time.perf_counter()
        info["paths"]["exported"] = str(save_exported(ep, out_dir / f"{stem}.exported.pt2", meta))
        info["save_s"] = time.perf_counter() - t0
    if "aoti" in formats:
        if device.type != "cpu":
            raise ValueError(f"AOTInductor packages are built for the CPU here; the model is on {device}")
        log("AOTInductor: compiling and packaging (minutes on 2 cores) ...")
        t0 = time.perf_counter()
        info["paths"]["aoti"] = str(compile_aoti(ep, out_dir / f"{stem}.aoti.pt2", meta))
        info["aoti_compile_s"] = time.perf_counter() - t0
        check_aoti_package(info["paths"]["aoti"])
        log(f"AOTInductor package built in {info['aoti_compile_s']:.1f} s")
    return info


# ------------------------------------------------------------------------------------------------
# Loading and running, with input checks


def package_format(path: str | os.PathLike) -> str:
    """"exported" or "aoti", from the archive's layout; ValueError for anything else."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"package not found: {path}")
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except zipfile.BadZipFile as e:
        raise ValueError(f"{path} is not a .pt2 package (not a zip archive)") from e
    if any("/data/aotinductor/" in n for n in names):
        return "aoti"
    if any(n.endswith(f"extra/{_META_FILE}") or n.endswith(_META_FILE) for n in names):
        return "exported"
    raise ValueError(f"{path} is not a package written by mrcnn export (no {_META_FILE} and no AOTInductor model)")


class DeployedModel:
    """A loaded package, callable like the model on its one canvas and batch size.

    ``model(images, image_sizes)`` -> tuple (boxes, scores, labels, masks, valid);
    ``model.detect(batch)`` -> :class:`Detections`; ``model.predict(images)`` -> torchvision-style
    dicts, transform and post-processing included. Every call checks its inputs against
    :attr:`meta` and raises ``ValueError`` naming what the package expected.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.format = package_format(self.path)
        if self.format == "aoti":
            from torch._inductor import aoti_load_package

            self._runner = aoti_load_package(str(self.path))
            metadata = self._runner.get_metadata()
            if _META_KEY not in metadata:
                raise ValueError(f"{self.path}: AOTInductor package without {_META_KEY} metadata")
            self.meta = ExportMeta.from_json(metadata[_META_KEY])
        else:
            extra = {_META_FILE: ""}
            with warnings.catch_warnings():  # torch's own loader reads weights from a read-only buffer
                warnings.filterwarnings("ignore", message="The given buffer is not writable")
                ep = torch.export.load(self.path, extra_files=extra)
            self.meta = ExportMeta.from_json(extra[_META_FILE])
            self._runner = ep.module()
        self.cfg = self.meta.cfg

    def __repr__(self) -> str:
        return f"DeployedModel({str(self.path)!r}: {self.meta.describe()})"

    def check_inputs(self, images: object, image_sizes: object) -> None:
        """Raise ValueError unless the inputs match the package exactly."""
        meta = self.meta
        b, (h, w) = meta.batch_size, meta.canvas
        expected = (
            f"this {meta.describe()} expects images [{b}, 3, {h}, {w}] torch.{meta.dtype} and "
            f"image_sizes [{b}, 2] torch.int64"
        )
        if not isinstance(images, Tensor) or not isinstance(image_sizes, Tensor):
            raise ValueError(f"{expected}; got {type(images).__name__} and {type(image_sizes).__name__}")
        shape = tuple(images.shape)
        if images.dim() != 4 or shape[1] != 3:
            raise ValueError(f"{expected}; got images of shape {list(shape)}")
        if shape[2:] != (h, w):
            raise ValueError(
                f"wrong canvas size: {expected}; got images of canvas {shape[2]}x{shape[3]}. Pad the "
                f"images to {h}x{w} (to_image_batch with this canvas) or export a package for "
                f"--canvas {shape[2]}x{shape[3]}"
            )
        if shape[0] != b:
            raise ValueError(
                f"wrong batch size: {expected}; got a batch of {shape[0]}. Pad the batch to {b} "
                f"(to_image_batch(..., batch_size={b})) or export a package with --batch-size {shape[0]}"
            )
        if str(images.dtype) != f"torch.{meta.dtype}":
            raise ValueError(f"wrong dtype: {expected}; got images of dtype {images.dtype}")
        if images.device.type != meta.device:
            raise ValueError(f"wrong device: {expected}; got images on {images.device}")
        if tuple(image_sizes.shape) != (b, 2) or image_sizes.dtype != torch.int64:
            raise ValueError(f"{expected}; got image_sizes {list(image_sizes.shape)} {image_sizes.dtype}")
        sizes = image_sizes.cpu()
        if bool(((sizes < 1) | (sizes > torch.tensor([h, w]))).any()):
            raise ValueError(f"{expected}; image_sizes must lie in [1, {h}] x [1, {w}], got {sizes.tolist()}")

    def __call__(self, images: Tensor, image_sizes: Tensor) -> tuple[Tensor, ...]:
        self.check_inputs(images, image_sizes)
        with torch.no_grad():
            # AOTInductor's kernels assume the contiguous strides they were compiled for.
            out = self._runner(images.contiguous(), image_sizes.contiguous())
        return tuple(out)

    def detect(self, batch: ImageBatch) -> Detections:
        """The model's ``forward``: ImageBatch -> Detections (padded batch slots marked invalid)."""
        boxes, scores, labels, masks, valid = self(batch.tensors, batch.image_sizes)
        return Detections(boxes, scores, labels, masks, valid & batch.valid.to(valid.device)[:, None])

    def image_batch(self, images: list[Tensor]) -> ImageBatch:
        """to_image_batch on the package's canvas, padded to its batch size; ValueError if one does not fit."""
        from mrcnn.transform import resized_size, to_image_batch

        h, w = self.meta.canvas
        if isinstance(images, Tensor) or not images:
            raise ValueError("expected a non-empty list of [3, H, W] images")
        if len(images) > self.meta.batch_size:
            raise ValueError(f"{len(images)} images for a package of batch size {self.meta.batch_size}")
        for i, img in enumerate(images):
            if isinstance(img, Tensor) and img.dim() == 3:
                rh, rw = resized_size(img.shape[-2], img.shape[-1], self.cfg)
                if rh > h or rw > w:
                    raise ValueError(
                        f"image {i} ({img.shape[-2]}x{img.shape[-1]}) resizes to {rh}x{rw}, which does not fit "
                        f"this package's canvas {h}x{w} (HxW); export a package for a larger canvas"
                    )
        return to_image_batch(list(images), self.cfg.replace(canvases=((h, w),)), self.meta.batch_size)

    def predict(self, images: list[Tensor]) -> list[dict[str, Tensor]]:
        """torchvision-style inference on any number of images, ``batch_size`` at a time."""
        from mrcnn.postprocess import postprocess

        results: list[dict[str, Tensor]] = []
        b = self.meta.batch_size
        for start in range(0, len(images), b):
            batch = self.image_batch(images[start : start + b])
            results.extend(postprocess(self.detect(batch), batch))
        return results


def load_exported(path: str | os.PathLike) -> DeployedModel:
    """Load a package written by :func:`save_exported` or :func:`compile_aoti` (format detected)."""
    return DeployedModel(path)


class DeployOnFirstCall:
    """ImageBatch -> Detections through a package built at the first call for each canvas and batch size.

    For benchmark rows: the first call's time (time to first result) includes export, and for
    ``fmt="aoti"`` the AOTInductor compile. Packages go to ``workdir`` (a temporary one by default).
    """

    def __init__(self, model: nn.Module, fmt: str, workdir: str | os.PathLike | None = None) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
        self.model, self.fmt = tensor_ops_model(model.eval()), fmt
        if workdir is None:
            import tempfile

            self._tmp = tempfile.TemporaryDirectory(prefix=f"mrcnn_{fmt}_")
            workdir = self._tmp.name
        self.workdir = Path(workdir)
        self.packages: dict[tuple[int, int, int], DeployedModel] = {}
        self.build_info: dict[tuple[int, int, int], dict[str, Any]] = {}

    def counters(self) -> dict[str, float]:
        """Build seconds of the packages made so far: export (+ save), AOTInductor, and their sum."""
        export_s = sum(i["export_s"] + i.get("save_s", 0.0) for i in self.build_info.values())
        aoti_s = sum(i.get("aoti_compile_s", 0.0) for i in self.build_info.values())
        return {"packages": len(self.build_info), "export_s": export_s, "aoti_compile_s": aoti_s,
                "compile_s": export_s + aoti_s}

    def __call__(self, batch: ImageBatch) -> Detections:
        b, _, h, w = batch.tensors.shape
        key = (int(b), int(h), int(w))
        if key not in self.packages:
            info = build_packages(self.model, self.workdir, (h, w), b, formats=(self.fmt,))
            self.build_info[key] = info
            self.packages[key] = load_exported(info["paths"][self.fmt])
        return self.packages[key].detect(batch)


# ------------------------------------------------------------------------------------------------
# Images for the C++ example: binary PPM (P6), no image library needed on either side


def write_ppm(path: str | os.PathLike, image: Tensor) -> Path:
    """Write [3, h, w] uint8 (or float in [0, 1], rounded) as a binary PPM (P6, maxval 255)."""
    if image.dim() != 3 or image.shape[0] != 3:
        raise ValueError(f"expected a [3, H, W] image, got {list(image.shape)}")
    if image.dtype != torch.uint8:
        image = (image.float().clamp(0, 1) * 255.0).round().to(torch.uint8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    h, w = image.shape[1:]
    path.write_bytes(f"P6\n{w} {h}\n255\n".encode() + image.permute(1, 2, 0).contiguous().numpy().tobytes())
    return path


def read_ppm(path: str | os.PathLike) -> Tensor:
    """Read a binary PPM (P6, maxval 255) as [3, h, w] uint8."""
    data = Path(path).read_bytes()
    fields: list[bytes] = []
    pos = 0
    while len(fields) < 4:  # magic, width, height, maxval; '#' comments run to the end of the line
        while pos < len(data) and data[pos : pos + 1].isspace():
            pos += 1
        if data[pos : pos + 1] == b"#":
            pos = data.index(b"\n", pos) + 1
            continue
        end = pos
        while end < len(data) and not data[end : end + 1].isspace():
            end += 1
        fields.append(data[pos:end])
        pos = end
    if fields[0] != b"P6" or int(fields[3]) != 255:
        raise ValueError(f"{path}: expected a binary PPM (P6) with maxval 255, got {fields[0]!r} maxval {fields[3]!r}")
    w, h = int(fields[1]), int(fields[2])
    pixels = data[pos + 1 : pos + 1 + 3 * w * h]
    if len(pixels) != 3 * w * h:
        raise ValueError(f"{path}: truncated PPM ({len(pixels)} of {3 * w * h} pixel bytes)")
    return torch.frombuffer(bytearray(pixels), dtype=torch.uint8).view(h, w, 3).permute(2, 0, 1).contiguous()


# ------------------------------------------------------------------------------------------------
# Comparison and timing (``mrcnn export --check``)


def max_abs_diff(a: Sequence[Tensor], b: Sequence[Tensor]) -> dict[str, float]:
    """Per output field, the largest absolute difference (bool/int fields as 0/1 or label steps)."""
    return {n: float((x.double() - y.double()).abs().max()) if x.numel() else 0.0
            for n, x, y in zip(OUTPUT_NAMES, a, b)}


def match_outputs(
    expected: Sequence[Tensor], actual: Sequence[Tensor], iou_min: float = 0.99, score_tol: float = 1e-3
) -> dict[str, float]:
    """Order-insensitive agreement of two output tuples (boxes, scores, labels, masks, valid).

    Compiled kernels round differently from eager ones, so two detections with nearly equal scores
    may swap ranks, and an element-wise comparison would then report a box or label difference.
    Here valid detections are paired instead (same label, box IoU >= ``iou_min``, scores within
    ``score_tol``; :func:`mrcnn.parity.match_detections`), and their masks compared by IoU at 0.5.
    Returns matched (fraction of the larger set), counts, and the smallest mask IoU of a pair.
    """
    from mrcnn.parity import match_detections

    matched = n_expected = n_actual = 0
    min_mask_iou = 1.0
    fields = ((0, "boxes"), (1, "scores"), (2, "labels"), (3, "masks"))
    for i in range(expected[0].shape[0]):
        ref, other = ({name: out[k][i].cpu()[out[4][i].cpu()] for k, name in fields} for out in (expected, actual))
        parity = match_detections(ref, other, iou_min=iou_min, score_tol=score_tol)
        matched += parity.matched
        n_expected += parity.num_ref
        n_actual += parity.num_other
        min_mask_iou = min(min_mask_iou, parity.min_mask_iou)
    most = max(n_expected, n_actual)
    return {"matched": matched / most if most else 1.0, "expected": n_expected, "actual": n_actual,
            "min_mask_iou": min_mask_iou}


def _time_interleaved(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, dict[str, float]]:
    """Round-robin timing (order rotated each round) -> per function, median and IQR of wall seconds.

    Also the fastest call and the median process CPU seconds per call (all threads), which a busy
    shared machine disturbs less than the median wall time.
    """
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(max(1, rounds)):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            c0, t0 = time.process_time(), time.perf_counter()
            fns[n]()
            times[n].append(time.perf_counter() - t0)
            cpu[n].append(time.process_time() - c0)
    out = {}
    for n, ts in times.items():
        q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
        out[n] = {"median_s": statistics.median(ts), "iqr_s": q[2] - q[0], "min_s": min(ts),
                  "cpu_s": statistics.median(cpu[n]), "rounds": len(ts)}
    return out


def check_and_time(model: nn.Module, paths: dict[str, str], images: list[Tensor], rounds: int) -> dict[str, Any]:
    """Outputs of each package against eager (pure-tensor ops) on ``images``, then latency per row.

    Time to first result of a package = load + first call in this (warm) process.
    """
    from mrcnn.transform import to_image_batch

    tensor_model = tensor_ops_model(model.eval())
    report: dict[str, Any] = {"first_result_s": {}, "load_s": {}, "max_abs_diff": {}, "valid_equal": {}, "matched": {}}
    loaded: dict[str, DeployedModel] = {}
    for fmt, path in paths.items():
        t0 = time.perf_counter()
        loaded[fmt] = load_exported(path)
        report["load_s"][fmt] = time.perf_counter() - t0
        batch = loaded[fmt].image_batch(images[: loaded[fmt].meta.batch_size])
        loaded[fmt](batch.tensors, batch.image_sizes)
        report["first_result_s"][fmt] = time.perf_counter() - t0
    meta = next(iter(loaded.values())).meta
    batch = next(iter(loaded.values())).image_batch(images[: meta.batch_size])
    args = (batch.tensors, batch.image_sizes)
    wrapper = DeployableMaskRCNN(tensor_model)
    with torch.no_grad():
        eager = wrapper(*args)
        for fmt, dm in loaded.items():
            out = dm(*args)
            report["max_abs_diff"][fmt] = max_abs_diff(eager, out)
            report["valid_equal"][fmt] = bool(torch.equal(eager[4], out[4]))
            report["matched"][fmt] = match_outputs(eager, out)
        report["num_valid"] = int(eager[4].sum())
        rows: dict[str, Callable[[], Any]] = {"eager (ops_impl=tensor)": lambda: wrapper(*args)}
        if model.cfg.ops_impl != "tensor":
            model_batch = to_image_batch(images[: meta.batch_size], model.cfg.replace(canvases=(meta.canvas,)),
                                         meta.batch_size)
            rows[f"eager (ops_impl={model.cfg.ops_impl})"] = lambda: model(model_batch)
        for fmt, dm in loaded.items():
            rows[fmt] = lambda dm=dm: dm(*args)
        for fn in rows.values():  # one warm-up each
            fn()
        report["latency"] = _time_interleaved(rows, rounds)
    return report


# ------------------------------------------------------------------------------------------------
# Command line: mrcnn export


def _parse_canvas(text: str) -> Canvas:
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError as e:
        raise ValueError(f"--canvas must look like HxW (e.g. 320x448), got {text!r}") from e
    return h, w


def default_canvas(cfg: Config) -> Canvas:
    """The bucket of a 480x640 (3:4 landscape) photo: (320, 448) for tiny, (800, 1088) for coco_r50_fpn."""
    from mrcnn.transform import resized_size, select_canvas

    return select_canvas([resized_size(480, 640, cfg)], cfg)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``mrcnn export`` (also ``python -m mrcnn.export``)."""
    parser.add_argument("--preset", default="tiny", help="config preset (default: tiny)")
    parser.add_argument("--weights", default=None,
                        help="torchvision Mask R-CNN state_dict (default: synthetic weights from --seed)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic weights and sample image")
    parser.add_argument("--canvas", default=None, metavar="HxW",
                        help="canvas bucket to export for (default: that of a 480x640 image, 320x448 for tiny)")
    parser.add_argument("--batch-size", type=int, default=1, help="static batch size (default: 1)")
    parser.add_argument("--format", default="exported,aoti",
                        help="comma list of: exported (torch.export .pt2), aoti (AOTInductor CPU package); "
                             "default: both")
    parser.add_argument("--out", default="out/export", metavar="DIR",
                        help="directory for the packages, export.json and sample.ppm (default: out/export)")
    parser.add_argument("--strict", action="store_true", help="torch.export in strict mode (TorchDynamo)")
    parser.add_argument("--sample-image", default=None, metavar="HxW",
                        help="also write DIR/sample.ppm, a generated image of this size (for cpp/)")
    parser.add_argument("--check", action="store_true",
                        help="load each package, compare with eager and time eager vs packages")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds for --check (default: 10)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: usable cores)")


def run(args: argparse.Namespace) -> int:
    from mrcnn.model import MaskRCNN
    from mrcnn.weights import load_torchvision_weights, synthetic_weights, textured_images

    def log(msg: str) -> None:
        print(f"[export] {msg}", flush=True)

    try:
        cfg = get_config(args.preset)
        canvas = _parse_canvas(args.canvas) if args.canvas else default_canvas(cfg)
        formats = [f.strip() for f in args.format.split(",") if f.strip()]
        if not formats or set(formats) - set(FORMATS):
            raise ValueError(f"--format must be a comma list of {FORMATS}, got {args.format!r}")
        sample = _parse_canvas(args.sample_image) if args.sample_image else None
    except ValueError as e:
        print(f"mrcnn export: error: {e}")
        return 2
    threads = args.threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    torch.set_num_threads(max(1, int(threads or 1)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    if args.weights:
        weights: Any = args.weights
        log(f"weights: {args.weights}")
    else:
        log(f"weights: synthetic (seed {args.seed}) ...")
        weights = synthetic_weights(cfg, seed=args.seed)
    model = load_torchvision_weights(MaskRCNN(cfg).eval(), weights)
    log(f"model ready in {time.perf_counter() - t0:.1f} s; exporting {cfg.name} for canvas {canvas[0]}x{canvas[1]}, "
        f"batch size {args.batch_size}")
    try:
        info = build_packages(model, out, canvas, args.batch_size, formats, strict=args.strict, log=log)
    except ValueError as e:
        print(f"mrcnn export: error: {e}")
        return 2
    info.update(threads=torch.get_num_threads(), strict=args.strict, torch=torch.__version__)
    for fmt, path in info["paths"].items():
        log(f"{fmt}: {path} ({os.path.getsize(path) / 2**20:.1f} MiB)")

    if sample is not None:
        image = textured_images((sample,), seed=args.seed)[0]
        info["sample_image"] = str(write_ppm(out / "sample.ppm", image))
        log(f"sample image: {info['sample_image']}")
    if args.check:
        images = [read_ppm(info["sample_image"])] if sample is not None else textured_images(
            ((canvas[0] * 3 // 4, canvas[0]),), seed=args.seed)
        images = (images * args.batch_size)[: args.batch_size]
        report = check_and_time(model, info["paths"], images, args.rounds)
        info["check"] = report
        log(f"valid detections (eager): {report['num_valid']}")
        for fmt, diff in report["max_abs_diff"].items():
            m = report["matched"][fmt]
            log(f"{fmt} vs eager: {m['matched']:.1%} of detections paired (label, box IoU >= 0.99, score +-1e-3), "
                f"min mask IoU {m['min_mask_iou']:.3f}; element-wise max |diff| (rank swaps of near-equal "
                "scores show up here): " + ", ".join(f"{k} {v:.2e}" for k, v in diff.items()))
        for fmt, s in report["first_result_s"].items():
            log(f"time to first result ({fmt}: load + first call): {s:.2f} s (load {report['load_s'][fmt]:.2f} s)")
        for name, t in report["latency"].items():
            log(f"latency {name}: median {t['median_s'] * 1e3:.0f} ms (IQR {t['iqr_s'] * 1e3:.0f} ms, min "
                f"{t['min_s'] * 1e3:.0f} ms, {t['rounds']} rounds; CPU time {t['cpu_s'] * 1e3:.0f} ms)")
    (out / "export.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    log(f"wrote {out / 'export.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mrcnn export", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
