"""Deterministic synthetic shapes data set, laid out exactly as COCO 2017 is.

``generate(out, count, seed, split)`` writes::

    out/annotations/instances_<split>.json
    out/<split>/000000000001.png ...

so :class:`mrcnn.data.coco.CocoDataset` (and any COCO tool) reads it unchanged.

The images are built to exercise every source of dynamic shapes the static model must absorb:

- sizes from 200 to 640 px a side, aspect ratios up to about 2.2:1, portrait and landscape;
- 0 to 28 objects per image (every 10th image is empty, every 10th crowded with 20 or more),
  which stays under the ``tiny`` preset's ``max_gt_instances`` (32);
- six shape classes (:data:`CATEGORIES`, ids 1..6) with polygon masks;
- overlapping objects, objects cut by the image border, tiny objects (a few pixels across) and
  textured backgrounds (gradients, clouds, stripes, checkers, clutter lines, pixel noise).

Occlusion: objects are painted in annotation order, later ones on top, and each annotation is the
polygon *as drawn* (amodal), clipped to the image. To keep that label honest, a placement that
would hide more than half of an earlier object's pixels is rejected and redrawn, so every
annotated object is at least half visible.

Determinism: image ``i`` draws from its own generator seeded with ``(seed, i)``, so an image does
not depend on ``count``, and the JSON is byte-identical between runs with the same arguments
(coordinates rounded to 0.01 px, no timestamps).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pycocotools.mask as mask_utils
from PIL import Image, ImageDraw

from mrcnn.exits import UsageError, guarded
from mrcnn.files import atomic_write
from mrcnn.flags import SEED_MAX, bounded
from mrcnn.progress import add_progress_flag
from mrcnn.progress import progress as progress_bar

CATEGORIES: tuple[str, ...] = ("circle", "ellipse", "rectangle", "triangle", "star", "hexagon")
"""Shape classes; category id ``k + 1`` is ``CATEGORIES[k]`` (contiguous ids 1..6)."""

MIN_SIDE, MAX_SIDE = 200, 640
MAX_OBJECTS = 28  # crowded images draw 20..28 objects
MAX_HIDDEN_FRACTION = 0.5  # a placement may hide at most this much of any earlier object
_PLACEMENT_TRIES = 12
_MIN_AREA = 6  # px; a shape clipped down to less than this is redrawn, it would be a speck


def _round(values: Sequence[float]) -> list[float]:
    # Two decimals: exact enough for masks, short JSON, and no float noise between runs.
    return [round(float(v), 2) for v in values]


def _image_size(rng: np.random.Generator) -> tuple[int, int]:
    """(height, width): long side 320..640, aspect 1..2.2, about 40% portrait."""
    long_side = int(rng.integers(320, MAX_SIDE + 1))
    aspect = float(rng.uniform(1.0, 2.2))
    short_side = max(MIN_SIDE, round(long_side / aspect))
    if rng.random() < 0.4:
        return long_side, short_side
    return short_side, long_side


def _num_objects(rng: np.random.Generator, index: int) -> int:
    # A fixed schedule guarantees that even a 10-image set has an empty and a crowded image.
    if index % 10 == 1:
        return 0
    if index % 10 == 6:
        return int(rng.integers(20, MAX_OBJECTS + 1))
    return int(rng.integers(1, 13))


def _smooth_noise(rng: np.random.Generator, height: int, width: int, cells: int) -> np.ndarray:
    """[height, width, 3] float in 0..255: a coarse random grid upsampled bicubically ("clouds")."""
    grid = rng.uniform(0, 255, size=(cells, max(2, cells * width // height), 3)).astype(np.uint8)
    return np.asarray(Image.fromarray(grid).resize((width, height), Image.BICUBIC), dtype=np.float32)


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """[height, width, 3] uint8, never flat: one of five textures, then clutter and pixel noise."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    theta = rng.uniform(0, math.pi)
    along = xx * math.cos(theta) + yy * math.sin(theta)
    c0, c1 = rng.uniform(0, 255, size=(2, 3)).astype(np.float32)
    kind = int(rng.integers(5))
    if kind == 0:  # linear gradient
        t = (along - along.min()) / max(float(np.ptp(along)), 1.0)
        img = c0 * (1 - t[..., None]) + c1 * t[..., None]
    elif kind == 1:  # clouds
        img = _smooth_noise(rng, height, width, int(rng.integers(3, 9)))
    elif kind == 2:  # soft stripes
        t = 0.5 + 0.5 * np.sin(2 * math.pi * along / rng.uniform(8, 48))
        img = c0 * (1 - t[..., None]) + c1 * t[..., None]
    elif kind == 3:  # checkerboard
        cell = int(rng.integers(8, 48))
        t = ((xx // cell + yy // cell) % 2).astype(np.float32)
        img = c0 * (1 - t[..., None]) + c1 * t[..., None]
    else:  # clouds blended with a gradient
        t = (along - along.min()) / max(float(np.ptp(along)), 1.0)
        img = 0.5 * _smooth_noise(rng, height, width, int(rng.integers(2, 6))) + 0.5 * (
            c0 * (1 - t[..., None]) + c1 * t[..., None]
        )
    img += rng.normal(0.0, rng.uniform(2.0, 8.0), size=(height, width, 1)).astype(np.float32)
    canvas = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    # Unlabelled thin lines: texture with edges, but nothing shaped like an object.
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(0, 7))):
        x0, x1 = rng.uniform(0, width, size=2)
        y0, y1 = rng.uniform(0, height, size=2)
        color = tuple(int(c) for c in rng.integers(0, 256, size=3))
        draw.line([(x0, y0), (x1, y1)], fill=color, width=int(rng.integers(1, 4)))
    return np.array(canvas)


