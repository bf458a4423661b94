"""Export rows: the model's forward replaced by a package built at the first call of each shape.

The first call for a (batch, height, width) exports the model (and, for ``aoti``, AOTInductor-compiles
it) into a temporary folder, so that call's time includes the build, as a user's first call would.
Only library entry points that every commit's ``mrcnn.export`` has are used (``build_packages``,
``load_exported``, ``tensor_ops_model``, ``FORMATS``), so the rows also run on older checkouts.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from mrcnn.export import FORMATS, build_packages, load_exported, tensor_ops_model
from mrcnn.structures import Detections, ImageBatch


class DeployOnFirstCall:
    """ImageBatch -> Detections through a package built at the first call for each canvas and batch size."""

    def __init__(self, model: nn.Module, fmt: str) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
        self.model, self.fmt = tensor_ops_model(model.eval()), fmt
        self._tmp = tempfile.TemporaryDirectory(prefix=f"mrcnn_{fmt}_")
        self.workdir = Path(self._tmp.name)
        self.packages: dict[tuple[int, int, int], Any] = {}
        self.build_info: dict[tuple[int, int, int], dict[str, Any]] = {}

    def counters(self) -> dict[str, float]:
        """Build seconds of the packages made so far, as ``build_packages`` reports its steps:
        export (+ save), AOTInductor, and their sum."""
        export_s = sum(i.get("export_s", 0.0) + i.get("save_s", 0.0) for i in self.build_info.values())
        aoti_s = sum(i.get("aoti_compile_s", 0.0) for i in self.build_info.values())
        return {"packages": len(self.build_info), "export_s": export_s, "aoti_compile_s": aoti_s,
                "compile_s": export_s + aoti_s}

    def __call__(self, batch: ImageBatch) -> Detections:
        b, _, h, w = batch.tensors.shape
        key = (int(b), int(h), int(w))
        if key not in self.packages:
            info = build_packages(self.model, self.workdir, (h, w), b, formats=(self.fmt,))
            self.packages[key] = load_exported(info["paths"][self.fmt])
            self.build_info[key] = info
        return self.packages[key].detect(batch)
