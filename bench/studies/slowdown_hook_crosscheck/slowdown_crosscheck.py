"""The harness's slowdown hook against the old in-model knob, on the model of another checkout.

    python bench/studies/slowdown_hook_crosscheck/slowdown_crosscheck.py OLD_CHECKOUT [--fractions 0.1,0.6]

OLD_CHECKOUT is a checkout whose ``Config`` still has ``inject_slowdown`` (before the architecture
change, e.g. ``git worktree add /tmp/old 781b00f``). For each fraction, one process runs that
checkout's model with the knob and another runs this checkout's model with
:func:`mrcnn_bench.running.slowdown.inject_slowdown`; both use the tiny preset, synthetic weights (seed 0)
and one 240x320 image. Prints FLOPs (``FlopCounterMode``) of each and whether the detections are
bit-identical; exits 1 if either differs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]

# Runs in a child process whose sys.path puts one checkout's mrcnn first.
_CHILD = """
import sys, torch
from torch.utils.flop_counter import FlopCounterMode
from mrcnn.config import get_config
from mrcnn.model import MaskRCNN
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, synthetic_weights, textured_images
torch.set_num_threads(1)
side, fraction, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
cfg = get_config("tiny")
weights = synthetic_weights(cfg, seed=0)
if side == "old":
    model = load_torchvision_weights(MaskRCNN(cfg.replace(inject_slowdown=fraction)), weights).eval()
else:
    from mrcnn_bench.running.slowdown import inject_slowdown
    model = load_torchvision_weights(MaskRCNN(cfg), weights).eval()
    inject_slowdown(model, fraction)
batch = to_image_batch(textured_images(((240, 320),), seed=1), cfg)
with torch.no_grad(), FlopCounterMode(display=False) as counter:
    det = model(batch)
torch.save({"det": tuple(det), "flops": counter.get_total_flops()}, out)
"""


def run_side(side: str, code: Path, fraction: float, out: Path) -> dict:
    paths = [str(code)] if side == "old" else [str(REPO), str(REPO / "bench")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    # cwd: `python -c` puts the working directory first on sys.path, ahead of PYTHONPATH.
    subprocess.run([sys.executable, "-c", _CHILD, side, str(fraction), str(out)], env=env, check=True,
                   cwd=out.parent)
    return torch.load(out, weights_only=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="checkout with Config.inject_slowdown")
    parser.add_argument("--fractions", default="0.1,0.6")
    args = parser.parse_args()
    if not (args.old / "mrcnn" / "model.py").is_file():
        parser.error(f"{args.old} is not a checkout of this project")
    same = True
    with tempfile.TemporaryDirectory() as tmp:
        for fraction in (float(f) for f in args.fractions.split(",")):
            old = run_side("old", args.old, fraction, Path(tmp) / "old.pt")
            new = run_side("new", args.old, fraction, Path(tmp) / "new.pt")
            equal = all(torch.equal(a, b) for a, b in zip(old["det"], new["det"], strict=True))
            print(f"fraction {fraction:g}: FLOPs old {old['flops']:,} new {new['flops']:,} "
                  f"({'equal' if old['flops'] == new['flops'] else 'DIFFERENT'}); "
                  f"detections {'bit-identical' if equal else 'DIFFERENT'}")
            same = same and equal and old["flops"] == new["flops"]
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
