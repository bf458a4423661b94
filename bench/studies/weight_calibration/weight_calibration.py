"""Do calibrated random weights give spread scores on photographs? (the padding parity study's inputs)

    python bench/studies/weight_calibration/weight_calibration.py [--preset tiny] [--seeds 0,1,2]
        [--out results/weights]

For each calibration batch of ``synthetic_weights`` (textured images only, as before; the default
textured + white noise; the default plus the two sample photographs) and each seed, runs
torchvision's Mask R-CNN on the padding parity study's photographs (:mod:`studies.padding_parity.padding_inputs`)
at 320x416 and a textured image, and reports the RPN objectness logits (standard deviation,
maximum, how many pass 16.6, where fp32 sigmoid rounds to 1.0) and the detections (count, distinct
scores, scores equal to 1.0). Saturated scores make torchvision's own output depend on how its sort
orders ties, so parity on such weights measures tie-breaking. Writes ``OUT/calibration_<preset>.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the studies' shared modules (studies.*)

import pandas as pd
import torch
from studies.padding_parity.padding_inputs import PHOTOS, build_config, photo

from mrcnn.config import Config, get_config
from mrcnn.reference import torchvision_model
from mrcnn.weights import calibration_images, synthetic_weights, textured_images

SIZE = (320, 416)
SATURATED_LOGIT = 16.6  # fp32 sigmoid(x) == 1.0 from about here


def batches(cfg: Config, seed: int) -> dict[str, list[torch.Tensor] | None]:
    sizes = ((cfg.min_size, int(cfg.min_size * 1.3)), (cfg.min_size, cfg.min_size))
    return {
        "textured only": textured_images(sizes, seed),
        "textured + noise (default)": None,
        "default + photos": calibration_images(cfg, seed) + [photo(n, sizes[0]) for n in PHOTOS],
    }


def measure(cfg: Config, seeds: list[int]) -> pd.DataFrame:
    rows = []
    test_images = {"textured": textured_images((SIZE,), 5)[0], **{n.split(".")[0]: photo(n, SIZE) for n in PHOTOS}}
    for seed in seeds:
        for batch_name, images in batches(cfg, seed).items():
            model = torchvision_model(cfg).eval()
            model.load_state_dict(synthetic_weights(cfg, seed, images))
            seen: list[torch.Tensor] = []
            model.rpn.head.cls_logits.register_forward_hook(
                lambda _m, _i, out, seen=seen: seen.append(torch.cat([o.flatten() for o in out]))
            )
            for image_name, image in test_images.items():
                seen.clear()
                with torch.no_grad():
                    scores = model([image])[0]["scores"]
                logits = seen[0]
                rows.append(dict(
                    calibration=batch_name, seed=seed, image=image_name,
                    objectness_std=float(logits.std()), objectness_max=float(logits.max()),
                    saturated_logits=int((logits > SATURATED_LOGIT).sum()),
                    detections=len(scores), distinct_scores=int(scores.unique().numel()),
                    scores_equal_1=int((scores == 1).sum()),
                ))  # fmt: skip
                print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", choices=("tiny", "coco_r50_fpn"))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", type=Path, default=Path("results/weights"))
    opts = parser.parse_args()
    cfg = get_config("tiny") if opts.preset == "tiny" else build_config("coco_r50_fpn", 320, 533)
    table = measure(cfg, [int(s) for s in opts.seeds.split(",")])
    opts.out.mkdir(parents=True, exist_ok=True)
    command = (f"python bench/studies/weight_calibration/weight_calibration.py --preset {opts.preset} "
               f"--seeds {opts.seeds}")
    text = f"# synthetic_weights on photographs: {opts.preset}\n\n    {command}\n\n"
    text += table.to_markdown(index=False, floatfmt=".1f") + "\n"
    (opts.out / f"calibration_{opts.preset}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
