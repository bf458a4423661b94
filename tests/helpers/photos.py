"""Sample photographs at sizes whose padding the static model must mask, and the detection-parity check.

Every size in ``OFF_CANVAS_SIZES`` is a resized size whose extent (the size rounded up to 32,
torchvision's own padding) is smaller than its canvas bucket in the tiny preset (canvases 320x320,
320x448, 320x512 and their transposes): 1, 15 and 31 px below a multiple of 32 (31 below is just
above the next smaller multiple), landscape and portrait. The photographs ship with matplotlib: a
test module that uses them skips itself when matplotlib is missing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.io import ImageReadMode, read_image

from mrcnn.parity import match_detections

LANDSCAPE = ((320, 415), (320, 385), (320, 465), (287, 512), (257, 512))  # extents 416, 384, 480, 288 (h)
OFF_CANVAS_SIZES = LANDSCAPE + tuple((w, h) for h, w in LANDSCAPE)
PHOTOS = ("grace_hopper.jpg", "Minduka_Present_Blue_Pack.png")


def photo(name: str, size: tuple[int, int]) -> torch.Tensor:
    """A sample photograph, centre-cropped to the aspect of ``size`` and resized to it: [3, h, w] in [0, 1].

    At that size torchvision's transform keeps the image as it is (scale 1), so ``size`` is the
    resized size.
    """
    import matplotlib.cbook  # optional: the callers skip without it

    image = read_image(matplotlib.cbook.get_sample_data(name, asfileobj=False), ImageReadMode.RGB).float() / 255
    (ph, pw), (h, w) = image.shape[-2:], size
    ch, cw = (pw * h // w, pw) if ph * w > pw * h else (ph, ph * w // h)
    top, left = (ph - ch) // 2, (pw - cw) // 2
    crop = image[None, :, top : top + ch, left : left + cw]
    return F.interpolate(crop, size=size, mode="bilinear", antialias=True, align_corners=False)[0].clamp(0, 1)


def assert_detections_match(ref: list[dict], out: list[dict], what: str) -> None:
    """>= 98% matched both ways, counts within 2%, mean mask IoU >= 0.95, over all images."""
    parities = [match_detections(r, o) for r, o in zip(ref, out)]
    n_ref, n_out = sum(p.num_ref for p in parities), sum(p.num_other for p in parities)
    matched = sum(p.matched for p in parities)
    ious = torch.cat([p.mask_ious for p in parities])
    assert n_ref >= 40 * len(ref), f"{what}: weights too weak ({n_ref} detections)"
    assert abs(n_out - n_ref) <= 0.02 * n_ref, (what, n_ref, n_out)
    assert matched >= 0.98 * n_ref and matched >= 0.98 * n_out, (what, matched, n_ref, n_out)
    assert float(ious.mean()) >= 0.95, (what, float(ious.mean()))
