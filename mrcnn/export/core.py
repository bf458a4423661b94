"""The exported signature, the metadata each package carries, and ``torch.export`` of the model.

The model is exported in its pure-tensor form (``ops_impl="tensor"``): its NMS and RoIAlign are
then the composite ``mrcnn::`` ops, which :func:`decompose_mrcnn_ops` turns into aten ops, so the
program holds nothing a C++ process could not run (:func:`mrcnn.export.checks.check_exportable`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch
from torch import Tensor, nn

from mrcnn.config import Canvas, Config
from mrcnn.exits import UsageError
from mrcnn.export.checks import check_exportable
from mrcnn.model import MaskRCNN
from mrcnn.ops._library import COMPOSITE_OPS
from mrcnn.structures import ImageBatch

FORMATS = ("exported", "aoti")
META_FILE = "mrcnn_export.json"  # inside an exported .pt2 (torch.export.save's extra_files)
META_KEY = "mrcnn.meta"  # inside an AOTInductor package (aot_inductor.metadata, read by C++ too)
OUTPUT_NAMES = ("boxes", "scores", "labels", "masks", "valid")


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
    if model.cfg.ops_impl == "tensor":
        return model
    clone = MaskRCNN(model.cfg.replace(ops_impl="tensor")).eval()
    clone.load_state_dict(model.state_dict())
    return clone.to(next(model.parameters()).device)


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
        """The metadata of a package; UsageError when ``text`` is not what :meth:`to_json` wrote."""
        try:
            d = json.loads(text)
            d["canvas"] = tuple(d["canvas"])
            return cls(**d)
        except (ValueError, KeyError, TypeError) as e:  # a package that mrcnn export did not write
            raise UsageError(f"not the metadata of an mrcnn export package ({type(e).__name__}: {e})") from None

    @property
    def cfg(self) -> Config:
        """The Config the package was exported from (lists from JSON turned back into tuples).

        Keys that are not ``Config`` fields are dropped, so a package written when ``Config`` had
        more fields still loads. Nothing is lost that the caller could use: the graph is inside the
        package, and this Config only rebuilds the host-side transform, which reads Config fields.
        """

        def tuples(x: Any) -> Any:
            return tuple(tuples(v) for v in x) if isinstance(x, list) else x

        fields = {f.name for f in dataclasses.fields(Config)}
        return Config(**{k: tuples(v) for k, v in self.config.items() if k in fields})

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
            META_KEY: self.to_json(),
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


def meta_for(model: nn.Module, fmt: str, canvas: Canvas, batch_size: int, device: torch.device) -> ExportMeta:
    """The metadata of a package of ``model`` (its Config as a JSON-ready dict) in format ``fmt``."""
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


def example_inputs(canvas: Canvas, batch_size: int, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Placeholder inputs of the exported signature: zeros, every image filling the canvas.

    Returns images [B, 3, H, W] float32 and image_sizes [B, 2] int64, all equal to (H, W).
    """
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
    (:func:`~mrcnn.export.checks.check_exportable`).
    """
    canvas = (int(canvas[0]), int(canvas[1]))
    if batch_size < 1:
        raise UsageError(f"batch_size must be >= 1, got {batch_size}")
    cfg: Config = model.cfg
    if any(s % cfg.size_divisible for s in canvas):
        raise UsageError(f"canvas {canvas} must be a multiple of size_divisible={cfg.size_divisible}")
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
    present = {n.target for n in ep.graph.nodes if n.op == "call_function"} & COMPOSITE_OPS.keys()
    if not present:
        return ep
    return ep.run_decompositions({op: COMPOSITE_OPS[op] for op in present})
