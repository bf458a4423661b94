"""What does a static training step keep for its backward pass, module by module, with and without
``activation_checkpointing``?

    python bench/studies/training_memory/saved_by_module.py [--preset coco_r50_fpn --image-size 320x427 --set K=V ...]
        --out results/levers/activation_checkpointing/saved_by_module.md

One training forward of the static model (batch 2, synthetic weights and targets) under
``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd saves for the backward pass is
counted, in bytes, against the top-level module (``backbone``, ``rpn.head``, ``roi_heads.box_head``,
...) whose forward was running. Exact and machine-independent (no timer, no allocator): what the
memory lever can remove, beside the peak resident memory the harness measures.
"""

from __future__ import annotations

import argparse
import collections
import json
import shlex
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: tests.helpers

from mrcnn.config import get_config
from mrcnn.model import MaskRCNN
from mrcnn.overrides import parse_override
from mrcnn.transform import to_image_batch
from mrcnn.weights import synthetic_weights, textured_images
from mrcnn_bench.base.files import atomic_write
from tests.helpers.training import random_targets

BATCH_OBJECTS = [5, 3]  # ground-truth objects of the two images


def saved_bytes(cfg, weights, size: tuple[int, int]) -> dict[str, int]:
    """{module: bytes autograd saved while its forward ran} for one training forward of batch 2."""
    model = MaskRCNN(cfg).train()
    model.load_state_dict(weights)
    running: list[str] = []
    for name, child in model.named_children():  # the backbone whole, the heads one by one
        parts = [("backbone", child)] if name == "backbone" else [(f"{name}.{s}", m) for s, m in child.named_children()]
        for label, module in parts:
            module.register_forward_pre_hook(lambda m, a, label=label: running.append(label))
            module.register_forward_hook(lambda m, a, o: running.pop() and None)
    kept: collections.Counter[str] = collections.Counter()

    def keep(t: torch.Tensor) -> torch.Tensor:
        kept[running[-1] if running else "outside the modules (glue, losses)"] += t.numel() * t.element_size()
        return t

    batch = to_image_batch(textured_images((size, size), seed=2), cfg)
    torch.manual_seed(0)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(batch, random_targets(cfg, batch, BATCH_OBJECTS, seed=0))
    return dict(kept)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="coco_r50_fpn")
    p.add_argument("--image-size", default="320x427", help="HxW of both images (default: %(default)s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], type=parse_override, metavar="K=V")
    p.add_argument("--out", required=True, type=Path, help="markdown table; the JSON beside it")
    args = p.parse_args(argv)
    size = tuple(int(s) for s in args.image_size.split("x"))
    cfg = get_config(args.preset, **dict(args.overrides))
    weights = synthetic_weights(cfg, seed=0)
    runs = {on: saved_bytes(cfg.replace(activation_checkpointing=on), weights, size) for on in (False, True)}
    modules = sorted(runs[False], key=lambda m: -runs[False][m])
    lines = [f"# Bytes saved for the backward pass: {args.preset}, batch 2 at {args.image_size}",
             "", f"`python {shlex.join(sys.argv)}`", "",
             "| module | MB kept | with activation_checkpointing |", "| --- | --- | --- |"]
    lines += [f"| {m} | {runs[False][m] / 1e6:.0f} | {runs[True].get(m, 0) / 1e6:.0f} |" for m in modules]
    totals = [sum(r.values()) / 1e6 for r in (runs[False], runs[True])]
    lines.append(f"| **total** | **{totals[0]:.0f}** | **{totals[1]:.0f}** ({totals[1] / totals[0]:.2f}x) |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, "\n".join(lines) + "\n")
    atomic_write(args.out.with_suffix(".json"), json.dumps({str(k): v for k, v in runs.items()}, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
