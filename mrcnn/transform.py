"""Host-side transform: check, normalise, resize like torchvision, pad to a canvas bucket.

This runs before the graph. It is the one place where image sizes are Python numbers: after it,
the model sees a [B, 3, H, W] canvas whose size is one of ``cfg.canvases`` and a [B, 2] tensor of
true sizes, so the compiled graph depends on the bucket and the batch size only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from mrcnn.config import Canvas, Config
from mrcnn.exits import UsageError
from mrcnn.structures import ImageBatch

_DTYPES = (torch.uint8, torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_image(image: object, index: int = 0) -> Tensor:
    """Validate one image and return it as float32 [3, h, w] in [0, 1].

    Accepts a CHW tensor, uint8 (0..255) or float (0..1). Raises ``ValueError`` naming the image
    and the problem, so bad input never surfaces as an error from deep inside torch.
    """
    where = f"image {index}"
    if not isinstance(image, Tensor):
        raise ValueError(f"{where}: expected a torch.Tensor of shape [3, H, W], got {type(image).__name__}")
    if image.dim() != 3:
        raise ValueError(f"{where}: expected shape [3, H, W], got {list(image.shape)}")
    if image.shape[0] != 3:
        raise ValueError(
            f"{where}: expected 3 channels (RGB, CHW layout), got {image.shape[0]} in shape {list(image.shape)}"
        )
    if image.shape[1] == 0 or image.shape[2] == 0:
        raise ValueError(f"{where}: zero-size image {list(image.shape)}")
    if image.dtype not in _DTYPES:
        raise ValueError(f"{where}: unsupported dtype {image.dtype}; use uint8 or a float type")
    if image.dtype == torch.uint8:
        return image.float().div_(255.0)
    image = image.float()
    if not bool(torch.isfinite(image).all()):
        raise ValueError(f"{where}: contains NaN or inf pixels")
    return image


def resized_size(height: int, width: int, cfg: Config) -> tuple[int, int]:
    """Size torchvision's transform resizes an image to (floor of size x scale, as interpolate)."""
    scale = min(cfg.min_size / min(height, width), cfg.max_size / max(height, width))
    return int(height * scale), int(width * scale)


def select_canvas(sizes: list[tuple[int, int]], cfg: Config) -> Canvas:
    """Smallest canvas bucket (by area) holding every (height, width) in ``sizes``."""
    fitting = [c for c in cfg.canvases if all(h <= c[0] and w <= c[1] for h, w in sizes)]
    if not fitting:
        biggest = (max(h for h, _ in sizes), max(w for _, w in sizes))
        raise UsageError(
            f"no canvas of config {cfg.name!r} holds the resized image(s): need at least "
            f"{biggest[0]}x{biggest[1]} (HxW), canvases are {list(cfg.canvases)}; add a larger canvas "
            f"or lower min_size/max_size"
        )
    return min(fitting, key=lambda c: (c[0] * c[1], c))


def group_by_canvas(images: list[Tensor], cfg: Config) -> dict[Canvas, list[int]]:
    """Indices of ``images`` grouped by the smallest canvas bucket each one fits, in input order."""
    if isinstance(images, Tensor) or len(images) == 0:
        raise ValueError("expected a non-empty list of [3, H, W] images")
    groups: dict[Canvas, list[int]] = {}
    for i, image in enumerate(images):
        check_image(image, i)
        canvas = select_canvas([resized_size(image.shape[-2], image.shape[-1], cfg)], cfg)
        groups.setdefault(canvas, []).append(i)
    return groups


def normalize_and_resize(image: Tensor, cfg: Config) -> Tensor:
    """[3, h, w] float in [0, 1] -> [3, rh, rw] normalised, bit-for-bit as torchvision does it."""
    mean = torch.tensor(cfg.image_mean, dtype=image.dtype, device=image.device)[:, None, None]
    std = torch.tensor(cfg.image_std, dtype=image.dtype, device=image.device)[:, None, None]
    image = (image - mean) / std
    scale = min(cfg.min_size / min(image.shape[-2:]), cfg.max_size / max(image.shape[-2:]))
    return F.interpolate(
        image[None], scale_factor=scale, mode="bilinear", recompute_scale_factor=True, align_corners=False
    )[0]


def to_image_batch(images: list[Tensor], cfg: Config, batch_size: int | None = None) -> ImageBatch:
    """Check, normalise, resize and pad ``images`` into one canvas bucket.

    Args:
        images: list of [3, h, w] tensors, uint8 or float in [0, 1], any sizes.
        batch_size: pad the batch to this many slots (``valid`` False) so an incomplete last batch
            never shows a compiled graph a new batch size. Defaults to ``len(images)``.
    Returns:
        ImageBatch with tensors [B, 3, H, W] on the images' device.
    """
    if isinstance(images, Tensor):
        raise ValueError("expected a list of [3, H, W] images; pass a prebuilt ImageBatch to the model directly")
    if len(images) == 0:
        raise ValueError("expected at least one image, got an empty list")
    batch_size = len(images) if batch_size is None else batch_size
    if batch_size < len(images):
        raise ValueError(f"batch_size {batch_size} is smaller than the {len(images)} images given")
    checked = [check_image(img, i) for i, img in enumerate(images)]
    resized = [normalize_and_resize(img, cfg) for img in checked]
    canvas_h, canvas_w = select_canvas([tuple(r.shape[-2:]) for r in resized], cfg)
    device = checked[0].device
    tensors = torch.zeros(batch_size, 3, canvas_h, canvas_w, device=device)
    image_sizes = torch.zeros(batch_size, 2, dtype=torch.int64)
    original_sizes = torch.zeros(batch_size, 2, dtype=torch.int64)
    valid = torch.zeros(batch_size, dtype=torch.bool)
    for i, (img, res) in enumerate(zip(checked, resized)):
        h, w = res.shape[-2:]
        tensors[i, :, :h, :w] = res
        image_sizes[i] = torch.tensor([h, w])
        original_sizes[i] = torch.tensor(img.shape[-2:])
        valid[i] = True
    # Padding slots get a nominal size so no stage divides by zero; their outputs are invalid.
    image_sizes[len(images) :] = torch.tensor([canvas_h, canvas_w])
    original_sizes[len(images) :] = torch.tensor([canvas_h, canvas_w])
    return ImageBatch(tensors, image_sizes.to(device), original_sizes.to(device), valid.to(device))
