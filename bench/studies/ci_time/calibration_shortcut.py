"""Does the calibration shortcut of the synthetic weights change any weight, and what does it save?

``python bench/studies/ci_time/calibration_shortcut.py OUT.txt [PRESET[:SEED] ...]`` (default
``tiny:0 tiny:1 tiny:7 coco_r50_fpn:0``) builds each preset's torchvision model twice from the same
seed and calibrates it on :func:`mrcnn.weights.calibration_images`, with whole passes (the method
before the shortcut) and with the shortcut, on two torch threads. One line per preset: whether every
tensor is equal, and each method's seconds (one timing each, the whole-pass one first).
"""

from __future__ import annotations

import sys

import torch

from mrcnn.config import PRESETS, get_config
from mrcnn.reference import torchvision_model
from mrcnn.weights import calibrate, calibration_images
from mrcnn_bench.base.timing import timed


def calibrated(preset: str, seed: int, shortcut: bool) -> tuple[dict[str, torch.Tensor], float]:
    cfg = get_config(preset)
    torch.manual_seed(seed)
    model = torchvision_model(cfg).eval()
    images = calibration_images(cfg, seed)
    seconds, _ = timed(calibrate, model, images, shortcut)
    return model.state_dict(), seconds


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: calibration_shortcut.py OUT.txt [PRESET[:SEED] ...]", file=sys.stderr)
        return 2
    out, specs = argv[0], argv[1:] or ["tiny:0", "tiny:1", "tiny:7", "coco_r50_fpn:0"]
    cases = [(spec, *spec.partition(":")[::2]) for spec in specs]  # (spec, preset, seed)
    for spec, preset, seed in cases:  # every argument checked before the first minute-long calibration
        if preset not in PRESETS or not (seed or "0").isdigit():
            print(f"calibration_shortcut.py: {spec!r} is not PRESET[:SEED] with PRESET one of {sorted(PRESETS)}",
                  file=sys.stderr)
            return 2
    torch.set_num_threads(2)
    lines = []
    for spec, preset, seed in cases:
        whole, whole_s = calibrated(preset, int(seed or 0), shortcut=False)
        fast, fast_s = calibrated(preset, int(seed or 0), shortcut=True)
        same = whole.keys() == fast.keys() and all(torch.equal(whole[k], fast[k]) for k in whole)
        verdict = "identical" if same else "DIFFERENT"
        lines.append(f"{spec} {verdict} whole_passes_s={whole_s:.2f} shortcut_s={fast_s:.2f}")
        print(lines[-1], flush=True)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