def _shape_polygon(rng: np.random.Generator, category: int, cx: float, cy: float, radius: float) -> np.ndarray:
    """[P, 2] (x, y) vertices of shape ``category`` (1..6) centred at (cx, cy), randomly rotated."""
    name = CATEGORIES[category - 1]
    angle = rng.uniform(0, 2 * math.pi)
    if name == "circle":
        t = np.linspace(0, 2 * math.pi, 32, endpoint=False)
        pts = np.stack([np.cos(t), np.sin(t)], 1)
    elif name == "ellipse":
        t = np.linspace(0, 2 * math.pi, 32, endpoint=False)
        pts = np.stack([np.cos(t), rng.uniform(0.35, 0.75) * np.sin(t)], 1)
    elif name == "rectangle":
        aspect = rng.uniform(0.35, 1.0)
        pts = np.array([[-1, -aspect], [1, -aspect], [1, aspect], [-1, aspect]], dtype=np.float64)
    elif name == "triangle":
        t = np.array([0, 2 * math.pi / 3, 4 * math.pi / 3]) + rng.uniform(-0.35, 0.35, size=3)
        pts = np.stack([np.cos(t), np.sin(t)], 1)
    elif name == "star":
        t = np.linspace(0, 2 * math.pi, 10, endpoint=False)
        r = np.where(np.arange(10) % 2 == 0, 1.0, rng.uniform(0.38, 0.55))
        pts = np.stack([r * np.cos(t), r * np.sin(t)], 1)
    else:  # hexagon
        t = np.linspace(0, 2 * math.pi, 6, endpoint=False)
        pts = np.stack([np.cos(t), np.sin(t)], 1)
    rot = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    return pts @ rot.T * radius + np.array([cx, cy])


def clip_polygon(points: np.ndarray, width: float, height: float) -> np.ndarray:
    """Clip polygon [P, 2] (x, y) to the box [0, width] x [0, height]; returns [Q, 2], Q may be 0.

    Sutherland-Hodgman against the four image edges in turn. The clip window is convex, so this is
    exact for any simple polygon (a concave star may gain zero-area edges along the border, which
    rasterise to nothing).
    """
    # Each edge as (axis, limit, keep_below): inside means coord <= limit (or >= limit).
    edges = ((0, 0.0, False), (0, float(width), True), (1, 0.0, False), (1, float(height), True))
    out = [tuple(p) for p in np.asarray(points, dtype=np.float64)]
    for axis, limit, keep_below in edges:
        if not out:
            break
        src, out = out, []

        def inside(p: tuple[float, float], axis: int = axis, limit: float = limit, below: bool = keep_below) -> bool:
            return p[axis] <= limit if below else p[axis] >= limit

        for j, cur in enumerate(src):
            prev = src[j - 1]
            if inside(cur):
                if not inside(prev):
                    out.append(_intersect(prev, cur, axis, limit))
                out.append(cur)
            elif inside(prev):
                out.append(_intersect(prev, cur, axis, limit))
    return np.array(out, dtype=np.float64).reshape(-1, 2)


