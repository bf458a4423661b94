"""Where a training step's time goes, static model vs torchvision's, and what that bounds.

Runs the harness's own training step (``mrcnn_bench.running.pipelines.Pipeline`` for ``static/train`` and
``torchvision/train``: same samples, same init, SGD) under ``torch.profiler`` and prints, per
implementation, the top operators by self CPU time and the share spent in convolutions (forward
and backward). Both models run the same backbone and FPN convolutions, so that share of
torchvision's step is work the static model cannot avoid: ``1 / share`` bounds the speed-up any
static-shape rewrite of the rest can give, before it is measured. Subnormal floats are flushed to
zero, as in the harness's training rows (:func:`mrcnn_bench.running.backends.flush_subnormals`).

    python bench/studies/training_profile/profile_training.py --preset tiny --threads 2 [--set KEY=VALUE ...]
        [--out FILE.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from mrcnn.overrides import parse_override
from mrcnn_bench.base import timing
from mrcnn_bench.cli.args import parse_size
from mrcnn_bench.running.backends import flush_subnormals
from mrcnn_bench.running.cases import Case, Row, Workload
from mrcnn_bench.running.context import ContextOptions, make_context
from mrcnn_bench.running.pipelines import Pipeline

CONV_OPS = (
    "aten::mkldnn_convolution",
    "aten::convolution_backward",
    "aten::_slow_conv2d_forward",
    "aten::_slow_conv2d_backward",
    "aten::mkldnn_convolution_backward",
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--image-size", type=parse_size, default=None, metavar="HxW")
    p.add_argument("--set", dest="overrides", action="append", default=[], type=parse_override, metavar="KEY=VALUE")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--steps", type=int, default=3, help="profiled steps, after 2 warm-up steps")
    p.add_argument("--out", type=Path, default=None, help="also write the report as markdown here")
    args = p.parse_args()
    flush_subnormals()  # as the harness's training rows do, before any thread of the CPU pool exists
    torch.set_num_threads(args.threads)
    workload = Workload(preset=args.preset, **({"image_size": args.image_size} if args.image_size else {}))
    options = ContextOptions(workload, seed=0, threads=args.threads, need_training=True, overrides=dict(args.overrides))
    ctx, _ = make_context(options)

    h, w = workload.image_size
    lines = [f"# Training step profile: {args.preset} {h}x{w}, batch 2, {args.threads} threads, {args.steps} steps", "",
             f"Overrides: {dict(args.overrides) or 'none'}; subnormal floats flushed to zero.", ""]
    shares = {}
    for impl in ("torchvision", "static"):
        pipe = Pipeline(Row(Case(impl, phase="training")), ctx)
        pipe.setup()
        for i in range(2):
            pipe.call(i)
        with timing.Stopwatch() as steps, profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(args.steps):
                pipe.call(i)
        per_step = steps.seconds / args.steps
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        conv = sum(e.self_cpu_time_total for e in events if e.key in CONV_OPS)
        shares[impl] = conv / total
        lines += [
            f"## {impl}: {per_step:.3f} s/step under the profiler; convolutions {conv / total:.1%} of self CPU time",
            "",
            "```",
            events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=45),
            "```",
            "",
        ]
    lines.append(
        f"Convolutions take {shares['torchvision']:.1%} of torchvision's step; with the same convolutions "
        f"and everything else free, the static model could be at most {1 / shares['torchvision']:.2f}x "
        "as fast."
    )
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
