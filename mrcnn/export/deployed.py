"""Loading a package and running it like the model, with every input checked against its metadata.

The compiled graph trusts its inputs (with AOTInductor a wrong shape reads memory out of bounds),
so :class:`DeployedModel` checks each call and raises an error naming what the package expected.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch import Tensor
from torch._inductor import aoti_load_package

from mrcnn.exits import UsageError
from mrcnn.export.core import META_FILE, META_KEY, ExportMeta
from mrcnn.export.package import package_format
from mrcnn.export.trust import trusted_copy
from mrcnn.postprocess import postprocess
from mrcnn.structures import Detections, ImageBatch
from mrcnn.transform import resized_size, to_image_batch


class DeployedModel:
    """A loaded package, callable like the model on its one canvas and batch size.

    ``model(images, image_sizes)`` -> tuple (boxes, scores, labels, masks, valid);
    ``model.detect(batch)`` -> :class:`Detections`; ``model.predict(images)`` -> torchvision-style
    dicts, transform and post-processing included. Every call checks its inputs against
    :attr:`meta` and raises ``ValueError`` naming what the package expected.
    """

    def __init__(self, path: str | os.PathLike, trust: bool = False) -> None:
        self.path = Path(path)
        self.format = package_format(self.path)  # reads the archive's file names only; errors name the file
        # The loaders open a private copy whose bytes were the ones checked, before any of them runs code.
        with trusted_copy(self.path, trust) as private:
            if package_format(private) != self.format:
                raise UsageError(f"{self.path} changed while it was being loaded: load it again")
            if self.format == "aoti":
                self._runner = aoti_load_package(str(private))
                metadata = self._runner.get_metadata()
                if META_KEY not in metadata:
                    raise UsageError(f"{self.path}: AOTInductor package without {META_KEY} metadata")
                self.meta = ExportMeta.from_json(metadata[META_KEY])
            else:
                extra = {META_FILE: ""}
                with warnings.catch_warnings():  # torch's own loader reads weights from a read-only buffer
                    warnings.filterwarnings("ignore", message="The given buffer is not writable")
                    ep = torch.export.load(private, extra_files=extra)
                self.meta = ExportMeta.from_json(extra[META_FILE])
                self._runner = ep.module()
        self.cfg = self.meta.cfg

    def __repr__(self) -> str:
        return f"DeployedModel({str(self.path)!r}: {self.meta.describe()})"

    def check_inputs(self, images: object, image_sizes: object) -> None:
        """Raise ValueError unless images [B, 3, H, W] and image_sizes [B, 2] match the package exactly."""
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
        """images [B, 3, H, W], image_sizes [B, 2] -> (boxes, scores, labels, masks, valid), as exported."""
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
        """to_image_batch on the package's canvas, padded to its batch size, on its device; ValueError if one
        does not fit."""
        h, w = self.meta.canvas
        if isinstance(images, Tensor) or not images:
            raise ValueError("expected a non-empty list of [3, H, W] images")
        if len(images) > self.meta.batch_size:
            raise ValueError(f"{len(images)} images for a package of batch size {self.meta.batch_size}")
        for i, img in enumerate(images):
            if isinstance(img, Tensor) and img.dim() == 3:
                rh, rw = resized_size(img.shape[-2], img.shape[-1], self.cfg)
                if rh > h or rw > w:
                    raise UsageError(
                        f"image {i} ({img.shape[-2]}x{img.shape[-1]}) resizes to {rh}x{rw}, which does not fit "
                        f"this package's canvas {h}x{w} (HxW); export a package for a larger canvas"
                    )
        batch = to_image_batch(list(images), self.cfg.replace(canvases=((h, w),)), self.meta.batch_size)
        return ImageBatch(*(t.to(self.meta.device) for t in batch))

    def predict(self, images: list[Tensor]) -> list[dict[str, Tensor]]:
        """torchvision-style inference on any number of images, ``batch_size`` at a time."""
        results: list[dict[str, Tensor]] = []
        b = self.meta.batch_size
        for start in range(0, len(images), b):
            batch = self.image_batch(images[start : start + b])
            results.extend(postprocess(self.detect(batch), batch))
        return results


def load_exported(path: str | os.PathLike, trust: bool = False) -> DeployedModel:
    """Load a package written by :func:`save_exported` or :func:`compile_aoti` (format detected).

    Only a package this user built (:mod:`mrcnn.export.trust`), unless ``trust``: loading one runs
    code from it. :class:`~mrcnn.export.trust.UntrustedPackageError` otherwise.
    """
    return DeployedModel(path, trust)
