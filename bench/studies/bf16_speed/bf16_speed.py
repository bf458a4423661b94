"""Why bf16 gains less than the bf16 ceiling allows: static inductor, fp32 against bf16, op by op.

    python bench/studies/bf16_speed/bf16_speed.py [--size 480x640] [--rounds 10] [--profile-calls 2]
        [--out results/bf16_speed]

The harness's ``static/inductor`` and ``static/inductor-bf16`` rows in one process: the static model
(``coco_r50_fpn``, ``synthetic_weights(cfg, seed=0)``: all 100 detection slots valid) compiled by
``torch.compile(fullgraph=True, dynamic=False)``, called on one textured image's ``ImageBatch`` under
no_grad, in fp32 and under ``torch.autocast("cpu", torch.bfloat16)`` (a second graph of the same
compile). Every round calls each once, the order reversed every other round
(:mod:`studies.onoff`; resumable): the median per-round ratio bf16 / fp32 with its 95% interval.

Then ``--profile-calls`` calls of each under ``torch.profiler``, whose operators' self times are
summed into parts: convolutions and matrix products (what bf16 can speed up), torchvision's RoIAlign
kernel, copies, the compiled graph's own kernels, NMS, the rest. From the fp32 parts it predicts the
bf16 call if the convolutions and matrix products ran at the kernel-rate ratio the harness's probe
measures in the same run (``mrcnn_bench.running.probes.measure_peaks``: a channels-last 3x3 convolution,
bf16 against fp32) and every other part took as long as in fp32. Writes ``OUT/bf16_speed.jsonl``
(the timed calls), ``OUT/bf16_speed.json`` and ``OUT/bf16_speed.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the studies' shared modules (studies.*)

import torch
from studies.onoff import paired, run_rounds
from torch.profiler import ProfilerActivity, profile

import mrcnn
from mrcnn.config import get_config
from mrcnn.model import MaskRCNN
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, synthetic_weights, textured_images
from mrcnn_bench.base import (
    timing,
    vcs,
)
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.cli.args import parse_size
from mrcnn_bench.running import store
from mrcnn_bench.running.journal import read_lines
from mrcnn_bench.running.probes import measure_peaks

REPO = Path(__file__).resolve().parents[3]
# Operator (profiler key) -> part; anything not listed is "other". The compiled graph's own kernels
# run inside its call, whose self time holds them.
PARTS: dict[str, tuple[str, ...]] = {
    "convolutions and matrix products": (
        "aten::mkldnn_convolution", "aten::_convolution", "aten::addmm", "aten::mm", "aten::bmm",
        "mkldnn::_convolution_pointwise", "mkldnn::_linear_pointwise", "mkl::_mkl_linear",
    ),
    "RoIAlign kernel (torchvision)": ("torchvision::roi_align",),
    "copies (aten::copy_)": ("aten::copy_",),
    "NMS kernel (torchvision)": ("torchvision::nms",),
}  # fmt: skip
GRAPH = "compiled graph's own kernels"
SPEEDS_UP = "convolutions and matrix products"


def part_of(key: str) -> str:
    if key.startswith("## Call CompiledFxGraph"):
        return GRAPH
    return next((part for part, ops in PARTS.items() if key in ops), "other")


def profiled_parts(call: Callable[[], Any], calls: int) -> dict[str, float]:
    """Seconds per call of each part: self CPU time of the operators in it, over ``calls`` calls."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            call()
    parts: dict[str, float] = {}
    for event in prof.key_averages():
        part = part_of(event.key)
        parts[part] = parts.get(part, 0.0) + event.self_cpu_time_total / 1e6 / calls
    return parts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=(480, 640), help="HxW of the textured image")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--profile-calls", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "results" / "bf16_speed")
    argv = sys.argv[1:] if argv is None else argv
    opts = parser.parse_args(argv)
    if opts.rounds < 3 or opts.profile_calls < 1:
        parser.error("--rounds must be at least 3 and --profile-calls at least 1")
    torch.set_num_threads(opts.threads)
    opts.out.mkdir(parents=True, exist_ok=True)
    size_key = f"{opts.size[0]}x{opts.size[1]}"
    cfg = get_config("coco_r50_fpn")
    model = load_torchvision_weights(MaskRCNN(cfg).eval(), synthetic_weights(cfg, seed=0))
    batch = to_image_batch(textured_images((opts.size,), seed=0), cfg)
    compiled = torch.compile(model, fullgraph=True, dynamic=False)

    def variant(bf16: bool) -> Callable[[], Any]:
        def call() -> Any:
            autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
            with torch.no_grad(), autocast:
                return compiled(batch)

        return call

    calls = {"fp32": variant(False), "bf16": variant(True)}
    first = {}
    for name, call in calls.items():  # compiles each graph, then a warm call
        first[name], _ = timing.timed(call)
        call()
    path = opts.out / "bf16_speed.jsonl"
    run_rounds(calls, opts.rounds, path, prefix=f"{size_key}:")
    rows = [r for r in read_lines(path) if r["key"].startswith(f"{size_key}:")]
    ratio = paired(rows, "fp32", "bf16")
    parts = {name: profiled_parts(call, opts.profile_calls) for name, call in calls.items()}
    peaks = measure_peaks()
    kernel_speedup = peaks["conv3x3_bf16"] / peaks["conv3x3_fp32"]
    fp32 = parts["fp32"]
    predicted = sum(fp32.values()) - fp32.get(SPEEDS_UP, 0.0) * (1 - 1 / kernel_speedup)
    summary = {
        "command": "python bench/studies/bf16_speed/bf16_speed.py " + " ".join(argv),
        "commit": vcs.output(store.REPO, "rev-parse", "--short", "HEAD"),
        # the checkout whose mrcnn was imported (PYTHONPATH may name another than the script's)
        "library_commit": vcs.output(Path(mrcnn.__file__).parent, "rev-parse", "--short", "HEAD"),
        "cpu": f"{store.cpu_model()} x{os.cpu_count()}",
        "threads": torch.get_num_threads(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "size": size_key, "first_call_s": first, "bf16_over_fp32": ratio, "parts_s_per_call": parts,
        "kernel_rates_gflops": peaks, "kernel_speedup": kernel_speedup,
        "predicted_bf16_over_fp32": predicted / sum(fp32.values()),
    }  # fmt: skip
    atomic_write(opts.out / "bf16_speed.json", json.dumps(summary, indent=1) + "\n")
    text = _markdown(summary)
    atomic_write(opts.out / "bf16_speed.md", text)
    print(text)


def _markdown(s: dict[str, Any]) -> str:
    r, fp32, bf16 = s["bf16_over_fp32"], s["parts_s_per_call"]["fp32"], s["parts_s_per_call"]["bf16"]
    ci = r["ci95"] or [float("nan")] * 2
    lines = [
        f"`{s['command']}` at {s['commit']} (library {s['library_commit']}), {s['cpu']}, {s['threads']} threads, "
        f"torch {s['torch']}, {s['date']}; "
        f"coco_r50_fpn {s['size']}, static inductor, one graph.",
        "",
        f"bf16 / fp32, median per-round ratio over {r['rounds']} interleaved rounds: **{r['median_ratio']:.3f}** "
        f"[{ci[0]:.3f}, {ci[1]:.3f}] ({r['median_s_off']:.3f} s and {r['median_s_on']:.3f} s).",
        "",
        "Seconds per call by part (profiler self time, operators summed):",
        "",
        "| part | fp32 | bf16 | bf16 / fp32 |",
        "| --- | --- | --- | --- |",
    ]  # fmt: skip
    for part in sorted(set(fp32) | set(bf16), key=lambda p: -fp32.get(p, 0.0)):
        a, b = fp32.get(part, 0.0), bf16.get(part, 0.0)
        lines.append(f"| {part} | {a:.3f} | {b:.3f} | {b / a:.2f} |" if a else f"| {part} | {a:.3f} | {b:.3f} | |")
    total_a, total_b = sum(fp32.values()), sum(bf16.values())
    rates, first = s["kernel_rates_gflops"], s["first_call_s"]
    lines += [
        f"| total profiled | {total_a:.3f} | {total_b:.3f} | {total_b / total_a:.2f} |",
        "",
        f"Kernel rates in this run (GFLOP/s, channels-last 3x3 convolution): fp32 {rates['conv3x3_fp32']:.0f}, "
        f"bf16 {rates['conv3x3_bf16']:.0f}: {s['kernel_speedup']:.2f}x. If only the convolutions and matrix "
        "products sped up by that much and every other part took its fp32 time, bf16 / fp32 would be "
        f"**{s['predicted_bf16_over_fp32']:.3f}**.",
        f"First calls (compilation included): fp32 {first['fp32']:.1f} s, bf16 {first['bf16']:.1f} s.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
