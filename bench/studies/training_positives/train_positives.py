"""How many sampled positives the mask branch trains on: the data behind ``mask_train_buckets``.

    python bench/studies/training_positives/train_positives.py [--checkpoints out/acc10/ci-s0/checkpoint_0001200.pt ...]
        [--buckets 4,8] [--epochs 2] [--out results/training/train_positives]

For the ``ci`` recipe's config and training set, at the seeded initial weights and at each given
checkpoint (``mrcnn train`` output), runs the training forward's first stage
(``MaskRCNN.box_training_stage``, no gradients) over ``--epochs`` epochs of the recipe's own loader
(batch 4, shuffled with the recipe's seed) and records, per batch, each image's sampled-positive
count and the batch's largest. That largest count picks the mask branch's bucket; the report gives
its distribution, the bucket each batch takes for ``--buckets`` (the positive quota appended), and
the mean mask-branch slots per image against the quota's: one bucket per image as the largest
count asks, and with the batch's positives packed into one row (B x the bucket of ceil(total / B),
B the loader's batch size, padding images included: what ``StagedTrainer`` does since df19276).

Writes ``OUT.json`` (every batch's counts) and ``OUT.md``. ``--resummarise`` rewrites both from the
counts ``OUT.json`` holds, without running the model (its checkpoints need not exist any more).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

import torch

from mrcnn.data.collate import make_loader
from mrcnn.engine.adapters import make_adapter
from mrcnn.engine.checkpoint import load_checkpoint, seed_everything
from mrcnn.engine.launch import load_split
from mrcnn.model import MaskRCNN
from mrcnn.recipes import get_recipe
from mrcnn.staged import mask_bucket

RECIPE = "ci"


def batch_counts(model: MaskRCNN, loader, adapter, epochs: int) -> list[list[int]]:
    """Each batch's per-image sampled-positive counts (images of the batch that are padding: left out)."""
    out = []
    with torch.no_grad():
        for _ in range(epochs):
            for item in loader:
                batch = adapter.prepare(item, torch.device("cpu"))
                images, targets = batch.inputs
                _, _, rois, _ = model.box_training_stage(images, targets)
                counts = rois.positive.sum(1)[images.valid].tolist()
                out.append([int(c) for c in counts])
    return out


def summarise(name: str, batches: list[list[int]], buckets: tuple[int, ...], batch_size: int) -> dict:
    largest = [max(b) for b in batches]
    packed = [mask_bucket(buckets, -(-sum(b) // batch_size)) for b in batches]
    used = Counter(mask_bucket(buckets, n) for n in largest)
    per_image = [c for b in batches for c in b]
    return {
        "weights": name,
        "batches": len(batches),
        "per_image_median": statistics.median(per_image),
        "per_image_max": max(per_image),
        "batch_max_median": statistics.median(largest),
        "batch_max_p90": sorted(largest)[int(0.9 * (len(largest) - 1))],
        "batch_max_max": max(largest),
        "bucket_use": {str(k): used[k] for k in buckets},
        "mean_slots": sum(mask_bucket(buckets, n) for n in largest) / len(largest),
        "mean_packed_slots": sum(packed) / len(packed),
        "quota": buckets[-1],
        "counts": batches,
    }


def _measure(recipe, cfg, options, checkpoints: list[Path], epochs: int) -> list[dict]:
    """Each weights' summary: the seeded initial weights, then every checkpoint."""
    dataset = load_split(recipe.prepare_data(), "train", cfg)
    adapter = make_adapter(options.impl, cfg)
    loader = make_loader(dataset, cfg, options.batch_size, shuffle=True, seed=options.seed)
    seed_everything(options.seed)
    model = MaskRCNN(cfg).train()
    slots, size = cfg.mask_train_slots, options.batch_size
    rows = [summarise("initial (seed 0)", batch_counts(model, loader, adapter, epochs), slots, size)]
    for path in checkpoints:
        model.load_state_dict(load_checkpoint(path)["model"])
        rows.append(summarise(str(path), batch_counts(model, loader, adapter, epochs), slots, size))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", nargs="*", type=Path, default=[])
    parser.add_argument("--buckets", default="4,8", help="mask_train_buckets to report, comma list")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/training/train_positives"))
    parser.add_argument("--resummarise", action="store_true", help="rewrite OUT.json and OUT.md from its counts")
    args = parser.parse_args()
    torch.set_num_threads(1)

    recipe = get_recipe(RECIPE)
    buckets = tuple(int(b) for b in args.buckets.split(","))
    cfg = recipe.config(mask_train_buckets=buckets)
    options = recipe.train_config()
    if args.resummarise:
        stored = json.loads(args.out.with_suffix(".json").read_text())["rows"]
        rows = [summarise(r["weights"], r["counts"], cfg.mask_train_slots, options.batch_size) for r in stored]
    else:
        rows = _measure(recipe, cfg, options, args.checkpoints, args.epochs)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"recipe": RECIPE, "buckets": cfg.mask_train_slots,
                                                          "rows": rows}, indent=1) + "\n")
    lines = [
        f"# Sampled positives per training batch, `{RECIPE}` recipe (batch {options.batch_size}, "
        f"positive quota {cfg.mask_positive_quota} per image), {args.epochs} epochs of its loader",
        "",
        "| weights | batches | positives per image (median / max) | batch's largest (median / p90 / max) "
        f"| batches per bucket {cfg.mask_train_slots} | mean mask slots per image | of the quota "
        "| packed: mean slots per image | of the quota |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        use = ", ".join(f"{k}: {v}" for k, v in r["bucket_use"].items())
        lines.append(
            f"| {r['weights']} | {r['batches']} | {r['per_image_median']:g} / {r['per_image_max']} "
            f"| {r['batch_max_median']:g} / {r['batch_max_p90']} / {r['batch_max_max']} | {use} "
            f"| {r['mean_slots']:.1f} | {r['mean_slots'] / r['quota']:.2f} "
            f"| {r['mean_packed_slots']:.1f} | {r['mean_packed_slots'] / r['quota']:.2f} |"
        )
    command = ["python bench/studies/training_positives/train_positives.py", f"--buckets {args.buckets}",
               f"--epochs {args.epochs}"]
    if args.checkpoints:
        command.append("--checkpoints " + " ".join(map(str, args.checkpoints)))
    if args.resummarise:
        command.append("--resummarise")
    lines += ["", "    " + " ".join(command)]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
