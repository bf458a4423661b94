"""``mrcnn export``: build the packages of one canvas and batch size, optionally check them against eager.

    mrcnn export --preset tiny --out out/export/tiny --sample-image 240x320 --check
    # -> tiny_320x448_b1.exported.pt2, tiny_320x448_b1.aoti.pt2, sample.ppm, export.json

Timing the packages against eager is the harness's job: ``mrcnn-bench export-time PACKAGE...``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mrcnn.config import Canvas, Config, get_config
from mrcnn.exits import UsageError, guarded
from mrcnn.export.compare import check_images, check_outputs, describe_check
from mrcnn.export.core import FORMATS
from mrcnn.export.deployed import load_exported
from mrcnn.export.package import build_packages
from mrcnn.export.ppm import write_ppm
from mrcnn.files import atomic_write
from mrcnn.flags import SEED_MAX, THREADS_MAX, bounded
from mrcnn.model import MaskRCNN
from mrcnn.transform import resized_size, select_canvas
from mrcnn.weights import load_torchvision_weights, synthetic_weights, textured_images


@dataclass(frozen=True)
class ExportOptions:
    """What ``mrcnn export`` builds, validated from the command line."""

    cfg: Config
    canvas: Canvas
    batch_size: int = 1
    formats: tuple[str, ...] = FORMATS
    out: Path = Path("out/export")
    weights: str | None = None  # torchvision state_dict path; None: synthetic weights from ``seed``
    seed: int = 0  # of the synthetic weights and the sample image
    strict: bool = False  # torch.export with TorchDynamo
    sample_image: Canvas | None = None  # size of DIR/sample.ppm to write, if any
    check: bool = False  # compare each package's outputs with eager
    threads: int | None = None  # torch threads; None: the usable cores
    device: str = "cpu"  # where the packages run: cpu or cuda (an AOTInductor package is built for one)


def parse_canvas(text: str, flag: str = "--canvas") -> Canvas:
    """"HxW" -> (H, W); UsageError naming ``flag`` otherwise."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError as e:
        raise UsageError(f"{flag} must look like HxW (e.g. 320x448), got {text!r}") from e
    return h, w