def _intersect(p: tuple[float, float], q: tuple[float, float], axis: int, limit: float) -> tuple[float, float]:
    t = (limit - p[axis]) / (q[axis] - p[axis])
    x, y = p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])
    return (limit, y) if axis == 0 else (x, limit)


def _render_mask(poly: np.ndarray, height: int, width: int) -> np.ndarray:
    """[height, width] bool: the pixels PIL paints for ``poly``."""
    layer = Image.new("L", (width, height), 0)
    ImageDraw.Draw(layer).polygon([(float(x), float(y)) for x, y in poly], fill=1)
    return np.asarray(layer, dtype=bool)


def _paint(img: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> None:
    """Fill ``mask`` in ``img`` [H, W, 3] with a shaded colour (objects are not flat either)."""
    ys, xs = np.nonzero(mask)
    color = rng.uniform(20, 235, size=3)
    theta = rng.uniform(0, 2 * math.pi)
    along = xs * math.cos(theta) + ys * math.sin(theta)
    t = (along - along.min()) / max(float(np.ptp(along)), 1.0)
    shade = 0.75 + 0.5 * t[:, None]
    img[ys, xs] = np.clip(color * shade, 0, 255).astype(np.uint8)


def _sample_object(rng: np.random.Generator, height: int, width: int) -> tuple[int, np.ndarray] | None:
    """One (category, clipped polygon [P, 2]) or None when the shape fell (almost) off the image."""
    category = int(rng.integers(1, len(CATEGORIES) + 1))
    short = min(height, width)
    # 15% tiny (3..8 px radius, well inside COCO's "small"), the rest log-uniform up to a third of
    # the short side.
    tiny = rng.random() < 0.15
    radius = rng.uniform(3, 8) if tiny else math.exp(rng.uniform(math.log(6), math.log(0.33 * short)))
    if rng.random() < 0.15:  # centred on a border, so it is cut by it
        side = int(rng.integers(4))
        cx = rng.uniform(0, width) if side < 2 else (0.0 if side == 2 else float(width))
        cy = rng.uniform(0, height) if side >= 2 else (0.0 if side == 0 else float(height))
    else:
        cx = rng.uniform(-0.2 * radius, width + 0.2 * radius)
        cy = rng.uniform(-0.2 * radius, height + 0.2 * radius)
    poly = clip_polygon(_shape_polygon(rng, category, cx, cy, radius), width, height)
    if len(poly) < 3:
        return None
    return category, poly


def _make_image(index: int, seed: int) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
    """Image ``index``: pixels [H, W, 3] uint8 and its objects in paint order (category, polygon)."""
    rng = np.random.default_rng([seed, index])
    height, width = _image_size(rng)
    img = _background(rng, height, width)
    wanted = _num_objects(rng, index)
    # owner[y, x]: index of the topmost object painted there (-1: background). Its histogram under a
    # new shape tells how much of each earlier object that shape would hide.
    owner = np.full((height, width), -1, dtype=np.int32)
    drawn_area: list[int] = []
    objects: list[tuple[int, np.ndarray]] = []
    for _ in range(wanted):
        for _try in range(_PLACEMENT_TRIES):
            sample = _sample_object(rng, height, width)
            if sample is None:
                continue
            mask = _render_mask(sample[1], height, width)
            area = int(mask.sum())
            if area < _MIN_AREA:
                continue
            covered = owner[mask]
            hidden = np.bincount(covered[covered >= 0], minlength=len(objects))
            visible = np.bincount(owner[owner >= 0], minlength=len(objects)) if objects else hidden
            if objects and np.any(visible - hidden < (1 - MAX_HIDDEN_FRACTION) * np.asarray(drawn_area)):
                continue
            owner[mask] = len(objects)
            drawn_area.append(area)
            objects.append(sample)
            _paint(img, mask, rng)
            break
    return img, objects


def _annotations(
    objects: list[tuple[int, np.ndarray]], image_id: int, first_ann_id: int, height: int, width: int
) -> list[dict]:
    anns = []
    for k, (category, poly) in enumerate(objects):
        flat = _round(poly.reshape(-1))
        xs, ys = flat[0::2], flat[1::2]
        x0, y0 = min(xs), min(ys)
        # COCO's area is the mask's pixel count under its own rasteriser, not the polygon's area.
        area = int(mask_utils.area(mask_utils.frPyObjects([flat], height, width))[0])
        anns.append(
            {
                "id": first_ann_id + k,
                "image_id": image_id,
                "category_id": category,
                "segmentation": [flat],
                "area": area,
                "bbox": _round([x0, y0, max(xs) - x0, max(ys) - y0]),
                "iscrowd": 0,
            }
        )
    return anns


def generate(
    out_dir: str | Path,
    count: int,
    seed: int = 0,
    split: str = "train",
    *,
    image_format: str = "png",
    progress: bool = True,
) -> Path:
    """Write ``count`` synthetic images and their COCO annotations under ``out_dir``.

    Args:
        out_dir: data set root; gets ``annotations/instances_<split>.json`` and ``<split>/``.
        count: number of images (image ids 1..count).
        seed: same seed, same images and byte-identical JSON.
        split: split name used in both paths, e.g. "train" or "val".
        image_format: "png" (lossless, the default) or "jpg" (quality 95; about 4x smaller).
        progress: report progress as :mod:`mrcnn.progress` does (a bar, or lines in a log).
    Returns:
        ``out_dir`` as a Path, ready for ``CocoDataset(out_dir, split)``.
    """
    if count < 0:
        raise UsageError(f"count must be >= 0, got {count}")
    if image_format not in ("png", "jpg"):
        raise ValueError(f"image_format must be 'png' or 'jpg', got {image_format!r}")
    root = Path(out_dir)
    image_dir = root / split
    image_dir.mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(parents=True, exist_ok=True)

    images, annotations = [], []
    for index in progress_bar(range(count), desc=f"synthetic {split}", unit="img", enabled=progress):
        image_id = index + 1
        pixels, objects = _make_image(index, seed)
        height, width = pixels.shape[:2]
        file_name = f"{image_id:012d}.{image_format}"
        pil = Image.fromarray(pixels)
        if image_format == "png":
            pil.save(image_dir / file_name, compress_level=1)  # level 1: 3x faster, ~10% larger
        else:
            pil.save(image_dir / file_name, quality=95)
        images.append({"id": image_id, "file_name": file_name, "height": height, "width": width})
        annotations += _annotations(objects, image_id, len(annotations) + 1, height, width)

    dataset = {
        "info": {
            "description": "mrcnn synthetic shapes",
            "version": "1",
            "generator": "mrcnn.data.synthetic",
            "seed": seed,
            "count": count,
            "split": split,
        },
        "licenses": [],
        "images": images,
        "annotations": annotations,
        "categories": [{"id": k + 1, "name": name, "supercategory": "shape"} for k, name in enumerate(CATEGORIES)],
    }
    ann_file = root / "annotations" / f"instances_{split}.json"
    atomic_write(ann_file, json.dumps(dataset, separators=(",", ":")))
    return root


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the generator's options to ``parser`` (shared with the main ``mrcnn`` CLI)."""
    parser.add_argument("--out", required=True, type=Path, help="data set root to write")
    parser.add_argument("--count", type=bounded(int, 1, 10_000_000), default=200, help="number of images (default 200)")
    parser.add_argument("--seed", type=bounded(int, 0, SEED_MAX), default=0, help="random seed (default 0)")
    parser.add_argument("--split", default="train", help="split name, e.g. train or val (default train)")
    parser.add_argument("--format", dest="image_format", choices=("png", "jpg"), default="png")
    add_progress_flag(parser, "--quiet")
    return parser


def run(args: argparse.Namespace) -> Path:
    """Run the generator from parsed ``args``; prints where the annotation file went."""
    root = generate(
        args.out, args.count, args.seed, args.split, image_format=args.image_format, progress=not args.no_progress
    )
    print(f"wrote {args.count} images to {root / args.split} and {root / 'annotations'}/instances_{args.split}.json")
    return root


def main(argv: Sequence[str] | None = None) -> int:
    """Exit codes: :mod:`mrcnn.exits`."""
    parser = argparse.ArgumentParser(prog="python -m mrcnn.data.synthetic", description=__doc__.split("\n")[0])

    def generate_from_flags() -> int:
        run(add_arguments(parser).parse_args(argv))
        return 0

    return guarded("mrcnn", generate_from_flags, lambda: "synth")


if __name__ == "__main__":
    sys.exit(main())
