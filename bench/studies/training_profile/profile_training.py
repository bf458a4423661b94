"""Where a training step's time goes, static model vs torchvision's, and what that bounds.

Runs the harness's own training step (``mrcnn_bench.running.pipelines.Pipeline`` for ``static/train`` and
``torchvision/train``: same samples, same init, SGD) under ``torch.profiler`` and prints, per
implementation, the top operators by self CPU time and the share spent in convolutions (forward
and backward). Both models run the same backbone and FPN convolutions, so that share of
torchvision's step is work the static model cannot avoid: ``1 / share`` bounds the speed-up any
static-shape rewrite of the rest can give, before it is measured. Subnormal floats are flushed to
zero, as in the harness's training rows (:func:`mrcnn_bench.running.backends.flush_subnormals`).

    python bench/studies/training_profile/profile_training.py --preset tiny --threads 2 [--set KEY=VALUE ...]
        [--cases torchvision/train,static/train] [--out FILE.md]

Compiled training rows (``static/inductor-train``, ...) are profiled after the same warm-up steps,
which compile them; their convolutions then show as the calls inductor makes
(``mkldnn_convolution``, ``convolution_backward``), and the rest of the graph as its C++ kernels
(``graph_*_cpp_fused_*`` in the table). The share and bound lines read the first case as the
reference.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch._inductor.config
from torch.profiler import ProfilerActivity, profile

from mrcnn.overrides import parse_override
from mrcnn_bench.base import timing
from mrcnn_bench.cli.args import parse_size
from mrcnn_bench.running.backends import flush_subnormals
from mrcnn_bench.running.cases import Row, Workload, parse_cases
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
    p.add_argument("--cases", default="torchvision/train,static/train",
                   help="training rows to profile, the reference first (default: torchvision/train,static/train)")
    p.add_argument("--out", type=Path, default=None, help="also write the report as markdown here")
    args = p.parse_args()
    cases = parse_cases(args.cases)
    if not cases or any(c.phase != "training" for c in cases):
        p.error(f"--cases {args.cases!r}: name training rows only (for example static/train)")
    # Inductor's C++ kernels are invisible to the profiler unless each records itself.
    torch._inductor.config.cpp.enable_kernel_profile = True
    flush_subnormals()  # as the harness's training rows do, before any thread of the CPU pool exists
    torch.set_num_threads(args.threads)
    workload = Workload(preset=args.preset, **({"image_size": args.image_size} if args.image_size else {}))
    options = ContextOptions(workload, seed=0, threads=args.threads, need_training=True, overrides=dict(args.overrides))
    ctx, _ = make_context(options)

    h, w = workload.image_size
    lines = [f"# Training step profile: {args.preset} {h}x{w}, batch 2, {args.threads} threads, {args.steps} steps", "",
             f"Overrides: {dict(args.overrides) or 'none'}; subnormal floats flushed to zero.", ""]
    shares = {}
    for case in cases:
        pipe = Pipeline(Row(case), ctx)
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
        shares[case.name] = conv / total
        lines += [
            f"## {case.name}: {per_step:.3f} s/step under the profiler; "
            f"convolutions {conv / total:.1%} of self CPU time",
            "",
            "```",
            events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=45),
            "```",
            "",
        ]
    reference = cases[0].name
    lines.append(
        f"Convolutions take {shares[reference]:.1%} of {reference}'s step; with the same convolutions "
        f"and everything else free, another row could be at most {1 / shares[reference]:.2f}x as fast."
    )
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
