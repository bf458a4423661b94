"""The inputs of the padding studies: sample photographs at a given size, and a preset at the study's sizes.

``bench/studies/padding_parity/padding_parity.py`` compares detections on these photographs with
torchvision's; ``bench/studies/weight_calibration/weight_calibration.py`` checks that calibrated
random weights give spread scores on the same photographs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from matplotlib import cbook
from torchvision.io import ImageReadMode, read_image

from mrcnn.config import Config, get_config

# Two of matplotlib's sample images: a portrait and a product photograph.
PHOTOS = ("grace_hopper.jpg", "Minduka_Present_Blue_Pack.png")


def build_config(preset: str, min_size: int, max_size: int) -> Config:
    """``preset`` at the issue's sizes, with canvases built as the presets build theirs."""
    base = get_config(preset)
    d = base.size_divisible

    def up(x: int) -> int:
        return -(-x // d) * d

    short, long_, mid = up(min_size), up(max_size), up(round(min_size * 4 / 3))
    canvases = ((short, short), (short, mid), (short, long_), (mid, short), (long_, short))
    return base.replace(min_size=min_size, max_size=max_size, canvases=canvases)


def photo(name: str, size: tuple[int, int]) -> torch.Tensor:
    """Sample photograph centre-cropped to the aspect of ``size`` and resized to it: [3, h, w] in [0, 1]."""
    image = read_image(cbook.get_sample_data(name, asfileobj=False), ImageReadMode.RGB).float() / 255
    (ph, pw), (h, w) = image.shape[-2:], size
    ch, cw = (pw * h // w, pw) if ph * w > pw * h else (ph, ph * w // h)
    crop = image[None, :, (ph - ch) // 2 : (ph - ch) // 2 + ch, (pw - cw) // 2 : (pw - cw) // 2 + cw]
    return F.interpolate(crop, size=size, mode="bilinear", antialias=True, align_corners=False)[0].clamp(0, 1)
