"""What every row of a run shares: images, weights, training samples (:class:`Context`).

A worker subprocess rebuilds the context from the files :func:`save_context` writes, so both sides
time the very same inputs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import resource
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from mrcnn.config import Config, get_config
from mrcnn.data.coco import CocoDataset
from mrcnn.data.synthetic import generate
from mrcnn.model import MaskRCNN
from mrcnn.weights import load_torchvision_weights, synthetic_weights, textured_images
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.running import backends
from mrcnn_bench.running.cases import TRAIN_BATCH, Variant, Workload

Sample = tuple[Tensor, dict[str, Tensor]]  # CocoDataset-style (uint8 image [3, h, w], target dict)


@dataclass
class Context:
    """What every row of a run shares. Workers rebuild it from the files :func:`save_context` writes."""

    preset: str
    overrides: dict[str, Any]
    workload: Workload
    weights: dict[str, Tensor]
    images: list[Tensor]  # [3, h, w] float in [0, 1]
    train_samples: list[Sample]
    threads: int
    seed: int
    # Training rows start from a seeded random init, as training from scratch does (the calibrated
    # inference weights give outputs too large for SGD: the loss diverges within three steps).
    train_weights: dict[str, Tensor] = field(default_factory=dict)

    def config(self, variant: Variant, case_overrides: tuple[tuple[str, Any], ...] = ()) -> Config:
        """The run's config with a case's overrides (``Case.overrides``) and the variant's on top."""
        return get_config(self.preset, **{**self.overrides, **dict(case_overrides), **dict(variant.overrides)})

    def call_images(self, index: int) -> list[Tensor]:
        """The images of call ``index``: ``batch_size`` of them, cycling over the generated ones."""
        n = len(self.images)
        return [self.images[(index * self.workload.batch_size + k) % n] for k in range(self.workload.batch_size)]


@dataclass(frozen=True)
class ContextOptions:
    """Where a run's inputs come from."""

    workload: Workload
    weights: str | None = None  # a state_dict file; None: synthetic_weights(seed)
    seed: int = 0
    threads: int = 1
    need_training: bool = False  # also training samples and a seeded random init
    coco_root: str | None = None  # COCO-layout root whose images are timed; None: generated images
    coco_split: str = "val2017"
    overrides: dict[str, Any] = field(default_factory=dict)


CONTEXT_CACHE_ENV = "MRCNN_CONTEXT_CACHE"


def make_context(opts: ContextOptions) -> tuple[Context, str]:
    """Images, weights and training samples for a run; returns (context, description of the weights).

    With ``$MRCNN_CONTEXT_CACHE`` set to a folder, a context made from the same options is loaded
    from there instead of being made again (the calibrated weights cost seconds per process). The
    folder must belong to one checkout of ``mrcnn``: one commit's measurement makes and removes it
    (:func:`mrcnn_bench.history.commit.measure_commit`), because another commit may calibrate differently.
    """
    cache = os.environ.get(CONTEXT_CACHE_ENV)
    if not cache:
        return _make_context(opts)
    folder = Path(cache) / hashlib.sha256(repr(opts).encode()).hexdigest()[:16]
    if (folder / "inputs.pt").is_file():
        return load_context(folder), (folder / "weights.txt").read_text()
    ctx, desc = _make_context(opts)
    Path(cache).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache))  # written whole, then renamed: no reader sees half of it
    save_context(ctx, tmp)
    (tmp / "weights.txt").write_text(desc)
    with contextlib.suppress(OSError):  # another process made it first: theirs is the same
        tmp.rename(folder)
    return ctx, desc


