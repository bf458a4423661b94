"""A CPU lever: a two-core RoIAlign, torchvision's CPU kernel on concurrent RoI chunks.

    python bench/studies/cpu_levers/roi_align_threads.py kernels [--rounds 20] [--out results/levers]
    python bench/studies/cpu_levers/roi_align_threads.py model [--rounds 15] [--out results/levers]
    python bench/studies/cpu_levers/roi_align_threads.py report [--out results/levers]

``kernels``: the multi-level RoIAlign op alone at equal RoI counts, box RoIAlign (7x7, sampling 2,
1000 RoIs) and mask RoIAlign (14x14, 100 RoIs), on P2-P5 of the tiny preset (64 channels, canvas
320x448) and of ``coco_r50_fpn`` (256 channels, canvas 800x1088), batch 1, forward (no grad) and
backward (``autograd.grad`` of a retained graph, so the forward is not in it). RoIs: centres uniform
on the canvas, sides log-uniform over the preset's anchor sizes with aspect ratio 1/2, 1 or 2, which
``roi_levels`` (torchvision's LevelMapper) deals over the levels; the per-level counts are written
out. Variants: torchvision's kernel (``mrcnn::multilevel_roi_align_tv``) at 1 thread, at 2 threads
one call per level (``THREADED = False``, what it was) and at 2 threads split into 2 concurrent
chunks per level (``THREADED = True``, the default now); the gather form
(``mrcnn::multilevel_roi_align``, gather + ``embedding_bag``) at 1 and 2 threads. Every round times
each variant once (a variant under ~50 ms repeats its call and reports the mean), the variants in
an order rotated from round to round; ratios are medians of per-round ratios with a 95% bootstrap
interval (``mrcnn_bench.gates.stats.paired_ratio_ci``).

``model``: the static model, eager, ``model(batch)`` under ``inference_mode``, 2 threads, synthetic
weights (``synthetic_weights(cfg, seed=0)``, 100 detections), one textured image: tiny at 240x320
and ``coco_r50_fpn`` at 480x640; ``THREADED`` off and on alternating call by call (A B, B A, ...).
Also records how the model's own RoIs fall on the levels.

Each part writes ``OUT/roi_align_threads_<part>.json``; ``report`` (also run after each part) joins
them into ``OUT/roi_align_threads.json`` and ``.md``. The 1-minute load average is recorded before
and after every round: on this shared 2-core machine other processes compete for the cores, and a
second core that is busy elsewhere cannot speed anything up.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torchvision

import mrcnn.mask_head
import mrcnn.roi_heads
from mrcnn.config import get_config
from mrcnn.model import MaskRCNN
from mrcnn.ops import multilevel_roi_align, parallel
from mrcnn.ops.roi_align import infer_scales, roi_levels
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, synthetic_weights, textured_images
from mrcnn_bench.base import (
    timing,
    vcs,
)
from mrcnn_bench.gates.stats import paired_ratio_ci
from mrcnn_bench.running import store

PRESETS = {"tiny": (320, 448), "coco_r50_fpn": (800, 1088)}  # kernel canvases
ROI_KINDS = {"box": (7, 1000), "mask": (14, 100)}  # output size, RoIs
MODEL_IMAGES = {"tiny": (240, 320), "coco_r50_fpn": (480, 640)}
MIN_SECONDS = 0.05  # a measurement repeats a faster call up to this long

# (name, impl, threads, THREADED)
VARIANTS = (
    ("tv 1 thread", "torchvision", 1, False),
    ("tv 2 threads, one call per level", "torchvision", 2, False),
    ("tv 2 threads, 2 chunks", "torchvision", 2, True),
    ("tensor 1 thread", "tensor", 1, False),
    ("tensor 2 threads", "tensor", 2, False),
)
# (label, baseline variant, candidate variant): reported as candidate / baseline
COMPARISONS = (
    ("tv: 2 threads / 1 (unthreaded kernel)", "tv 1 thread", "tv 2 threads, one call per level"),
    ("tv: chunked / one call per level (2 threads)", "tv 2 threads, one call per level", "tv 2 threads, 2 chunks"),
    ("tensor: 2 threads / 1", "tensor 1 thread", "tensor 2 threads"),
    ("tensor / tv chunked (2 threads)", "tv 2 threads, 2 chunks", "tensor 2 threads"),
)


def _load() -> float:
    return os.getloadavg()[0]


def pyramid(preset: str, gen: torch.Generator) -> list[torch.Tensor]:
    """P2..P5 [1, C, ceil(H / s), ceil(W / s)] of the preset's kernel canvas."""
    cfg = get_config(preset)
    h, w = PRESETS[preset]
    return [torch.randn(1, cfg.fpn_channels, -(-h // s), -(-w // s), generator=gen) for s in (4, 8, 16, 32)]


def rois(preset: str, n: int, gen: torch.Generator) -> torch.Tensor:
    """[1, n, 4] boxes: sides log-uniform over the preset's anchor sizes, aspect 1/2, 1 or 2, clipped."""
    cfg = get_config(preset)
    h, w = PRESETS[preset]
    lo, hi = math.log(cfg.anchor_sizes[0]), math.log(cfg.anchor_sizes[-1])
    side = torch.exp(lo + (hi - lo) * torch.rand(n, generator=gen))
    aspect = torch.tensor([0.5, 1.0, 2.0])[torch.randint(0, 3, (n,), generator=gen)]
    half = torch.stack([side / aspect.sqrt(), side * aspect.sqrt()], 1) / 2  # (w, h) / 2, area side^2
    centre = torch.rand(n, 2, generator=gen) * torch.tensor([w, h])
    boxes = torch.cat([centre - half, centre + half], 1)
    boxes = torch.minimum(boxes.clamp(min=0), torch.tensor([w, h, w, h], dtype=boxes.dtype))
    return boxes[None]


def level_counts(features: list[torch.Tensor], boxes: torch.Tensor) -> list[int]:
    level, has = roi_levels(boxes.reshape(-1, 4), infer_scales(features), 224, 4)
    return torch.bincount(level[has], minlength=len(features)).tolist()


def _set(threads: int, threaded: bool) -> None:
    torch.set_num_threads(threads)
    parallel.THREADED = threaded


def _repeat(fn: Callable[[], object], reps: int) -> None:
    for _ in range(reps):
        fn()


def _timed(fn: Callable[[], object], reps: int) -> float:
    """Mean seconds of ``reps`` back-to-back calls of ``fn``, timed as one span."""
    return timing.timed(_repeat, fn, reps)[0] / reps


def _summary(times: dict[str, list[float]], extra: dict) -> dict:
    out = dict(extra)
    out["median_s"] = {k: statistics.median(v) for k, v in times.items()}
    out["ratios"] = {}
    for label, base, cand in COMPARISONS:
        if base in times and cand in times:
            est, low, high = paired_ratio_ci(times[base], times[cand])
            out["ratios"][label] = {"median": est, "ci95": [low, high], "rounds": len(times[base])}
    out["times_s"] = times
    return out


def measure_case(preset: str, kind: str, rounds: int, seed: int = 0) -> dict:
    """Forward and backward of every variant, interleaved, for one (preset, RoI kind)."""
    gen = torch.Generator().manual_seed(seed)
    size, n = ROI_KINDS[kind]
    features = pyramid(preset, gen)
    boxes = rois(preset, n, gen)
    upstream = torch.randn(1, n, features[0].shape[1], size, size, generator=gen)

    def forward(impl: str) -> Callable[[], object]:
        def run():
            with torch.no_grad():
                return multilevel_roi_align(features, boxes, size, sampling_ratio=2, impl=impl)

        return run

    graphs = {}
    for impl in ("torchvision", "tensor"):  # one retained graph per impl; each backward reruns it
        leaves = [f.clone().requires_grad_() for f in features]
        graphs[impl] = (leaves, multilevel_roi_align(leaves, boxes, size, sampling_ratio=2, impl=impl))

    def backward(impl: str) -> Callable[[], object]:
        leaves, out = graphs[impl]
        return lambda: torch.autograd.grad(out, leaves, upstream, retain_graph=True)

    # The threaded forward pools each RoI with the same kernel: check before timing.
    _set(2, False)
    ref = forward("torchvision")()
    _set(2, True)
    assert torch.equal(forward("torchvision")(), ref)

    fns = {(name, d): (forward if d == "forward" else backward)(impl) for name, impl, *_ in VARIANTS
           for d in ("forward", "backward")}
    settings = {name: (threads, threaded) for name, _, threads, threaded in VARIANTS}
    reps = {}
    for (name, d), fn in fns.items():  # warm-up, and the repeat count that makes a measurement ~50 ms
        _set(*settings[name])
        fn()
        reps[(name, d)] = max(1, math.ceil(MIN_SECONDS / max(_timed(fn, 1), 1e-6)))
    times = {d: {name: [] for name, *_ in VARIANTS} for d in ("forward", "backward")}
    loads = []
    keys = list(fns)
    for r, order in timing.schedule(keys, "rotate", rounds):
        load_before = _load()
        for key in order:
            name, d = key
            _set(*settings[name])
            times[d][name].append(_timed(fns[key], reps[key]))
        loads.append([load_before, _load()])
        print(f"  {preset} {kind} round {r + 1}/{rounds} load {loads[-1][1]:.1f}", flush=True)
    _set(2, True)
    extra = {"preset": preset, "kind": kind, "output_size": size, "rois": n, "channels": features[0].shape[1],
             "levels": [list(f.shape[-2:]) for f in features], "rois_per_level": level_counts(features, boxes),
             "load_1min_per_round": loads}
    return {d: _summary(times[d], {**extra, "reps": {k[0]: v for k, v in reps.items() if k[1] == d}})
            for d in ("forward", "backward")}


def model_levels(model: MaskRCNN, batch) -> dict[str, list[int]]:
    """How the model's own RoIs fall on P2..P5, per RoIAlign call (box, mask)."""
    seen: dict[str, list[int]] = {}
    originals = (mrcnn.roi_heads.multilevel_roi_align, mrcnn.mask_head.multilevel_roi_align)

    def spy(name, fn):
        def wrapped(features, boxes, output_size, *args, **kwargs):
            seen[f"{name} ({boxes.shape[1]} RoIs, {output_size}x{output_size})"] = level_counts(features, boxes)
            return fn(features, boxes, output_size, *args, **kwargs)

        return wrapped

    mrcnn.roi_heads.multilevel_roi_align = spy("box", originals[0])
    mrcnn.mask_head.multilevel_roi_align = spy("mask", originals[1])
    try:
        with torch.inference_mode():
            model(batch)
    finally:
        mrcnn.roi_heads.multilevel_roi_align, mrcnn.mask_head.multilevel_roi_align = originals
    return seen


def measure_model(preset: str, rounds: int) -> dict:
    cfg = get_config(preset)
    with timing.Stopwatch() as loading:
        model = load_torchvision_weights(MaskRCNN(cfg).eval(), synthetic_weights(cfg, seed=0))
    weights_s = loading.seconds
    image_hw = MODEL_IMAGES[preset]
    batch = to_image_batch(textured_images((image_hw,), seed=0), cfg)
    torch.set_num_threads(2)
    outs = {}
    for threaded in (False, True):  # warm-up, and the outputs must not depend on the setting
        parallel.THREADED = threaded
        with torch.inference_mode():
            model(batch)
            outs[threaded] = model(batch)
    same = all(torch.equal(a, b) for a, b in zip(outs[False], outs[True]))
    detections = int(outs[True].valid.sum())
    times: dict[str, list[float]] = {"off": [], "on": []}
    loads = []
    for r, order in timing.schedule(("off", "on"), "alternate", rounds):  # off on, then on off
        load_before = _load()
        for setting in order:
            parallel.THREADED = setting == "on"
            with torch.inference_mode():
                times[setting].append(timing.timed(model, batch)[0])
        loads.append([load_before, _load()])
        print(f"  model {preset} round {r + 1}/{rounds} load {loads[-1][1]:.1f}", flush=True)
    parallel.THREADED = True
    est, low, high = paired_ratio_ci(times["off"], times["on"])
    return {
        "preset": preset, "image": list(image_hw), "canvas": list(batch.tensors.shape[-2:]),
        "detections": detections, "outputs_equal_on_off": same, "weights_s": weights_s,
        "rois_per_level": model_levels(model, batch),
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "ratio_on_off": {"median": est, "ci95": [low, high], "rounds": rounds},
        "load_1min_per_round": loads, "times_s": times,
    }


def meta(command: str) -> dict:
    return {
        "command": command, "commit": vcs.output(store.REPO, "rev-parse", "--short", "HEAD"),
        "uncommitted": (vcs.output(store.REPO, "status", "--short", "--untracked-files=no") or "").splitlines(),
        "torch": torch.__version__, "torchvision": torchvision.__version__, "python": platform.python_version(),
        "cpu": store.cpu_model(), "cores": os.cpu_count(), "unix_time": round(time.time()),
        "load_1min_at_start": _load(),
    }


def _loads(rounds: list[list[float]]) -> str:
    flat = [x for pair in rounds for x in pair]
    return f"{statistics.median(flat):.1f} ({min(flat):.1f}-{max(flat):.1f})"


def _ratio(r: dict) -> str:
    return f"{r['median']:.3f} [{r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}]"


def report(out: Path) -> None:
    parts = {p: json.loads((out / f"roi_align_threads_{p}.json").read_text())
             for p in ("kernels", "model") if (out / f"roi_align_threads_{p}.json").exists()}
    (out / "roi_align_threads.json").write_text(json.dumps(parts, indent=1) + "\n")
    lines = ["# A two-core RoIAlign: torchvision's CPU kernel split into concurrent RoI chunks", ""]
    if "kernels" in parts:
        k = parts["kernels"]
        lines += [
            "## The op alone, at equal RoI counts", "",
            f"Command: `{k['meta']['command']}` (commit {k['meta']['commit']}, uncommitted: "
            f"{', '.join(k['meta']['uncommitted']) or 'none'}). {k['meta']['cpu']}, {k['meta']['cores']} cores, "
            f"torch {k['meta']['torch']}, torchvision {k['meta']['torchvision']}. Batch 1, sampling ratio 2; "
            "seconds per call (median of rounds); ratios: median of per-round ratios, 95% bootstrap interval. "
            "Load: 1-minute load average around the rounds, median (range); this process adds 1 to 2.",
            "",
            "| preset | RoIs (per level P2-P5) | pass | tv 1 thr | tv 2 thr, 1 call/level | tv 2 thr, 2 chunks "
            "| tensor 1 thr | tensor 2 thr | " + " | ".join(c[0] for c in COMPARISONS) + " | rounds | load |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in COMPARISONS)
            + " | ---: | --- |",
        ]
        for case in k["cases"]:
            for d in ("forward", "backward"):
                c = case[d]
                med = c["median_s"]
                rounds = next(iter(c["ratios"].values()))["rounds"]
                lines.append(
                    f"| {c['preset']} ({c['channels']} ch) | {c['kind']} {c['output_size']}x{c['output_size']}: "
                    f"{c['rois']} ({', '.join(map(str, c['rois_per_level']))}) | {d} | "
                    + " | ".join(f"{med[name]:.4f}" for name, *_ in VARIANTS) + " | "
                    + " | ".join(_ratio(c["ratios"][label]) for label, *_ in COMPARISONS)
                    + f" | {rounds} | {_loads(c['load_1min_per_round'])} |"
                )
        lines.append("")
    if "model" in parts:
        m = parts["model"]
        lines += [
            "## The whole model, static eager, threaded kernel off and on", "",
            f"Command: `{m['meta']['command']}` (commit {m['meta']['commit']}, uncommitted: "
            f"{', '.join(m['meta']['uncommitted']) or 'none'}). `model(batch)` under inference_mode, 2 threads, "
            "synthetic weights (seed 0), one textured image; off and on alternate call by call.",
            "",
            "| preset | image (canvas) | detections | model's RoIs per level P2-P5 | off: median s | on: median s "
            "| on / off [95% CI] | rounds | outputs equal | load |",
            "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | --- | --- |",
        ]
        for c in m["cases"]:
            levels = "; ".join(f"{name}: {', '.join(map(str, v))}" for name, v in c["rois_per_level"].items())
            lines.append(
                f"| {c['preset']} | {c['image'][0]}x{c['image'][1]} ({c['canvas'][0]}x{c['canvas'][1]}) "
                f"| {c['detections']} | {levels} | {c['median_s']['off']:.3f} | {c['median_s']['on']:.3f} "
                f"| {_ratio(c['ratio_on_off'])} | {c['ratio_on_off']['rounds']} | {c['outputs_equal_on_off']} "
                f"| {_loads(c['load_1min_per_round'])} |"
            )
        lines.append("")
    (out / "roi_align_threads.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("kernels", "model", "report"))
    parser.add_argument("--rounds", type=int, default=None, help="kernels: 20, model: 15")
    parser.add_argument("--presets", default="tiny,coco_r50_fpn")
    parser.add_argument("--out", type=Path, default=Path("results/levers"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    presets = args.presets.split(",")
    if args.part != "report":
        rounds = args.rounds or (20 if args.part == "kernels" else 15)
        command = (f"python bench/studies/cpu_levers/roi_align_threads.py {args.part} --rounds {rounds} "
                   f"--presets {args.presets}")
        info = meta(command)
        torch.manual_seed(0)
        if args.part == "kernels":
            cases = [measure_case(p, kind, rounds) for p in presets for kind in ROI_KINDS]
        else:
            cases = [measure_model(p, rounds) for p in presets]
        info["load_1min_at_end"] = _load()
        (args.out / f"roi_align_threads_{args.part}.json").write_text(
            json.dumps({"meta": info, "cases": cases}, indent=1) + "\n"
        )
    report(args.out)


if __name__ == "__main__":
    main()
