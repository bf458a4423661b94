"""A CPU lever: detection-count buckets for the mask branch, on and off, static eager, tiny preset.

    python bench/studies/cpu_levers/mask_buckets_timing.py [--rounds 10] [--out results/levers]

A sanity timing, not a benchmark row: ``MaskRCNN.predict`` (host resize, model, mask pasting) on
the same images with ``mask_detection_buckets`` empty (the single graph, mask head on all K = 100
slots) and ``(8, 16, 32, 64, 100)`` (box stage, host read of the counts, mask head on the smallest
bucket), interleaved call by call (the order alternating from round to round), same weights
(``synthetic_weights(seed=0)``). Two workloads: ``box_score_thresh`` raised so that a handful of
detections remain per image (the regime of a trained model), and the default 0.05, where every
slot is valid and the buckets can only add their host read. Writes ``OUT/mask_buckets_tiny.md``
and ``.json``: per workload the detections per image, the bucket used, the median seconds per
image of each setting and the median of the per-round ratios (on / off).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from mrcnn.config import get_config
from mrcnn.model import MaskRCNN
from mrcnn.staged import StagedDetector
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, synthetic_weights, textured_images
from mrcnn_bench.base import timing, vcs

BUCKETS = (8, 16, 32, 64, 100)
SIZES = ((240, 320), (300, 400), (180, 240))  # one canvas, (320, 448)
WORKLOADS = {"few detections (box_score_thresh=0.92)": 0.92, "all K valid (box_score_thresh=0.05)": 0.05}


def _models(thresh: float, weights: dict[str, torch.Tensor]) -> dict[str, MaskRCNN]:
    cfg = get_config("tiny", box_score_thresh=thresh)
    return {
        "off": load_torchvision_weights(MaskRCNN(cfg).eval(), weights),
        "on": load_torchvision_weights(MaskRCNN(cfg.replace(mask_detection_buckets=BUCKETS)).eval(), weights),
    }


def measure(thresh: float, rounds: int, weights: dict[str, torch.Tensor], images: list[torch.Tensor]) -> dict:
    models = _models(thresh, weights)
    with torch.no_grad():
        counts = [int(models["off"](to_image_batch([img], models["off"].cfg)).valid.sum()) for img in images]
        detector = StagedDetector(models["on"])
        buckets = [detector.bucket(models["on"].box_stage(to_image_batch([img], models["on"].cfg))[0].valid)
                   for img in images]
        for model in models.values():  # warm-up: one call per image
            model.predict(images)
    times: dict[str, list[float]] = {"off": [], "on": []}  # seconds per image, one entry per round
    for _, order in timing.schedule(("off", "on"), "alternate", rounds):  # off on, then on off
        per_round = {name: 0.0 for name in order}
        for img in images:
            for name in order:
                per_round[name] += timing.timed(models[name].predict, [img])[0]
        for name in order:
            times[name].append(per_round[name] / len(images))
    ratios = [on / off for on, off in zip(times["on"], times["off"])]
    return {
        "box_score_thresh": thresh,
        "detections_per_image": counts,
        "bucket_per_image": buckets,
        "median_s_off": statistics.median(times["off"]),
        "median_s_on": statistics.median(times["on"]),
        "median_ratio_on_off": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "times_s": times,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("results/levers"))
    args = parser.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    weights = synthetic_weights(get_config("tiny"), seed=0)
    images = textured_images(SIZES, seed=0)
    load = os.getloadavg()[0]
    results = {name: measure(thresh, args.rounds, weights, images) for name, thresh in WORKLOADS.items()}
    commit = vcs.output(Path.cwd(), "rev-parse", "--short", "HEAD")
    meta = {
        "command": f"python bench/studies/cpu_levers/mask_buckets_timing.py --rounds {args.rounds}",
        "buckets": BUCKETS, "image_sizes": SIZES, "rounds": args.rounds, "threads": torch.get_num_threads(),
        "torch": torch.__version__, "cpu": platform.processor() or platform.machine(), "commit": commit,
        "load_avg_1min_at_start": load, "unix_time": round(time.time()),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mask_buckets_tiny.json").write_text(json.dumps({"meta": meta, "workloads": results}, indent=1) + "\n")
    lines = [
        "# Mask-branch detection-count buckets, on and off (tiny preset, static eager, `predict`)",
        "",
        f"Command: `{meta['command']}` (commit {commit} plus the change it measures). Buckets {BUCKETS}; "
        f"{len(images)} textured images {', '.join(f'{h}x{w}' for h, w in SIZES)} (canvas 320x448), "
        f"synthetic weights (seed 0), {torch.get_num_threads()} threads, {args.rounds} interleaved rounds.",
        "",
        f"**A sanity timing on a shared, busy 2-core machine** (1-min load average {load:.1f} at the start, "
        "other sessions running): the ratio is the useful figure, the absolute times are not.",
        "",
        "| workload | detections per image | bucket | off: median s/image | on: median s/image "
        "| on / off (median of rounds) | range |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {', '.join(map(str, r['detections_per_image']))} "
            f"| {', '.join(map(str, r['bucket_per_image']))} | {r['median_s_off']:.3f} | {r['median_s_on']:.3f} "
            f"| {r['median_ratio_on_off']:.2f} | {r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f} |"
        )
    (args.out / "mask_buckets_tiny.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
