"""Does torchvision's own model gain as much as the static one from folding its frozen batch norms?

    python bench/studies/cpu_levers/torchvision_fold.py [--size 427x640] [--rounds 12] [--out results/levers/fold_norms]

The static model folds the ResNet's frozen norms into its convolutions in eager on the CPU
(``Config.fold_batch_norm="auto"``). torchvision's model as shipped does not, and the harness's
rows run it as shipped. This study says how much of the static model's lead over torchvision eager
is the fold, by folding torchvision's model too (baked into its weights here: a study, not a
library path).

Four variants on one textured image of ``--size`` (``coco_r50_fpn``, ``box_score_thresh=0.75``,
``synthetic_weights(cfg, seed=0)``), each the whole call from the raw image: the static model's
``predict`` with ``fold_batch_norm=False`` and with the default; torchvision's model (its conv
weights in channels_last, as the harness's eager rows on the CPU) as shipped and folded. Every
round calls each once, the order reversed every other round, in one process
(:mod:`studies.onoff`; resumable). Writes ``OUT/torchvision_fold.jsonl`` and
``OUT/torchvision_fold.md``: the median per-round ratio with its 95% interval for each model
folded / unfolded, and static / torchvision with both unfolded and with both folded; the
detections of each variant against its unfolded self.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the studies' shared modules (studies.*)

import torch
from studies.onoff import paired, run_rounds
from torch import nn
from torchvision.ops import FrozenBatchNorm2d

from mrcnn.backbone import folded_conv
from mrcnn.config import get_config
from mrcnn.model import MaskRCNN
from mrcnn.reference import torchvision_model
from mrcnn.weights import load_torchvision_weights, synthetic_weights, textured_images
from mrcnn_bench.base import vcs
from mrcnn_bench.running import store
from mrcnn_bench.running.journal import read_lines

REPO = Path(__file__).resolve().parents[3]
PAIRS = (  # (label, denominator, numerator)
    ("static: folded / unfolded", "static:unfolded", "static:folded"),
    ("torchvision: folded / as shipped", "torchvision:shipped", "torchvision:folded"),
    ("static / torchvision, neither folded", "torchvision:shipped", "static:unfolded"),
    ("static / torchvision, both folded", "torchvision:folded", "static:folded"),
)


def fold_norms_in_place(body: nn.Module) -> int:
    """Fold every FrozenBatchNorm2d of a ResNet body into the convolution registered just before it
    (torchvision registers each norm after its conv), replacing the norm by an identity. -> count."""
    last_conv: nn.Conv2d | None = None
    folded = 0
    for name, module in list(body.named_modules()):
        if isinstance(module, nn.Conv2d):
            last_conv = module
        elif isinstance(module, FrozenBatchNorm2d) and last_conv is not None:
            with torch.no_grad():
                weight, bias = folded_conv(last_conv, module)  # the static model's fold, baked in
            last_conv.weight.data = weight
            last_conv.bias = nn.Parameter(bias)
            parent_name, _, child = name.rpartition(".")
            setattr(body.get_submodule(parent_name) if parent_name else body, child, nn.Identity())
            folded += 1
            last_conv = None
    return folded


def _detections(out: dict) -> dict:
    return {"n": len(out["boxes"]), "boxes": out["boxes"], "labels": out["labels"]}


def _agreement(a: dict, b: dict) -> dict:
    same = a["n"] == b["n"] and torch.equal(a["labels"], b["labels"])
    diff = float((a["boxes"] - b["boxes"]).abs().max()) if same and a["n"] else None
    return {"detections": [a["n"], b["n"]], "same_labels": same, "max_box_diff_px": diff}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="427x640", help="HxW of the textured image")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "results" / "levers" / "fold_norms")
    argv = sys.argv[1:] if argv is None else argv
    opts = parser.parse_args(argv)
    torch.set_num_threads(opts.threads)
    opts.out.mkdir(parents=True, exist_ok=True)
    size = tuple(int(s) for s in opts.size.split("x"))
    cfg = get_config("coco_r50_fpn", box_score_thresh=0.75)
    weights = synthetic_weights(cfg, seed=0)
    images = textured_images((size,), seed=1)
    static = {k: load_torchvision_weights(MaskRCNN(cfg.replace(fold_batch_norm=v)).eval(), weights)
              for k, v in (("unfolded", False), ("folded", "auto"))}  # fmt: skip
    reference = {}
    for state in ("shipped", "folded"):
        model = torchvision_model(cfg).eval()
        model.load_state_dict(weights)
        reference[state] = model.to(memory_format=torch.channels_last)
    norms = fold_norms_in_place(reference["folded"].backbone.body)
    calls = {f"static:{k}": (lambda m=m: m.predict(images)) for k, m in static.items()}
    calls |= {f"torchvision:{k}": (lambda m=m: m(images)) for k, m in reference.items()}
    with torch.no_grad():
        outputs = {name: _detections(call()[0]) for name, call in calls.items()}  # also the warm-up
        for call in calls.values():
            call()
        path = opts.out / "torchvision_fold.jsonl"
        run_rounds(calls, opts.rounds, path, prefix=f"{opts.size}:")
    rows = [r for r in read_lines(path) if r["key"].startswith(f"{opts.size}:")]
    summary = {
        "command": "python bench/studies/cpu_levers/torchvision_fold.py " + " ".join(argv),
        "commit": vcs.output(store.REPO, "rev-parse", "--short", "HEAD"),
        "cpu": f"{store.cpu_model()} x{os.cpu_count()}",
        "threads": torch.get_num_threads(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "size": opts.size, "torchvision_norms_folded": norms,
        "ratios": {label: paired(rows, off, on) for label, off, on in PAIRS},
        "parity": {"static": _agreement(outputs["static:folded"], outputs["static:unfolded"]),
                   "torchvision": _agreement(outputs["torchvision:folded"], outputs["torchvision:shipped"]),
                   "static vs torchvision, unfolded": _agreement(outputs["static:unfolded"],
                                                                 outputs["torchvision:shipped"])},
    }  # fmt: skip
    (opts.out / "torchvision_fold.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [f"`{summary['command']}` at {summary['commit']}, {summary['cpu']}, {summary['threads']} threads, "
             f"{summary['date']}; {opts.size}, thresh 0.75; {norms} torchvision norms folded.", "",
             "| ratio | rounds | median per-round ratio [95% CI] | median s (denominator, numerator) |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    for label, r in summary["ratios"].items():
        ci = r["ci95"] or [float("nan")] * 2
        lines.append(f"| {label} | {r['rounds']} | {r['median_ratio']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | "
                     f"{r['median_s_off']:.3f}, {r['median_s_on']:.3f} |")  # fmt: skip
    lines += ["", "Detections against the unfolded model: " + json.dumps(summary["parity"])]
    (opts.out / "torchvision_fold.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
