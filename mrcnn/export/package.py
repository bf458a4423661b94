"""Writing packages (``.exported.pt2``, ``.aoti.pt2``) and reading what a package file holds.

Each package carries its :class:`~mrcnn.export.core.ExportMeta`: in an exported program as an
extra file of ``torch.export.save``, in an AOTInductor package as ``aot_inductor.metadata``
(flat strings, which the C++ example reads too).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch._inductor import aoti_compile_and_package

from mrcnn.config import Canvas
from mrcnn.exits import UsageError
from mrcnn.export.checks import check_aoti_package
from mrcnn.export.core import FORMATS, META_FILE, META_KEY, ExportMeta, export_model, meta_for, tensor_ops_model
from mrcnn.export.trust import check_writable, trust


def save_exported(ep: torch.export.ExportedProgram, path: str | os.PathLike, meta: ExportMeta) -> Path:
    """``torch.export.save`` with ``meta`` stored inside the archive. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(ep, path, extra_files={META_FILE: dataclasses.replace(meta, format="exported").to_json()})
    return path


def compile_aoti(ep: torch.export.ExportedProgram, path: str | os.PathLike, meta: ExportMeta) -> Path:
    """AOTInductor-compile ``ep`` for the device its weights are on (CPU or CUDA) and package it, with its
    weights, at ``path``."""
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
    """Export ``model`` and write one package per format into ``out_dir``.

    Returns ``{"paths": {format: path}, "meta": ExportMeta as a dict}`` plus the seconds each
    build step took (``export_s``, ``save_s``, ``aoti_compile_s``), which ``mrcnn export`` reports.
    Each package written goes on this user's allow-list (:mod:`mrcnn.export.trust`).
    """
    unknown = set(formats) - set(FORMATS)
    if unknown or not formats:
        raise ValueError(f"formats must be a non-empty subset of {FORMATS}, got {list(formats)}")
    out_dir = Path(out_dir)
    check_writable()  # before the export, which takes a while
    model = tensor_ops_model(model.eval())
    stem = stem or f"{model.cfg.name}_{canvas[0]}x{canvas[1]}_b{batch_size}"
    t0 = time.perf_counter()
    ep = export_model(model, canvas, batch_size, strict=strict)
    info: dict[str, Any] = {"export_s": time.perf_counter() - t0, "paths": {}}
    log(f"exported in {info['export_s']:.1f} s")
    device = next(model.parameters()).device
    meta = meta_for(model, "exported", canvas, batch_size, device)
    info["meta"] = dataclasses.asdict(meta)
    if "exported" in formats:
        t0 = time.perf_counter()
        info["paths"]["exported"] = str(save_exported(ep, out_dir / f"{stem}.exported.pt2", meta))
        trust(info["paths"]["exported"])
        info["save_s"] = time.perf_counter() - t0
    if "aoti" in formats:
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"AOTInductor packages are built for the CPU or CUDA here; the model is on {device}")
        log("AOTInductor: compiling and packaging (minutes on 2 cores) ...")
        t0 = time.perf_counter()
        info["paths"]["aoti"] = str(compile_aoti(ep, out_dir / f"{stem}.aoti.pt2", meta))
        info["aoti_compile_s"] = time.perf_counter() - t0
        check_aoti_package(info["paths"]["aoti"])
        trust(info["paths"]["aoti"])
        log(f"AOTInductor package built in {info['aoti_compile_s']:.1f} s")
    return info


def _zip_names(path: Path) -> list[str]:
    if not path.is_file():
        raise UsageError(f"package not found: {path}")
    try:
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    except zipfile.BadZipFile as e:
        raise UsageError(f"{path} is not a .pt2 package (not a zip archive)") from e


def package_format(path: str | os.PathLike) -> str:
    """"exported" or "aoti", from the archive's layout; ValueError for anything else."""
    path = Path(path)
    names = _zip_names(path)
    if any("/data/aotinductor/" in n for n in names):
        return "aoti"
    if any(n.endswith(f"extra/{META_FILE}") or n.endswith(META_FILE) for n in names):
        return "exported"
    raise UsageError(f"{path} is not a package written by mrcnn export (no {META_FILE} and no AOTInductor model)")


def read_meta(path: str | os.PathLike) -> ExportMeta:
    """The :class:`ExportMeta` of a package, read from the archive without loading the model.

    An AOTInductor package keeps its ``aot_inductor.metadata`` in a ``*_metadata.json`` file next
    to the compiled model, as well as inside the shared library (where the loader reads it).
    """
    path = Path(path)
    fmt = package_format(path)
    with zipfile.ZipFile(path) as z:
        if fmt == "exported":
            name = next(n for n in z.namelist() if n.endswith(META_FILE))
            return ExportMeta.from_json(z.read(name).decode())
        for name in z.namelist():
            if "/data/aotinductor/" in name and name.endswith("_metadata.json"):
                try:
                    metadata = json.loads(z.read(name))
                except ValueError as e:
                    raise UsageError(f"{path}: {name} is not JSON ({e})") from None
                if META_KEY in metadata:
                    return ExportMeta.from_json(metadata[META_KEY])
    raise UsageError(f"{path}: AOTInductor package without {META_KEY} metadata")
