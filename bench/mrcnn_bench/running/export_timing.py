"""``mrcnn-bench export-time``: packages from ``mrcnn export``, checked against eager and timed with it.

    mrcnn export --preset tiny --out out/export/tiny --sample-image 240x320
    mrcnn-bench export-time out/export/tiny/*.pt2 --image out/export/tiny/sample.ppm --rounds 30

In one process: each package is loaded and called once (time to first result = load + first call,
torch already imported), its outputs are compared with eager (:func:`mrcnn.export.check_outputs`),
then eager and the packages are timed interleaved, one warm-up call each first. Rows: eager with
the pure-tensor ops (what is exported), eager with ``--ops-impl`` (the model as the preset runs
it), and each package. Exit 0 when every package matches eager, 1 when one does not, 2 on bad
input (a missing or foreign package file, packages of different shapes, a bad flag).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mrcnn.exits import guarded
from mrcnn.export import DeployableMaskRCNN, DeployedModel, ExportMeta, load_exported, read_meta, tensor_ops_model
from mrcnn.export.cli import usable_cores
from mrcnn.export.compare import check_images, check_outputs, describe_check, mismatches
from mrcnn.export.trust import check_trusted
from mrcnn.flags import SEED_MAX, THREADS_MAX, bounded
from mrcnn.model import MaskRCNN
from mrcnn.structures import ImageBatch
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, synthetic_weights
from mrcnn_bench.base import timing
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.running import backends


@dataclass(frozen=True)
class ExportTimeOptions:
    """What ``mrcnn-bench export-time`` loads and how long it times."""

    packages: tuple[str, ...]  # .pt2 files of mrcnn export, at most one per format, all of one shape
    weights: str | None = None  # torchvision state_dict they were exported from; None: synthetic from ``seed``
    seed: int = 0  # of the synthetic weights and of the generated image
    image: str | None = None  # PPM to run on; None: the image ``mrcnn export --check`` generates
    rounds: int = 10  # interleaved timed rounds
    ops_impl: str = "auto"  # ops of the second eager row (and of the synthetic weights' calibration)
    threads: int | None = None  # torch threads; None: the usable cores
    out: str | None = None  # write the report here as JSON
    trust: bool = False  # load packages that are not on this user's allow-list (mrcnn.export.trust)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("packages", nargs="+", metavar="PACKAGE", help=".pt2 packages written by mrcnn export")
    parser.add_argument("--weights", default=None,
                        help="torchvision state_dict the packages were exported from (default: synthetic from --seed)")
    parser.add_argument("--seed", type=bounded(int, 0, SEED_MAX), default=0,
                        help="seed of the synthetic weights and generated image (default: %(default)s)")
    parser.add_argument("--image", default=None, metavar="PPM",
                        help="image to run on (default: a generated one, as mrcnn export --check uses)")
    parser.add_argument("--rounds", type=int, default=10,
                        help="interleaved timed rounds (default: %(default)s)")
    parser.add_argument("--ops-impl", default="auto", choices=("auto", "torchvision"),
                        help="ops of the second eager row (default: auto, the presets' own)")
    parser.add_argument("--threads", type=bounded(int, 1, THREADS_MAX), default=None,
                        help="torch threads (default: usable cores)")
    parser.add_argument("--out", default=None, metavar="FILE", help="write the report as JSON")
    parser.add_argument("--trust-package", action="store_true",
                        help="load packages this user's mrcnn export did not build: a package runs code when loaded")


def options_from_args(args: argparse.Namespace) -> ExportTimeOptions:
    if args.rounds < 1:
        raise UsageError(f"--rounds must be >= 1, got {args.rounds}")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    if args.image is not None and not Path(args.image).is_file():
        raise UsageError(f"--image: no such file: {args.image}")
    if args.weights is not None and not Path(args.weights).is_file():
        raise UsageError(f"--weights: no such file: {args.weights}")
    return ExportTimeOptions(packages=tuple(args.packages), weights=args.weights, seed=args.seed, image=args.image,
                             rounds=args.rounds, ops_impl=args.ops_impl, threads=args.threads, out=args.out,
                             trust=args.trust_package)


def package_metas(packages: tuple[str, ...]) -> dict[str, tuple[str, ExportMeta]]:
    """format -> (path, metadata), read without loading; ValueError unless all share one shape and config."""
    def build(m: ExportMeta) -> tuple[Any, ...]:
        return m.canvas, m.batch_size, m.config

    found: dict[str, tuple[str, ExportMeta]] = {}
    for path in packages:
        meta = read_meta(path)  # ValueError for a missing file or one mrcnn export did not write
        if meta.format in found:
            raise UsageError(f"two {meta.format} packages: {found[meta.format][0]} and {path}; give one per format")
        for other_path, other in found.values():
            if build(meta) != build(other):
                raise UsageError(f"{path} ({meta.describe()}) was not built like {other_path} ({other.describe()})")
        found[meta.format] = (path, meta)
    return found


def eager_model(meta: ExportMeta, opts: ExportTimeOptions) -> nn.Module:
    """The model the packages were exported from, with ``opts.ops_impl`` ops, on their device."""
    cfg = meta.cfg.replace(ops_impl=opts.ops_impl)
    weights: Any = opts.weights if opts.weights else synthetic_weights(cfg, seed=opts.seed)
    return load_torchvision_weights(MaskRCNN(cfg).eval(), weights).to(meta.device)


def time_interleaved(fns: dict[str, Callable[[], Any]], rounds: int, dev: torch.device | None = None
                     ) -> dict[str, dict[str, float]]:
    """Round-robin timing (order rotated each round) -> per function, median and IQR of wall seconds.

    ``dev``: each timed call waits for the work it queued there (CUDA launches kernels asynchronously).

    Also the fastest call and the median process CPU seconds per call (all threads), which a busy
    shared machine disturbs less than the median wall time. The quartiles are those of
    ``statistics.quantiles`` (exclusive method); ``mrcnn-bench run``'s :func:`mrcnn_bench.running.store.median_iqr`
    uses the inclusive method, whose IQR is narrower on few rounds, so IQRs of the two commands
    are not comparable.
    """
    times: dict[str, list[float]] = {n: [] for n in fns}
    cpu: dict[str, list[float]] = {n: [] for n in fns}
    for _, names in timing.schedule(list(fns), "rotate", rounds):
        for n in names:
            c0 = time.process_time()
            seconds, _ = timing.timed(_synced(fns[n], dev))
            times[n].append(seconds)
            cpu[n].append(time.process_time() - c0)
    out = {}
    for n, ts in times.items():
        q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
        out[n] = {"median_s": statistics.median(ts), "iqr_s": q[2] - q[0], "min_s": min(ts),
                  "cpu_s": statistics.median(cpu[n]), "rounds": len(ts)}
    return out


def _synced(fn: Callable[[], Any], dev: torch.device | None) -> Callable[[], Any]:
    if dev is None or dev.type == "cpu":
        return fn

    def call() -> Any:
        result = fn()
        backends.sync(dev)
        return result

    return call


def load_timed(paths: dict[str, str], images: list[Tensor], trust: bool = False
               ) -> tuple[dict[str, DeployedModel], dict[str, Any]]:
    """Load each package and call it once: the packages, and ``load_s`` / ``first_result_s`` per format."""
    loaded: dict[str, DeployedModel] = {}
    report: dict[str, Any] = {"first_result_s": {}, "load_s": {}}
    for fmt, path in paths.items():
        since_load = timing.Stopwatch()
        deployed = loaded[fmt] = load_exported(path, trust)
        report["load_s"][fmt] = since_load.elapsed()
        batch = deployed.image_batch(images[: deployed.meta.batch_size])
        _synced(functools.partial(deployed, batch.tensors, batch.image_sizes), torch.device(deployed.meta.device))()
        report["first_result_s"][fmt] = since_load.elapsed()
    return loaded, report


def check_and_time(model: nn.Module, paths: dict[str, str], images: list[Tensor], rounds: int,
                   trust: bool = False) -> dict[str, Any]:
    """Time to first result of each package, its outputs against eager, then latency per row, interleaved."""
    tensor_model = tensor_ops_model(model.eval())
    loaded, report = load_timed(paths, images, trust)
    report.update(check_outputs(tensor_model, loaded, images))
    meta = next(iter(loaded.values())).meta
    batch = next(iter(loaded.values())).image_batch(images[: meta.batch_size])
    args = (batch.tensors, batch.image_sizes)
    wrapper = DeployableMaskRCNN(tensor_model)
    with torch.no_grad():
        rows: dict[str, Callable[[], Any]] = {"eager (ops_impl=tensor)": lambda: wrapper(*args)}
        if model.cfg.ops_impl != "tensor":
            model_batch = ImageBatch(*(t.to(meta.device) for t in to_image_batch(
                images[: meta.batch_size], model.cfg.replace(canvases=(meta.canvas,)), meta.batch_size)))
            rows[f"eager (ops_impl={model.cfg.ops_impl})"] = lambda: model(model_batch)
        for fmt, deployed in loaded.items():
            rows[fmt] = lambda deployed=deployed: deployed(*args)
        for fn in rows.values():  # one warm-up each
            fn()
        report["latency"] = time_interleaved(rows, rounds, torch.device(meta.device))
    return report


def _log(msg: str) -> None:
    print(f"[export-time] {msg}", flush=True)


def _log_report(report: dict[str, Any]) -> None:
    for line in describe_check(report):
        _log(line)
    for fmt, s in report["first_result_s"].items():
        _log(f"time to first result ({fmt}: load + first call): {s:.2f} s (load {report['load_s'][fmt]:.2f} s)")
    for name, t in report["latency"].items():
        _log(f"latency {name}: median {t['median_s'] * 1e3:.0f} ms (IQR {t['iqr_s'] * 1e3:.0f} ms, min "
             f"{t['min_s'] * 1e3:.0f} ms, {t['rounds']} rounds; CPU time {t['cpu_s'] * 1e3:.0f} ms)")


def run(args: argparse.Namespace) -> int:
    """0: every package matches eager; 1: one does not; 2: bad input, named in one line on stderr."""
    try:
        opts = options_from_args(args)
        metas = package_metas(opts.packages)
        for path, _ in metas.values():  # refused here, before anything is built or loaded
            check_trusted(path, opts.trust)
        torch.set_num_threads(opts.threads or usable_cores())
        meta = next(iter(metas.values()))[1]
        images = check_images(meta.canvas, meta.batch_size, opts.seed, opts.image)
        model = eager_model(meta, opts)
    except (UsageError, OSError) as e:
        print(f"mrcnn-bench export-time: error: {e}", file=sys.stderr)
        return 2
    report = check_and_time(model, {fmt: path for fmt, (path, _) in metas.items()}, images, opts.rounds, opts.trust)
    report.update(packages={fmt: path for fmt, (path, _) in metas.items()}, meta=dataclasses.asdict(meta),
                  threads=torch.get_num_threads(), torch=torch.__version__, options=dataclasses.asdict(opts))
    report["mismatches"] = mismatches(report)
    _log_report(report)
    if opts.out:
        Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(opts.out, json.dumps(report, indent=2, default=str) + "\n")
        _log(f"wrote {opts.out}")
    for problem in report["mismatches"]:
        print(f"mrcnn-bench export-time: outputs differ from eager: {problem} (were the packages exported "
              "with these --weights and --seed?)", file=sys.stderr)
    return 1 if report["mismatches"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mrcnn-bench export-time", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return guarded("mrcnn-bench", lambda: run(parser.parse_args(argv)), lambda: "export-time")

