"""Does bf16 inference cost accuracy? COCO AP of a trained checkpoint, fp32 against bf16 autocast.

    python bench/studies/bf16_accuracy/bf16_accuracy.py [--images 240] [--seed 1] [--out results/bf16_accuracy]

The checkpoint is the asv accuracy fixture (``make asv-fixture``: torchvision's Mask R-CNN trained
on the ``ci`` recipe's 48 synthetic images, data seed 0). It is scored on ``--images`` synthetic
images from another seed (default 1), which it never trained on, generated once beside the fixture
(outside git). Rows, each scored by pycocotools (AP@[.5:.95], boxes and masks):

- static eager and static inductor (``torch.compile(fullgraph=True, dynamic=False)``), in fp32
  and under ``torch.autocast("cpu", bfloat16)``: the library's own evaluation
  (:func:`mrcnn.engine.evaluation.evaluate`, the recipe's config);
- torchvision's model with the same weights, eager fp32 and bf16, for scale.

The verdict per compiler: bf16 AP minus fp32 AP, boxes and masks, against the goal |difference| <=
0.005. Both runs score the same images, so the difference carries no sampling noise of its own;
it says how far bf16's rounding moves this model's AP on this image set. Writes
``OUT/bf16_accuracy.json`` and ``OUT/bf16_accuracy.md``; rows already in the JSON are kept
(a rerun resumes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402

from mrcnn.data.coco import CocoDataset  # noqa: E402
from mrcnn.engine.data import ensure_synthetic  # noqa: E402
from mrcnn.engine.evaluation import evaluate, evaluate_torchvision  # noqa: E402
from mrcnn.model import MaskRCNN  # noqa: E402
from mrcnn.recipes import get_recipe  # noqa: E402
from mrcnn.reference import torchvision_model  # noqa: E402
from mrcnn.weights import load_torchvision_weights  # noqa: E402
from mrcnn_bench.base import timing, vcs  # noqa: E402
from mrcnn_bench.base.files import atomic_write  # noqa: E402
from mrcnn_bench.history.fixed_accuracy import Fixture  # noqa: E402
from mrcnn_bench.running import store  # noqa: E402

GOAL = 0.005  # |bf16 AP - fp32 AP|, boxes and masks
ROWS = (  # (model, compiler, precision)
    ("static", "eager", "fp32"), ("static", "eager", "bf16"),
    ("static", "inductor", "fp32"), ("static", "inductor", "bf16"),
    ("torchvision", "eager", "fp32"), ("torchvision", "eager", "bf16"),
)  # fmt: skip
DEVICE = torch.device("cpu")


def score(row: tuple[str, str, str], state: dict[str, torch.Tensor], recipe: str, dataset: CocoDataset) -> dict:
    """One row's COCO metrics and wall seconds (compilation included for inductor)."""
    kind, compiler, precision = row
    cfg = get_recipe(recipe).config()
    amp = "bf16" if precision == "bf16" else "none"
    wall = timing.Stopwatch()
    if kind == "torchvision":
        model = torchvision_model(cfg)
        model.load_state_dict(state)
        metrics = evaluate_torchvision(model, dataset, batch_size=2, device=DEVICE, amp=amp)
    else:
        model = load_torchvision_weights(MaskRCNN(cfg), state).eval()
        if compiler == "inductor":
            torch._dynamo.reset()
            model = torch.compile(model, fullgraph=True, dynamic=False)
        metrics = evaluate(model, dataset, cfg, batch_size=2, device=DEVICE, amp=amp)
    return {"box_ap": metrics["bbox/AP"], "mask_ap": metrics["segm/AP"], "seconds": wall.elapsed()}


def verdicts(rows: dict[str, dict]) -> list[dict[str, Any]]:
    """bf16 minus fp32 per (model, compiler) with both rows present."""
    out = []
    for kind, compiler, precision in ROWS:
        fp32, bf16 = rows.get(f"{kind}/{compiler}/fp32"), rows.get(f"{kind}/{compiler}/bf16")
        if precision != "bf16" or not (fp32 and bf16):
            continue
        box, mask = bf16["box_ap"] - fp32["box_ap"], bf16["mask_ap"] - fp32["mask_ap"]
        out.append({"rows": f"{kind}/{compiler}", "box_ap_diff": box, "mask_ap_diff": mask,
                    "met": abs(box) <= GOAL and abs(mask) <= GOAL})  # fmt: skip
    return out


