"""Are the COCO-size training runs' slow rounds subnormal floats? One row, flush on and off.

    PYTHONPATH=bench python bench/studies/training_subnormals/denormal_probe.py [--case torchvision/train] [--steps 7]
        [--out results/training/denormal_probe.md]

The COCO-size training runs (``results/runs/train_coco_r50_320_buckets*``) had rounds 2 and 4 two
to four times slower than rounds 1 and 5 for every fp32 row, in every row's own process at once,
with no other process busy and no steal, while the bf16 rows (AMX treats subnormals as zero) were
barely touched. Every training row starts from the same seeded weights on the same batches, so a
numeric cause would strike them all at the same step. This probe runs the row's first ``--steps``
steps (the run's 2 warm-up steps and 5 rounds) twice from the same start, each pass in a fresh
process of its own: subnormals kept, then flushed to zero in every thread from the process's start
(:func:`mrcnn_bench.running.backends.flush_subnormals`; ``torch.set_flush_denormal`` later in a process
reaches only its calling thread, not the CPU pool's). It times each step and after each step
(untimed) counts the subnormal values in the parameters and their gradients. Same settings as those
runs: ``coco_r50_fpn``, 320x427 training images, canvases up to 512, 2 threads. The pass itself is
:func:`studies.training_subnormals.subnormal_steps.one_pass`; this script runs it twice and writes the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the studies' shared modules (studies.*)

from studies.training_subnormals.subnormal_steps import one_pass


def pass_in_subprocess(case: str, steps: int, flush: bool) -> list[dict[str, float]]:
    """:func:`one_pass` in a fresh interpreter; its steps come back as JSON, the last line of its stdout."""
    cmd = [sys.executable, __file__, "--case", case, "--steps", str(steps), "--one-pass", "on" if flush else "off"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                                      os.environ.get("PYTHONPATH")]))}
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", default="torchvision/train")
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("results/training/denormal_probe.md"))
    parser.add_argument("--one-pass", choices=("off", "on"), help=argparse.SUPPRESS)  # the child's role
    args = parser.parse_args()
    if args.one_pass:
        print(json.dumps(one_pass(args.case, args.steps, args.one_pass == "on")))
        return 0
    passes = {flush: pass_in_subprocess(args.case, args.steps, flush) for flush in (False, True)}
    lines = [f"# Subnormal floats and step time: {args.case}, coco_r50_fpn 320x427, 2 threads", "",
             "`PYTHONPATH=bench python bench/studies/training_subnormals/denormal_probe.py` "
             "(each pass in a fresh process from the same "
             "start: subnormals kept, then flushed in every thread from the process's start).", "",
             "| step | s, kept | s, flushed | subnormal params / grads, kept | flushed | loss kept | loss flushed |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for off, on in zip(passes[False], passes[True], strict=True):
        lines.append(f"| {off['step']} | {off['seconds']:.2f} | {on['seconds']:.2f} | {off['params']} / {off['grads']} "
                     f"| {on['params']} / {on['grads']} | {off['loss']:.3f} | {on['loss']:.3f} |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
