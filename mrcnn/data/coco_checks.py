"""What an annotation file may hand to pycocotools' C code and to the file system, checked first.

pycocotools trusts its input: a polygon point far outside the image overflows its integer
arithmetic (SIGSEGV), RLE runs that pass the mask's end are written past it, and an image declared
huge allocates its mask before anything fails. :class:`mrcnn.data.coco.CocoDataset` runs these
checks on every annotation before pycocotools sees it, and names the annotation in the error.
"""

from __future__ import annotations

import math
import os
from typing import Any

from PIL import Image

RUN_LIMIT = 1 << 32  # pycocotools keeps each run length in a C uint


def finite_sum(values: list[Any]) -> bool:
    """All numbers and finite, checked by one C-speed ``sum`` (train2017 has tens of millions)."""
    try:
        return math.isfinite(sum(values))
    except TypeError:
        return False


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def inside_folder(file_name: str) -> bool:
    """Whether ``file_name`` names a path inside the image folder: relative, and no ".." that leaves it.
    Lexical on purpose: a folder made of links to a shared store is a common way to build a subset."""
    norm = os.path.normpath(file_name)
    return "\x00" not in file_name and not os.path.isabs(norm) and norm != ".." and not norm.startswith("../")


def max_image_pixels() -> int:
    """The most pixels an image may declare: what Pillow decodes before it refuses a decompression bomb
    (twice ``Image.MAX_IMAGE_PIXELS``), or 16384 x 16384 where a caller lifted that limit."""
    limit = Image.MAX_IMAGE_PIXELS
    return int(2 * limit) if limit else 16384 * 16384


def rle_string_counts(counts: str | bytes) -> list[int] | None:
    """The run lengths of a compressed COCO RLE string, decoded as pycocotools' ``rleFrString`` does
    (5 bits a character from '0', a continuation bit, deltas after the second run), or None when a
    character is outside that alphabet or the string ends inside a number."""
    data = counts.encode("utf-8", "surrogatepass") if isinstance(counts, str) else counts
    runs: list[int] = []
    pos = 0
    while pos < len(data):
        value, shift, more = 0, 0, True
        while more:
            if pos >= len(data) or not 48 <= data[pos] < 48 + 64:
                return None
            c = data[pos] - 48
            value |= (c & 0x1F) << shift
            more = bool(c & 0x20)
            pos += 1
            shift += 5
            if not more and c & 0x10:
                value -= 1 << shift  # sign-extend
        if len(runs) > 2:
            value += runs[-2]
        runs.append(value)
    return runs


def rle_problem(segm: dict[str, Any], height: int, width: int) -> str:
    """Why ``segm`` is not an RLE of a ``height`` x ``width`` image whose runs cover exactly its pixels, or ""."""
    size, counts = segm.get("size"), segm.get("counts")
    if not isinstance(counts, (list, str, bytes)) or not isinstance(size, list) or len(size) != 2:
        return f"RLE needs 'counts' and 'size' [h, w], got keys {sorted(segm)}"
    if list(size) != [height, width]:
        return f"RLE size {size} differs from the image's size [{height}, {width}]"
    runs = counts if isinstance(counts, list) else rle_string_counts(counts)
    if runs is None:
        return "RLE counts string is not a compressed COCO RLE"
    if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < RUN_LIMIT for c in runs):
        return "RLE counts must be run lengths (integers from 0 to 2^32 - 1)"
    if sum(runs) != height * width:
        return f"RLE counts sum to {sum(runs)}, not h*w = {height * width}"
    return ""


def polygons_problem(parts: list[Any], height: int, width: int) -> str:
    """Why the polygons ``parts`` cannot go to pycocotools for a ``height`` x ``width`` image, or "":
    a value that is not a finite number, or a point beyond [-W, 2W] x [-H, 2H] (pycocotools scales
    each point by 5 in C integers). Parts of fewer than 3 points are the caller's to skip."""
    for part in parts:
        if not isinstance(part, list):
            continue
        if not finite_sum(part):
            return "a polygon holds a value that is not a finite number"
        if len(part) >= 2 and (min(part[0::2]) < -width or max(part[0::2]) > 2 * width
                               or min(part[1::2]) < -height or max(part[1::2]) > 2 * height):
            return f"a polygon point lies beyond [-W, 2W] x [-H, 2H] of the image ({width}x{height})"
    return ""