def markdown(summary: dict[str, Any]) -> str:
    lines = [
        "# bf16 inference judged by accuracy: COCO AP, fp32 against bf16 autocast",
        "",
        f"Command: `{summary['command']}`. Commit {summary['commit']}; torch {summary['torch']}, "
        f"{summary['threads']} threads, {summary['cpu']}; {summary['date']}.",
        "",
        f"Checkpoint: the asv accuracy fixture (`{summary['fixture']['recipe']}` recipe, sha256 "
        f"{summary['fixture']['model_sha256'][:12]}), scored on {summary['images']} held-out synthetic images "
        f"(seed {summary['seed']}, {summary['objects']} objects) by pycocotools, AP@[.5:.95].",
        "",
        "| model | compiler | precision | box AP | mask AP | seconds |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in summary["rows"].items():
        kind, compiler, precision = name.split("/")
        lines.append(
            f"| {kind} | {compiler} | {precision} | {r['box_ap']:.4f} | {r['mask_ap']:.4f} | {r['seconds']:.0f} |"
        )
    lines += ["", f"bf16 minus fp32 (goal: both within {GOAL}):", ""]
    lines += [f"- {v['rows']}: box AP {v['box_ap_diff']:+.4f}, mask AP {v['mask_ap_diff']:+.4f}: "
              f"{'met' if v['met'] else '**missed**'}" for v in summary["verdicts"]]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=240, help="held-out images (default 240)")
    parser.add_argument("--seed", type=int, default=1, help="their seed; the fixture trained on seed 0 (default 1)")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "bf16_accuracy")
    args = parser.parse_args(argv)
    fixture = Fixture.default()
    if fixture.missing_reason():
        print(f"error: {fixture.missing_reason()}", file=sys.stderr)
        return 2
    meta = json.loads(fixture.meta.read_text())
    if args.seed == 0 or args.images < 1:
        parser.error("--seed 0 is the fixture's training seed, and --images must be positive")
    root = fixture.root / f"heldout-{args.images}-s{args.seed}"
    ensure_synthetic(root, "val", args.images, args.seed)
    dataset = CocoDataset(root, "val")
    state = torch.load(fixture.model, map_location="cpu", weights_only=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "bf16_accuracy.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    same = old.get("images") == args.images and old.get("seed") == args.seed
    rows: dict[str, dict] = dict(old.get("rows", {})) if same else {}
    summary: dict[str, Any] = {
        "command": " ".join(["python bench/studies/bf16_accuracy/bf16_accuracy.py", *(argv or sys.argv[1:])]),
        "commit": vcs.output(store.REPO, "rev-parse", "--short", "HEAD"), "torch": torch.__version__,
        "threads": torch.get_num_threads(), "cpu": f"{store.cpu_model()} x{os.cpu_count()}",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "fixture": {k: meta[k] for k in ("recipe", "model_sha256")},
        "images": args.images, "seed": args.seed, "objects": len(dataset.coco.getAnnIds()), "goal": GOAL,
    }  # fmt: skip
    for row in ROWS:
        name = "/".join(row)
        if name in rows:
            continue
        print(f"scoring {name} on {args.images} images ...", file=sys.stderr, flush=True)
        rows[name] = score(row, state, meta["recipe"], dataset)
        print(f"{name}: box AP {rows[name]['box_ap']:.4f}, mask AP {rows[name]['mask_ap']:.4f}", file=sys.stderr)
        summary.update(rows=rows, verdicts=verdicts(rows))
        atomic_write(path, json.dumps(summary, indent=1) + "\n")
    atomic_write(args.out / "bf16_accuracy.md", markdown(summary))
    print(markdown(summary))
    return 0 if all(v["met"] for v in summary["verdicts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
