"""Two training runs' curves side by side: are they the same training?

    python bench/tools/compare_curves.py RUN_A RUN_B [--out FILE.md]

RUN_A and RUN_B are ``mrcnn train`` output folders (their ``metrics.jsonl``). Prints, over the steps
both logged: how many have bit-equal total losses, the largest relative difference of each loss,
and every evaluation's box and mask AP from both. Used to show that a lever meant to keep the loss
(``mask_train_buckets``) trains the same model as the run without it, from the same seed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mrcnn_bench.running.journal import read_lines

LOSSES = ("loss", "loss_objectness", "loss_rpn_box_reg", "loss_classifier", "loss_box_reg", "loss_mask")


def compare(a: list[dict], b: list[dict]) -> list[str]:
    by_step = {r["step"]: r for r in b}
    pairs = [(r, by_step[r["step"]]) for r in a if r["step"] in by_step]
    if not pairs:
        raise SystemExit("the two runs share no logged step")
    lines = [f"Steps logged by both: {len(pairs)}; total loss bit-equal on "
             f"{sum(x['loss'] == y['loss'] for x, y in pairs)} of them.", "",
             "| loss | largest relative difference |", "| --- | --- |"]
    for name in LOSSES:
        diff = max(abs(x[name] - y[name]) / max(abs(x[name]), 1e-12) for x, y in pairs)
        lines.append(f"| {name} | {diff:.2e} |")
    lines += ["", "| step | box AP (A) | box AP (B) | mask AP (A) | mask AP (B) |", "| --- | --- | --- | --- | --- |"]
    for x, y in pairs:
        if "bbox/AP" in x and "bbox/AP" in y:
            lines.append(f"| {x['step']} | {x['bbox/AP']:.4f} | {y['bbox/AP']:.4f} "
                         f"| {x['segm/AP']:.4f} | {y['segm/AP']:.4f} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--out", type=Path, help="also write the comparison here (markdown)")
    args = parser.parse_args()
    lines = [f"# {args.run_a} (A) against {args.run_b} (B)", "",
             *compare(read_lines(args.run_a / "metrics.jsonl"), read_lines(args.run_b / "metrics.jsonl")), "",
             f"    python bench/tools/compare_curves.py {args.run_a} {args.run_b}"]
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
