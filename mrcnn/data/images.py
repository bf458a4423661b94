"""Image files as they come, decoded to what the model takes: uint8 RGB."""

from __future__ import annotations

import numpy as np
from PIL import Image

from mrcnn.exits import UsageError

# Pillow's 16-bit greyscale modes (PNG, TIFF): convert("RGB") clips them at 255 instead of scaling.
_SIXTEEN_BIT = frozenset({"I;16", "I;16B", "I;16L", "I;16N"})


def rgb8(pil: Image.Image) -> np.ndarray:
    """[H, W, 3] uint8 RGB of an opened image, as COCO tools read it (no EXIF rotation).

    16-bit greyscale keeps its high byte (scaled, not clipped); palette, 1-bit, greyscale, alpha and
    CMYK go through Pillow's own conversion. ValueError for 32-bit integer or float pixels, whose
    range no file states.
    """
    if pil.mode in _SIXTEEN_BIT:
        grey = (np.asarray(pil).astype(np.uint32) >> 8).astype(np.uint8)
        return np.repeat(grey[..., None], 3, axis=2)
    if pil.mode in ("I", "F"):
        kind = "integer" if pil.mode == "I" else "float"
        raise UsageError(f"32-bit {kind} pixels (mode {pil.mode}) have no stated range: save it as 8 or 16 bits")
    return np.asarray(pil.convert("RGB"))
