"""Training curves of runs (their metrics.jsonl) -> one CSV and one PNG (box and mask AP vs step and vs time).

    .venv/bin/python bench/tools/training_curves.py --run static=out/tiny-static --run torchvision=out/tiny-tv \
        --csv results/training/tiny_curves.csv --png results/training/tiny_curves.png

The CSV has one row per evaluation: run label, step, wall time (s), CPU time of rank 0 (s), the
loss of that step and the COCO bbox/segm AP, AP50 and AP75.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

COLUMNS = ("run", "step", "time_s", "cpu_time_s", "loss", "bbox/AP", "bbox/AP50", "bbox/AP75", "segm/AP", "segm/AP50",
           "segm/AP75")  # fmt: skip


def evaluations(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return [r for r in rows if "bbox/AP" in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", action="append", required=True, metavar="LABEL=DIR")
    parser.add_argument("--csv", type=Path, required=True)
    parser.add_argument("--png", type=Path, default=None)
    parser.add_argument("--title", default="")
    parser.add_argument("--target", type=float, default=None, help="print time to this box AP for each run")
    args = parser.parse_args()
    runs, steps = {}, {}
    for item in args.run:
        label, _, path = item.partition("=")
        runs[label] = evaluations(Path(path))
        steps[label] = [json.loads(line) for line in (Path(path) / "metrics.jsonl").read_text().splitlines() if line]
    with args.csv.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for label, rows in runs.items():
            for r in rows:
                values = [label, r["step"], round(r["time"], 1), round(r.get("cpu_time", float("nan")), 1)]
                values += [round(r["loss"], 4)] + [round(r[k], 4) for k in COLUMNS[5:]]
                writer.writerow(values)
    if args.target is not None:
        for label, rows in runs.items():
            hit = next((r for r in rows if r["bbox/AP"] >= args.target), None)
            if hit is None:
                best = max(rows, key=lambda r: r["bbox/AP"]) if rows else None
                shown = f"best bbox/AP {best['bbox/AP']:.4f} at step {best['step']}" if best else "no evaluation"
                print(f"{label}: box AP {args.target} not reached ({shown})")
            else:
                print(
                    f"{label}: box AP {hit['bbox/AP']:.4f} >= {args.target} first at step {hit['step']}, "
                    f"wall {hit['time']:.0f} s, rank-0 CPU {hit.get('cpu_time', float('nan')):.0f} s"
                )
    if args.png is None:
        return
    # Only for --png: the CSV and --target need no plotting stack (matplotlib is the harness's extra).
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(18, 5.5))
    colors = plt.get_cmap("tab10").colors
    for index, (label, rows) in enumerate(runs.items()):
        color = colors[index % len(colors)]  # one colour per run; solid: box AP, dashed: mask AP
        for metric, style in (("bbox/AP", "-o"), ("segm/AP", "--s")):
            x_step, x_min = [r["step"] for r in rows], [r["time"] / 60 for r in rows]
            axes[0].plot(x_step, [r[metric] for r in rows], style, color=color, label=f"{label} {metric}")
            axes[1].plot(x_min, [r[metric] for r in rows], style, color=color, label=f"{label} {metric}")
        rows = steps[label]
        window = 20  # running mean of the summed loss over this many steps
        smooth = [
            sum(r["loss"] for r in rows[max(0, i - window + 1) : i + 1]) / min(i + 1, window) for i in range(len(rows))
        ]
        axes[2].plot([r["step"] for r in rows], smooth, color=color, label=f"{label} loss ({window}-step mean)")
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("wall time (min, includes evaluations)")
    axes[2].set_xlabel("step")
    axes[2].set_ylabel("training loss (sum of the five)")
    axes[2].grid(alpha=0.3)
    many = len(runs) > 4  # many runs: smaller legends in two columns, so they do not hide the curves
    axes[2].legend(fontsize=6 if many else 8)
    for ax in axes[:2]:
        ax.set_ylabel("COCO AP (IoU .50:.95)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6 if many else 8, ncol=2 if many else 1, loc="upper left")
    if args.title:
        fig.suptitle(args.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)


if __name__ == "__main__":
    main()
