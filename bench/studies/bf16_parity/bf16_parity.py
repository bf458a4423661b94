"""Which stage moves the static model's detections under bf16 autocast?

    python bench/studies/bf16_parity/bf16_parity.py [--preset tiny] [--out results/levers]

Against torchvision's model in fp32 (same calibrated ``synthetic_weights``, seed 0), on the stream
of ``mrcnn-bench run``'s default workload (tiny: its 8 sizes; coco_r50_fpn: one 480x640 and one
640x480 image of the synthetic data set), the static model's ``predict`` under
``torch.autocast("cpu", bfloat16)`` with chosen parts kept in fp32 (their convolutions and linear
layers run with autocast off, on fp32 inputs), matched both ways at four criteria (label, box IoU
and score tolerance; the harness's parity is the first). Two rows frame it: torchvision itself under
the same autocast (what bf16 does to the reference model), and the static model in bf16 against
torchvision in bf16 (the two implementations at the same precision). Writes
``OUT/bf16_parity_<preset>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from mrcnn.config import get_config
from mrcnn.model import MaskRCNN
from mrcnn.parity import match_detections
from mrcnn.reference import torchvision_model
from mrcnn.weights import load_torchvision_weights, synthetic_weights
from mrcnn_bench.running.cases import stream_sizes
from mrcnn_bench.running.context import stream_images

CRITERIA = ((0.9, 0.02), (0.9, 0.05), (0.8, 0.05), (0.5, 0.1))  # (box IoU at least, score within)
HEADS = ("rpn.head", "roi_heads.box_head", "roi_heads.box_predictor", "roi_heads.mask_head",
         "roi_heads.mask_predictor")
# Parts kept in fp32, by module-name prefix (every Conv2d / Linear under it: the backbone's masked
# forward calls its convolutions directly, not the stages' own forward).
VARIANTS: dict[str, tuple[str, ...]] = {
    "bf16 as shipped": (),
    "heads fp32": HEADS,
    "FPN + heads fp32": ("backbone.fpn", *HEADS),
    "stem conv fp32": ("backbone.body.conv1",),
    "stem + layer1 fp32": ("backbone.body.conv1", "backbone.body.layer1"),
    "stem + layer1 + FPN + heads fp32": ("backbone.body.conv1", "backbone.body.layer1", "backbone.fpn", *HEADS),
    "layer3 + layer4 + FPN + heads fp32": ("backbone.body.layer3", "backbone.body.layer4", "backbone.fpn", *HEADS),
    "everything fp32 (control)": ("backbone", "rpn", "roi_heads"),
}


def keep_fp32(module: nn.Module) -> None:
    """``module`` runs with autocast off, on fp32 copies of its floating inputs."""
    forward = module.forward

    def fp32_forward(*args):
        with torch.autocast("cpu", enabled=False):
            return forward(*(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args))

    module.forward = fp32_forward


def leaves(model: nn.Module, prefixes: tuple[str, ...]) -> list[nn.Module]:
    return [m for name, m in model.named_modules()
            if isinstance(m, (nn.Conv2d, nn.Linear)) and any(name.startswith(p) for p in prefixes)]


def parity(ref: list[dict], out: list[dict]) -> dict[str, float]:
    rates = {}
    for iou, tol in CRITERIA:
        ps = [match_detections(r, o, iou_min=iou, score_tol=tol) for r, o in zip(ref, out, strict=True)]
        n_ref, n_out, matched = (sum(getattr(p, k) for p in ps) for k in ("num_ref", "num_other", "matched"))
        rates[f"iou{iou}_tol{tol}"] = min(matched / max(n_ref, 1), matched / max(n_out, 1))
    ps = [match_detections(r, o) for r, o in zip(ref, out, strict=True)]
    ious = torch.cat([p.mask_ious for p in ps])
    rates["mask_iou"] = float(ious.mean()) if ious.numel() else float("nan")
    rates["detections"] = float(sum(p.num_other for p in ps))
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--out", type=Path, default=Path("results/levers"))
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    cfg = get_config(args.preset)
    weights = synthetic_weights(cfg, seed=0)
    sizes = stream_sizes(0, 8) if args.preset == "tiny" else ((480, 640), (640, 480))
    images = [image for image, _ in stream_images(sizes, 0)]
    tv = torchvision_model(cfg).eval()
    tv.load_state_dict(weights)
    bf16: Callable[[], torch.autocast] = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    with torch.no_grad():
        ref = [tv([im])[0] for im in images]
        with bf16():
            tv_bf16 = [tv([im])[0] for im in images]
    rows = {"torchvision bf16 vs torchvision fp32": parity(ref, tv_bf16)}
    for name, parts in VARIANTS.items():
        model = load_torchvision_weights(MaskRCNN(cfg).eval(), weights)
        for module in leaves(model, parts):
            keep_fp32(module)
        with torch.no_grad(), bf16():
            out = model.predict(images)
        rows[f"static, {name}"] = parity(ref, out)
        if name == "bf16 as shipped":
            rows["static bf16 vs torchvision bf16"] = parity(tv_bf16, out)
        print(name, rows[f"static, {name}"], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    head = ["| against torchvision fp32, unless named | " + " | ".join(f"IoU >= {i}, score +-{t}" for i, t in CRITERIA)
            + " | mask IoU | detections |", "| --- |" + " --- |" * (len(CRITERIA) + 2)]
    lines = [f"# bf16 parity by stage ({args.preset}, {len(images)} images: {sizes})", "",
             "`python bench/studies/bf16_parity/bf16_parity.py --preset " + args.preset + "`; "
             "matched both ways (the smaller of the two "
             "fractions), at four criteria; the harness's parity is the first.", "", *head]
    for name, r in rows.items():
        cells = " | ".join(f"{r[f'iou{i}_tol{t}']:.1%}" for i, t in CRITERIA)
        lines.append(f"| {name} | {cells} | {r['mask_iou']:.3f} | {r['detections']:.0f} |")
    (args.out / f"bf16_parity_{args.preset}.md").write_text("\n".join(lines) + "\n")
    (args.out / f"bf16_parity_{args.preset}.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