def default_canvas(cfg: Config) -> Canvas:
    """The bucket of a 480x640 (3:4 landscape) photo: (320, 448) for tiny, (800, 1088) for coco_r50_fpn."""
    return select_canvas([resized_size(480, 640, cfg)], cfg)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``mrcnn export`` (also ``python -m mrcnn.export``)."""
    parser.add_argument("--preset", default="tiny", help="config preset (default: tiny)")
    parser.add_argument("--weights", default=None,
                        help="torchvision Mask R-CNN state_dict (default: synthetic weights from --seed)")
    parser.add_argument("--seed", type=bounded(int, 0, SEED_MAX), default=0,
                        help="seed of the synthetic weights and sample image")
    parser.add_argument("--canvas", default=None, metavar="HxW",
                        help="canvas bucket to export for (default: that of a 480x640 image, 320x448 for tiny)")
    parser.add_argument("--batch-size", type=bounded(int, 1, 4096), default=1, help="static batch size (default: 1)")
    parser.add_argument("--format", default="exported,aoti",
                        help="comma list of: exported (torch.export .pt2), aoti (AOTInductor CPU package); "
                             "default: both")
    parser.add_argument("--out", default="out/export", metavar="DIR",
                        help="directory for the packages, export.json and sample.ppm (default: out/export)")
    parser.add_argument("--strict", action="store_true", help="torch.export in strict mode (TorchDynamo)")
    parser.add_argument("--sample-image", default=None, metavar="HxW",
                        help="also write DIR/sample.ppm, a generated image of this size (for cpp/)")
    parser.add_argument("--check", action="store_true",
                        help="load each package and compare its outputs with eager (timing: mrcnn-bench export-time)")
    parser.add_argument("--threads", type=bounded(int, 1, THREADS_MAX), default=None,
                        help="torch threads (default: usable cores)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="device the packages are built for and run on (default: cpu)")
    # Timing moved to the harness; the flag stays so that old command lines get a pointer there.
    parser.add_argument("--rounds", type=int, default=None, help=argparse.SUPPRESS)


def options_from_args(args: argparse.Namespace) -> ExportOptions:
    """Validated :class:`ExportOptions`; UsageError naming the bad flag."""
    if args.rounds is not None:
        raise UsageError("--rounds: timing moved to the benchmark harness: run `mrcnn-bench export-time PACKAGE...`")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible")
    cfg = get_config(args.preset)
    formats = tuple(f.strip() for f in args.format.split(",") if f.strip())
    if not formats or set(formats) - set(FORMATS):
        raise UsageError(f"--format must be a comma list of {FORMATS}, got {args.format!r}")
    return ExportOptions(
        cfg=cfg,
        canvas=parse_canvas(args.canvas) if args.canvas else default_canvas(cfg),
        batch_size=args.batch_size,
        formats=formats,
        out=Path(args.out),
        weights=args.weights,
        seed=args.seed,
        strict=args.strict,
        sample_image=parse_canvas(args.sample_image, "--sample-image") if args.sample_image else None,
        check=args.check,
        threads=args.threads,
        device=args.device,
    )


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, int(cores or 1))


def _log(msg: str) -> None:
    print(f"[export] {msg}", flush=True)


def _model(opts: ExportOptions) -> nn.Module:
    t0 = time.perf_counter()
    if opts.weights:
        weights: Any = opts.weights
        _log(f"weights: {opts.weights}")
    else:
        _log(f"weights: synthetic (seed {opts.seed}) ...")
        weights = synthetic_weights(opts.cfg, seed=opts.seed)
    model = load_torchvision_weights(MaskRCNN(opts.cfg).eval(), weights).to(opts.device)
    h, w = opts.canvas
    _log(f"model ready in {time.perf_counter() - t0:.1f} s; exporting {opts.cfg.name} for canvas {h}x{w}, "
         f"batch size {opts.batch_size}, on {opts.device}")
    return model


def _check(model: nn.Module, opts: ExportOptions, info: dict[str, Any]) -> None:
    """Compare each package written into ``info["paths"]`` with eager; the report goes to ``info["check"]``."""
    images = check_images(opts.canvas, opts.batch_size, opts.seed, info.get("sample_image"))
    packages = {fmt: load_exported(path) for fmt, path in info["paths"].items()}
    info["check"] = check_outputs(model, packages, images)
    for line in describe_check(info["check"]):
        _log(line)


def run(args: argparse.Namespace) -> int:
    """``mrcnn export``: 0 when the packages were written, 2 on a bad flag (one line naming it)."""
    try:
        opts = options_from_args(args)
    except UsageError as e:
        print(f"mrcnn export: error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, opts.threads or usable_cores()))
    opts.out.mkdir(parents=True, exist_ok=True)
    model = _model(opts)
    try:
        info = build_packages(model, opts.out, opts.canvas, opts.batch_size, opts.formats, strict=opts.strict,
                              log=_log)
    except UsageError as e:
        print(f"mrcnn export: error: {e}", file=sys.stderr)
        return 2
    info.update(threads=torch.get_num_threads(), strict=opts.strict, torch=torch.__version__)
    for fmt, path in info["paths"].items():
        _log(f"{fmt}: {path} ({os.path.getsize(path) / 2**20:.1f} MiB)")
    if opts.sample_image is not None:
        image = textured_images((opts.sample_image,), seed=opts.seed)[0]
        info["sample_image"] = str(write_ppm(opts.out / "sample.ppm", image))
        _log(f"sample image: {info['sample_image']}")
    if opts.check:
        _check(model, opts, info)
    atomic_write((opts.out / "export.json"), json.dumps(info, indent=2, default=str) + "\n")
    _log(f"wrote {opts.out / 'export.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mrcnn export", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return guarded("mrcnn", lambda: run(parser.parse_args(argv)), lambda: "export")


if __name__ == "__main__":
    raise SystemExit(main())
