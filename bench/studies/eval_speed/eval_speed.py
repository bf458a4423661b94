"""How long COCO evaluation takes: N images x K fixed-shape detections, stage by stage.

    python bench/studies/eval_speed/eval_speed.py [--images 500] [--dets 100] [--size 480 640] [--repeats 1]

Ground truth is built in memory (COCO-sized images, about 7 polygon objects each, as COCO
val2017 averages); detections are fixed-shape ``Detections`` [B, K, ...] in canvas coordinates
with M x M soft masks: half near a GT object, half random, all valid. Stages timed:

1. results: boxes to original pixels and xywh, labels to category ids, masks pasted (torchvision's
   paste arithmetic), thresholded and RLE-encoded inside their boxes only
   (``mrcnn.evaluate.detections_to_coco_results``);
2. COCOeval bbox, then 3. COCOeval segm (evaluate + accumulate + summarize each).

For comparison it also times the reference path (``postprocess`` full-size paste, then
``encode_masks``) on ``--full-paste-images`` images, checks that it gives identical results, and
extrapolates.

Prints one line per stage and the total (wall-clock seconds, this machine's thread setting).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math

import numpy as np
import torch
from pycocotools.coco import COCO

from mrcnn.evaluate import detections_to_coco_results, evaluate_coco, to_coco_results
from mrcnn.postprocess import postprocess
from mrcnn.structures import Detections, ImageBatch
from mrcnn_bench.base import timing


def make_ground_truth(num_images: int, height: int, width: int, rng: np.random.Generator) -> COCO:
    images, anns = [], []
    for image_id in range(1, num_images + 1):
        h, w = (height, width) if image_id % 3 else (width, height)  # a third portrait
        images.append({"id": image_id, "file_name": f"{image_id:012d}.jpg", "height": h, "width": w})
        for _ in range(int(rng.poisson(7))):
            r = math.exp(rng.uniform(math.log(4), math.log(min(h, w) / 3)))
            cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
            t = np.linspace(0, 2 * math.pi, 16, endpoint=False)
            poly = np.stack([cx + r * np.cos(t), cy + 0.7 * r * np.sin(t)], 1).reshape(-1)
            xs, ys = poly[0::2], poly[1::2]
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": image_id,
                    "category_id": int(rng.integers(1, 7)),
                    "segmentation": [poly.round(2).tolist()],
                    "area": float(math.pi * 0.7 * r * r),
                    "bbox": [float(xs.min()), float(ys.min()), float(np.ptp(xs)), float(np.ptp(ys))],
                    "iscrowd": 0,
                }
            )
    coco = COCO()
    coco.dataset = {
        "images": images,
        "annotations": anns,
        "categories": [{"id": k, "name": str(k)} for k in range(1, 7)],
    }
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def make_batches(
    coco: COCO, dets: int, mask_size: int, batch_size: int, rng: np.random.Generator
) -> list[tuple[Detections, ImageBatch, list[int]]]:
    """Fixed-shape detections; the canvas is the original image here (resize ratio 1)."""
    ids = coco.getImgIds()
    yy, xx = np.mgrid[0:mask_size, 0:mask_size] / (mask_size - 1) - 0.5
    out = []
    for start in range(0, len(ids), batch_size):
        chunk = ids[start : start + batch_size]
        b = len(chunk)
        boxes = np.zeros((b, dets, 4), np.float32)
        sizes = np.zeros((b, 2), np.int64)
        for i, image_id in enumerate(chunk):
            info = coco.imgs[image_id]
            h, w = info["height"], info["width"]
            sizes[i] = (h, w)
            gt = [a["bbox"] for a in coco.imgToAnns.get(image_id, [])]
            for k in range(dets):
                if gt and k < dets // 2:
                    x, y, bw, bh = gt[k % len(gt)]
                    x, y = x + rng.normal(0, 0.05 * bw), y + rng.normal(0, 0.05 * bh)
                else:
                    bw, bh = rng.uniform(8, w / 2), rng.uniform(8, h / 2)
                    x, y = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
                boxes[i, k] = (max(x, 0), max(y, 0), min(x + bw, w), min(y + bh, h))
        radius = rng.uniform(0.25, 0.5, size=(b, dets, 1, 1))
        masks = 1 / (1 + np.exp(-40 * (radius - np.sqrt(xx**2 + yy**2))))  # soft discs
        det = Detections(
            torch.from_numpy(boxes),
            torch.from_numpy(rng.uniform(0.05, 1, size=(b, dets)).astype(np.float32)),
            torch.from_numpy(rng.integers(1, 7, size=(b, dets))),
            torch.from_numpy(masks.astype(np.float32)),
            torch.ones(b, dets, dtype=torch.bool),
        )
        size_t = torch.from_numpy(sizes)
        batch = ImageBatch(torch.zeros(b, 3, 1, 1), size_t, size_t.clone(), torch.ones(b, dtype=torch.bool))
        out.append((det, batch, chunk))
    return out


def time_reference_path(batches: list[tuple[Detections, ImageBatch, list[int]]], results: dict[str, list],
                        count: int, total_images: int) -> str:
    """Time ``postprocess`` (full-size paste) + ``encode_masks`` on ``count`` images; they must give ``results``.

    Only a few images: 100 pasted float masks at 480x640 are 120 MB per image, and pasting them
    takes seconds. Returns the line to print, extrapolated to ``total_images``.
    """
    n_done, t_paste, t_encode = 0, 0.0, 0.0
    for det, batch, chunk in batches:
        for i, image_id in enumerate(chunk):
            if n_done == count:
                break
            one = slice(i, i + 1)
            with timing.Stopwatch() as paste:
                outputs = postprocess(Detections(*(t[one] for t in det)), ImageBatch(*(t[one] for t in batch)))
            encode_s, slow = timing.timed(to_coco_results, outputs, [image_id])
            t_paste, t_encode = t_paste + paste.seconds, t_encode + encode_s
            fast = {k: [d for d in v if d["image_id"] == image_id] for k, v in results.items()}
            if slow != fast:
                raise SystemExit(f"image {image_id}: box-local encoding differs from postprocess + encode_masks")
            n_done += 1
    scale = total_images / n_done
    return (
        f"reference path (postprocess full-size paste + encode_masks), {n_done} images, identical results: "
        f"paste {t_paste / n_done:.3f} s/img, encode {t_encode / n_done:.3f} s/img, "
        f"about {(t_paste + t_encode) * scale:.0f} s for {total_images} images"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--dets", type=int, default=100)
    parser.add_argument("--size", type=int, nargs=2, default=(480, 640), metavar=("H", "W"))
    parser.add_argument("--mask-size", type=int, default=28)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--full-paste-images", type=int, default=10, help="also time the full-size paste path on this many images"
    )
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    coco = make_ground_truth(args.images, *args.size, rng)
    batches = make_batches(coco, args.dets, args.mask_size, args.batch_size, rng)
    print(
        f"{args.images} images {args.size[0]}x{args.size[1]} (a third portrait), {args.dets} detections each, "
        f"{len(coco.anns)} GT objects, torch threads {torch.get_num_threads()}"
    )

    timings: dict[str, float] = {}
    with timing.Stopwatch() as encoding:
        results: dict[str, list] = {"bbox": [], "segm": []}
        for det, batch, chunk in batches:  # labels 1..6 are the category ids here
            converted, _ = detections_to_coco_results(det, batch, chunk)
            for key, dets in converted.items():
                results[key] += dets
    timings["boxes + masks to RLE (box-local)"] = encoding.seconds

    if args.full_paste_images:
        print(time_reference_path(batches, results, args.full_paste_images, args.images))

    metrics = {}
    for iou_type in ("bbox", "segm"):
        timings[f"COCOeval {iou_type}"], scores = timing.timed(evaluate_coco, coco, {iou_type: results[iou_type]})
        metrics.update(scores)

    for name, seconds in timings.items():
        print(f"{name:28s} {seconds:7.2f} s")
    print(f"{'total':28s} {sum(timings.values()):7.2f} s")
    print(f"(bbox/AP {metrics['bbox/AP']:.3f}, segm/AP {metrics['segm/AP']:.3f}: a sanity check only)")


if __name__ == "__main__":
    main()