def _make_context(opts: ContextOptions) -> tuple[Context, str]:
    workload, seed = opts.workload, opts.seed
    cfg = get_config(workload.preset, **opts.overrides)
    if opts.coco_root:
        images = coco_images(opts.coco_root, workload.images, opts.coco_split, cfg.box_detections_per_img)
    elif workload.sizes:
        images = [image for image, _ in stream_images(workload.sizes, seed)]
    else:
        images = textured_images((workload.image_size,) * workload.images, seed)
    if opts.weights:
        state, desc = load_weights_file(opts.weights, cfg), f"file {opts.weights}"
    else:
        state, desc = synthetic_weights(cfg, seed=seed), f"synthetic_weights(seed={seed})"
    train: list[Sample] = []
    train_weights: dict[str, Tensor] = {}
    if opts.need_training:
        train = training_samples(workload.image_size, TRAIN_BATCH, seed)
        train_weights = initial_weights(cfg, seed)
    ctx = Context(workload.preset, dict(opts.overrides), workload, state, images, train, opts.threads, seed,
                  train_weights)
    return ctx, desc


def initial_weights(cfg: Config, seed: int) -> dict[str, Tensor]:
    """The seeded random init the training rows start from (MaskRCNN's own initialisation)."""
    torch.manual_seed(seed)
    return MaskRCNN(cfg).state_dict()


def training_samples(size: tuple[int, int], count: int, seed: int) -> list[Sample]:
    """``count`` synthetic-data-set samples resized to ``size``: (image [3, h, w] uint8, target dict)."""
    h, w = size
    with tempfile.TemporaryDirectory(prefix="mrcnn_bench_data_") as tmp:
        generate(tmp, count + 4, seed=seed, split="train", progress=False)
        dataset = CocoDataset(tmp, "train")
        # Skip images without objects: a throughput step should exercise every loss.
        samples = [s for s in (dataset[i] for i in range(len(dataset))) if len(s[1]["labels"])][:count]
    out = []
    for image, target in samples:
        sh, sw = image.shape[-2:]
        image = F.interpolate(image[None].float(), size=(h, w), mode="bilinear", align_corners=False)[0]
        masks = F.interpolate(target["masks"][None].float(), size=(h, w), mode="nearest")[0].to(torch.uint8)
        scale = torch.tensor([w / sw, h / sh, w / sw, h / sh])
        out.append((image.round().clamp(0, 255).to(torch.uint8),
                    {**target, "masks": masks, "boxes": target["boxes"] * scale}))
    return out


def stream_images(sizes: tuple[tuple[int, int], ...], seed: int) -> list[tuple[Tensor, int]]:
    """A stream's images: synthetic-data-set image ``i`` (seed ``seed``; :mod:`mrcnn.data.synthetic`) resized
    to ``sizes[i]`` (bilinear, antialiased, 8-bit levels as a decoded photo), as [3, h, w] floats in
    [0, 1], each with its number of objects (the generator's schedule: 0 for image 1, 20 or more for
    image 6, 1 to 12 otherwise)."""
    with tempfile.TemporaryDirectory(prefix="mrcnn_bench_stream_") as tmp:
        generate(tmp, len(sizes), seed=seed, split="stream", progress=False)
        dataset = CocoDataset(tmp, "stream")
        samples = [dataset[i] for i in range(len(sizes))]
    out = []
    for (image, target), size in zip(samples, sizes, strict=True):
        resized = F.interpolate(image[None].float(), size=size, mode="bilinear", align_corners=False, antialias=True)[0]
        out.append((resized.round().clamp(0, 255) / 255, len(target["labels"])))
    return out


def load_weights_file(path: str, cfg: Config) -> dict[str, Tensor]:
    """A torchvision Mask R-CNN state_dict (or a training checkpoint holding one under "model") that
    fits ``cfg``'s model; ValueError naming --weights otherwise (another preset, other shapes), found
    here, before any row is set up."""
    try:
        # Imported here: asv imports this module against every commit of the history, and
        # commits before read_state_dict have only load_torchvision_weights (which reads a path).
        from mrcnn.weights import read_state_dict
    except ImportError:
        read_state_dict = torch.load  # type: ignore[assignment]
    try:
        state = read_state_dict(path)
        load_torchvision_weights(MaskRCNN(cfg).eval(), state)
    except ValueError as e:
        raise UsageError(f"--weights {path}: {e}") from None
    return state


