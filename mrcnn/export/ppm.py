"""Images for the C++ example: binary PPM (P6, maxval 255), so neither side needs an image library."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor

from mrcnn.exits import UsageError


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
            pos = data.find(b"\n", pos) + 1 or len(data)
            continue
        end = pos
        while end < len(data) and not data[end : end + 1].isspace():
            end += 1
        fields.append(data[pos:end])
        pos = end
    if fields[0] != b"P6" or not all(f.isdigit() for f in fields[1:]) or int(fields[3]) != 255:
        raise UsageError(f"{path}: expected a binary PPM (P6) with maxval 255, got {fields[0]!r} maxval {fields[3]!r}")
    w, h = int(fields[1]), int(fields[2])
    if w < 1 or h < 1:
        raise UsageError(f"{path}: a PPM of {w}x{h} pixels holds no image")
    pixels = data[pos + 1 : pos + 1 + 3 * w * h]
    if len(pixels) != 3 * w * h:
        raise UsageError(f"{path}: truncated PPM ({len(pixels)} of {3 * w * h} pixel bytes)")
    return torch.frombuffer(bytearray(pixels), dtype=torch.uint8).view(h, w, 3).permute(2, 0, 1).contiguous()
