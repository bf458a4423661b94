"""Detections on canvases larger than torchvision's padding, and what masking costs.

    python bench/studies/padding_parity/padding_parity.py parity [--preset coco_r50_fpn] [--seeds 0,1,2]
        [--calibrate-on-photos] [--out DIR]
    python bench/studies/padding_parity/padding_parity.py cost   [--preset coco_r50_fpn] [--rounds 30] [--out DIR]

``parity``: for sample photographs (matplotlib's sample data) cropped and resized to every size
whose extent (resized size rounded up to ``size_divisible``) is smaller than its canvas bucket
(1, 15 and 31 px below a multiple of 32, portrait and landscape), compares ``MaskRCNN.predict``
with torchvision's Mask R-CNN (same weights: ``--weights`` or ``synthetic_weights(cfg, seed)``),
with masking on and off, for both op impls. Each is matched against torchvision as shipped and
against torchvision with equal scores ordered by index (``mrcnn.parity.torchvision_stable_ties``):
a case is "tie-sensitive" when those two torchvision results differ, i.e. when torchvision's own
answer depends on how its unstable sort orders exactly equal scores. One JSON line per (seed,
photo, size, impl, masking) goes to ``DIR/parity.jsonl`` as soon as it is measured; a rerun skips
the lines already there, so an interrupted run resumes. ``DIR/parity_summary.json`` aggregates them.
``--calibrate-on-photos`` adds the two photographs to the weights' calibration batch: with
ResNet-50's depth the default batch still lets seeds 1 and 2 saturate on them.

``cost``: latency of the static model with and without masking, eager and inductor
(``torch.compile(fullgraph=True)``), interleaved round by round in one process (A B B A ...) on one
batch of textured images; each timed call appends to ``DIR/cost.jsonl`` (rerun: rounds already
there are skipped); ``DIR/cost_summary.json`` holds the medians and, per mode, the median of the
per-round ratio masked / unmasked with its 95% bootstrap interval. Run it on an idle machine.

The defaults follow the issue: coco_r50_fpn with min_size 320, max_size 533.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the studies' shared modules (studies.*)

import torch
from studies.onoff import done_keys, paired, run_rounds, seconds_by_round
from studies.padding_parity.padding_inputs import PHOTOS, build_config, photo

from mrcnn.backbone import padded_extents
from mrcnn.config import Config
from mrcnn.model import MaskRCNN
from mrcnn.parity import match_detections, same_detections, torchvision_stable_ties
from mrcnn.reference import torchvision_model
from mrcnn.transform import resized_size, select_canvas, to_image_batch
from mrcnn.weights import calibration_images, load_torchvision_weights, synthetic_weights, textured_images
from mrcnn_bench.running.journal import read_lines

DELTAS = (1, 15, 31)


def off_canvas_sizes(cfg: Config) -> list[tuple[int, int]]:
    """Resized sizes (scale 1 under the transform) whose extent is smaller than their canvas."""
    d = cfg.size_divisible
    found = []
    for canvas_h, canvas_w in cfg.canvases:
        for extent in range(max(canvas_h, canvas_w) - d, 0, -d)[:2]:
            for delta in DELTAS:
                side = extent - delta
                for size in ((cfg.min_size, side), (side, cfg.max_size)):
                    for h, w in (size, size[::-1]):
                        if h <= 0 or w <= 0 or resized_size(h, w, cfg) != (h, w) or (h, w) in found:
                            continue
                        ext = tuple(padded_extents(torch.tensor([h, w]), d).tolist())
                        if ext != select_canvas([(h, w)], cfg):
                            found.append((h, w))
    return found


def _weights(cfg: Config, path: str | None, seed: int, with_photos: bool = False) -> dict:
    """``--weights``, else ``synthetic_weights``; ``with_photos`` adds the sample photographs to its
    calibration batch (at COCO depth the default batch still lets some seeds saturate on photos)."""
    if path:
        return torch.load(path, map_location="cpu", weights_only=True)
    if not with_photos:
        return synthetic_weights(cfg, seed)
    size = (cfg.min_size, int(cfg.min_size * 1.3))
    return synthetic_weights(cfg, seed, calibration_images(cfg, seed) + [photo(name, size) for name in PHOTOS])


def run_parity(cfg: Config, opts: argparse.Namespace) -> None:
    out = opts.out / "parity.jsonl"
    done = done_keys(out)
    sizes = off_canvas_sizes(cfg)[: opts.limit or None]
    for seed in opts.seeds:
        weights = None
        for i, size in enumerate(sizes):
            name = PHOTOS[i % len(PHOTOS)]
            keys = {(impl, m): f"{seed}:{name}:{size[0]}x{size[1]}:{impl}:{m}" for impl in opts.impls for m in (1, 0)}
            if all(k in done for k in keys.values()):
                continue
            weights = weights or _weights(cfg, opts.weights, seed, opts.calibrate_on_photos)
            tv = torchvision_model(cfg).eval()
            tv.load_state_dict(weights)
            image = photo(name, size)
            with torch.no_grad():
                ref = tv([image])[0]
                with torchvision_stable_ties():
                    ref_stable = tv([image])[0]
            for (impl, masked), key in keys.items():
                if key in done:
                    continue
                model = MaskRCNN(cfg.replace(ops_impl=impl, mask_padding=bool(masked))).eval()
                det = load_torchvision_weights(model, weights).predict([image])[0]
                p, q = match_detections(ref, det), match_detections(ref_stable, det)
                row = dict(key=key, seed=seed, photo=name, size=size, impl=impl, mask_padding=bool(masked),
                           num_ref=p.num_ref, num_other=p.num_other, matched=p.matched,
                           mean_mask_iou=float(p.mask_ious.mean()) if p.matched else None,
                           tie_sensitive=not same_detections(ref, ref_stable),
                           num_ref_stable=q.num_ref, matched_stable=q.matched,
                           mean_mask_iou_stable=float(q.mask_ious.mean()) if q.matched else None)  # fmt: skip
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
    summarize_parity(out, opts.out / "parity_summary.json")


def summarize_parity(path: Path, dest: Path) -> None:
    """Per (impl, masking): parity against torchvision as shipped, and against torchvision with equal
    scores ordered by index (``torchvision_stable_ties``), over all cases and over the cases whose
    torchvision result does not depend on that order."""
    rows = read_lines(path)
    summary = {}
    for impl, masked in sorted({(r["impl"], r["mask_padding"]) for r in rows}):
        sel = [r for r in rows if r["impl"] == impl and r["mask_padding"] == masked]
        entry = {"cases": len(sel), "tie_sensitive_cases": sum(bool(r.get("tie_sensitive")) for r in sel)}
        entry["vs torchvision"] = _parity_totals(sel, "num_ref", "matched", "mean_mask_iou")
        if all("matched_stable" in r for r in sel):
            entry["vs torchvision, ties by index"] = _parity_totals(
                sel, "num_ref_stable", "matched_stable", "mean_mask_iou_stable"
            )
            untied = [r for r in sel if not r["tie_sensitive"]]
            if untied:
                entry["vs torchvision, tie-free cases"] = _parity_totals(untied, "num_ref", "matched", "mean_mask_iou")
        summary[f"{impl}, mask_padding={masked}"] = entry
    dest.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


def _parity_totals(rows: list[dict], num_ref: str, matched: str, iou: str) -> dict:
    """Detections matched both ways over ``rows``, the worst case, and the mean of per-case mask IoUs."""
    n_ref, n_other = sum(r[num_ref] for r in rows), sum(r["num_other"] for r in rows)
    hits = sum(r[matched] for r in rows)
    ious = [r[iou] for r in rows if r[iou] is not None]
    return dict(
        num_ref=n_ref, num_other=n_other,
        ref_matched=hits / max(n_ref, 1), other_matched=hits / max(n_other, 1),
        worst_case_matched=min(r[matched] / max(r[num_ref], r["num_other"], 1) for r in rows),
        mean_mask_iou=statistics.fmean(ious) if ious else None,
    )  # fmt: skip


def run_cost(cfg: Config, opts: argparse.Namespace) -> None:
    """Interleaved latency of masked vs unmasked, eager and inductor, on one off-canvas batch."""
    out = opts.out / "cost.jsonl"
    size = off_canvas_sizes(cfg)[0]
    weights = _weights(cfg, opts.weights, 0)
    batch = to_image_batch(textured_images((size,) * opts.batch_size, seed=0), cfg)
    variants = {}
    for mode in opts.modes:
        for masked in (True, False):
            model = load_torchvision_weights(MaskRCNN(cfg.replace(mask_padding=masked)).eval(), weights)
            fn = torch.compile(model, fullgraph=True) if mode == "inductor" else model
            with torch.no_grad():
                for _ in range(opts.warmup):
                    fn(batch)
            variants[f"{mode}:mask_padding={masked}"] = fn
    names = list(variants)
    with torch.no_grad():
        run_rounds({n: lambda fn=fn: fn(batch) for n, fn in variants.items()}, opts.rounds, out)
    rows = read_lines(out)
    seconds = {n: seconds_by_round(rows, n) for n in names}
    summary = {
        "canvas": list(batch.tensors.shape[-2:]), "size": list(size), "batch_size": opts.batch_size,
        "threads": torch.get_num_threads(), "loadavg_1min_at_end": os.getloadavg()[0],
        "median_seconds": {n: statistics.median(seconds[n].values()) for n in names},
        "samples": {n: len(seconds[n]) for n in names},
    }  # fmt: skip
    for mode in opts.modes:  # masked / unmasked per round: the drift of the machine cancels
        pair = paired(rows, f"{mode}:mask_padding=False", f"{mode}:mask_padding=True")
        summary[f"{mode}: masked / unmasked"] = {k: pair[k] for k in ("median_ratio", "ci95", "rounds")}
    (opts.out / "cost_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("parity", "cost"))
    parser.add_argument("--preset", default="coco_r50_fpn")
    parser.add_argument("--min-size", type=int, default=320)
    parser.add_argument("--max-size", type=int, default=533)
    parser.add_argument("--weights", default=None, help="torchvision Mask R-CNN state_dict (default: synthetic)")
    parser.add_argument("--seeds", default="0,1,2", help="synthetic-weight seeds (parity)")
    parser.add_argument(
        "--calibrate-on-photos", action="store_true",
        help="add the sample photographs to synthetic_weights' calibration batch (parity)",
    )  # fmt: skip
    parser.add_argument("--impls", default="torchvision,tensor", help="ops_impl values (parity)")
    parser.add_argument("--limit", type=int, default=0, help="first N sizes only (0: all; parity)")
    parser.add_argument("--modes", default="eager,inductor", help="cost: eager and/or inductor")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("results/padding_parity"))
    opts = parser.parse_args()
    opts.seeds = [int(s) for s in opts.seeds.split(",")]
    opts.impls, opts.modes = opts.impls.split(","), opts.modes.split(",")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    opts.out.mkdir(parents=True, exist_ok=True)
    cfg = build_config(opts.preset, opts.min_size, opts.max_size)
    (run_parity if opts.what == "parity" else run_cost)(cfg, opts)


if __name__ == "__main__":
    main()