def coco_images(root: str, count: int, split: str = "val2017", detections: int = 100) -> list[Tensor]:
    """The first ``count`` images of a COCO-layout split, as [3, h, w] floats in [0, 1]; ValueError
    before any is decoded when one is too large to time here (:func:`check_paste_memory`)."""
    dataset = CocoDataset(root, split)
    if len(dataset) == 0:
        raise UsageError(f"--coco-root {root}: split {split!r} holds no images to time")
    n = min(count, len(dataset))
    check_paste_memory(dataset.sizes[:n], detections, available_bytes(), f"--coco-root {root}")
    return [dataset[i][0].float() / 255 for i in range(n)]


# The share of the memory still available that the timed images' masks may take. torchvision's
# postprocess (and ours, for parity) pastes every detection's mask as float32 at the image's full
# size, and the harness keeps a bool copy of each image's masks as the parity reference: at least
# 4 bytes per pixel per detection for the largest image plus 1 for every image (a 6000x6000 image
# with 100 detections: 18 GB), besides the decoded images themselves (float32 RGB: 12 bytes a pixel).
PASTE_SHARE = 0.5


def available_bytes() -> int:
    """Memory this process may still take: the system's MemAvailable, or less under an address-space
    limit (RLIMIT_AS, as a container or ``ulimit -v`` sets)."""
    gb = backends.mem_available_gb()
    available = int(gb * 2**30) if not math.isnan(gb) else os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    used_gb = backends.proc_status_gb("VmSize")
    if soft != resource.RLIM_INFINITY and not math.isnan(used_gb):  # NaN where /proc has no VmSize
        available = min(available, soft - int(used_gb * 2**30))
    return max(0, available)


def check_paste_memory(sizes: list[tuple[int, int]], detections: int, available: int, what: str) -> None:
    """ValueError when the masks of images of ``sizes`` (height, width), pasted at full size, would take
    more than PASTE_SHARE of ``available`` bytes; it names the largest image and a side that fits."""
    if not sizes:
        return
    largest = max(sizes, key=lambda s: s[0] * s[1])
    pixels = sum(h * w for h, w in sizes)
    need = detections * (4 * largest[0] * largest[1] + pixels) + 12 * pixels
    if need > PASTE_SHARE * available:
        side = int((PASTE_SHARE * available / (detections * (4 + len(sizes)) + 12 * len(sizes))) ** 0.5)
        raise UsageError(
            f"{what}: {len(sizes)} image(s) up to {largest[0]}x{largest[1]} would need {need / 2**30:.1f} GiB to "
            f"paste their up to {detections} masks each at full size (float32, as torchvision's postprocess does, "
            f"and a bool copy kept for parity) and hold the images, more than {PASTE_SHARE:.0%} of the "
            f"{available / 2**30:.1f} GiB available here; images up to about {side}x{side} fit: downscale them, "
            "time fewer (--images), or lower --set box_detections_per_img=N")


def save_context(ctx: Context, workdir: Path) -> None:
    """``workdir/context.json`` (settings) and ``workdir/inputs.pt`` (tensors), for workers."""
    meta = {"preset": ctx.preset, "overrides": ctx.overrides, "workload": ctx.workload.to_dict(),
            "threads": ctx.threads, "seed": ctx.seed}
    atomic_write((workdir / "context.json"), json.dumps(meta))
    torch.save({"weights": ctx.weights, "images": ctx.images, "train_samples": ctx.train_samples,
                "train_weights": ctx.train_weights}, workdir / "inputs.pt")


def load_context(workdir: Path) -> Context:
    """The context :func:`save_context` wrote to ``workdir``."""
    meta = json.loads((workdir / "context.json").read_text())
    inputs = torch.load(workdir / "inputs.pt", weights_only=True)
    return Context(meta["preset"], meta["overrides"], Workload.from_dict(meta["workload"]), inputs["weights"],
                   inputs["images"], inputs["train_samples"], meta["threads"], meta["seed"], inputs["train_weights"])
