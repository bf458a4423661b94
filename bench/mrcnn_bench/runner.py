"""The runner: build each case, warm it up, then time every case interleaved, round by round.

    for each round: for each row (order rotated every round): time one call

so slow drift of a shared machine hits every row alike. The first call of a row is timed apart
("time to first result", compilation included); the rounds give the median and IQR of steady state.

An inference call turns ``batch_size`` images into torchvision-style ``list[dict]`` (resize, pad,
forward, box rescale and mask pasting included). A training call is one SGD step (forward, backward,
update) on ``TRAIN_BATCH`` images with their targets.

A row is a case plus a :class:`Variant` (which code, which config overrides). Most rows run in this
process. A row runs in a worker subprocess (``python -m mrcnn_bench.worker``) when it may never
finish (``Case.bounded``: killed at the time limit, reported as "> limit" with the compile counts it
reached) or when its variant imports other code (``compare A B`` across two checkouts).

Parity is checked on the timed outputs themselves: each inference row against the reference row
(torchvision eager) of its variant, on the same images.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mrcnn_bench import backends
from mrcnn_bench.cases import TRAIN_BATCH, Case, Workload

# ------------------------------------------------------------------------------------------------
# Rows


@dataclass(frozen=True)
class Variant:
    """Which code and settings a row runs: ``code`` is a checkout whose ``mrcnn`` is imported."""

    label: str = ""  # "" in a plain run; "A" / "B" in compare
    code: str | None = None  # None: the mrcnn this process imports
    overrides: tuple[tuple[str, Any], ...] = ()  # Config overrides, e.g. (("inject_slowdown", 0.1),)


@dataclass(frozen=True)
class Row:
    case: Case
    variant: Variant = Variant()

    @property
    def name(self) -> str:
        return f"{self.variant.label}:{self.case.name}" if self.variant.label else self.case.name

    @property
    def in_worker(self) -> bool:
        return self.case.bounded or self.variant.code is not None


# ------------------------------------------------------------------------------------------------
# Inputs


@dataclass
class Context:
    """What every row of a run shares. Workers rebuild it from the files :func:`save_context` writes."""

    preset: str
    overrides: dict[str, Any]
    workload: Workload
    weights: dict[str, Tensor]
    images: list[Tensor]  # [3, h, w] float in [0, 1]
    train_samples: list[tuple[Tensor, dict[str, Tensor]]]  # CocoDataset-style (uint8 image, target)
    threads: int
    seed: int
    # Training rows start from a seeded random init, as training from scratch does (the calibrated
    # inference weights give outputs too large for SGD: the loss diverges within three steps).
    train_weights: dict[str, Tensor] = field(default_factory=dict)

    def config(self, variant: Variant):
        from mrcnn.config import get_config

        return get_config(self.preset, **{**self.overrides, **dict(variant.overrides)})

    def call_images(self, index: int) -> list[Tensor]:
        """The images of call ``index``: ``batch_size`` of them, cycling over the generated ones."""
        n = len(self.images)
        return [self.images[(index * self.workload.batch_size + k) % n] for k in range(self.workload.batch_size)]


def training_samples(size: tuple[int, int], count: int, seed: int) -> list[tuple[Tensor, dict[str, Tensor]]]:
    """``count`` synthetic-data-set samples resized to ``size``: (image [3, h, w] uint8, target dict)."""
    import torch.nn.functional as F

    from mrcnn.data.coco import CocoDataset
    from mrcnn.data.synthetic import generate

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


def make_context(workload: Workload, weights: str | None, seed: int, threads: int, need_training: bool,
                 coco_root: str | None = None, overrides: dict[str, Any] | None = None,
                 coco_split: str = "val2017") -> tuple[Context, str]:
    """Images, weights and training samples for a run; returns (context, description of the weights)."""
    from mrcnn.config import get_config
    from mrcnn.weights import synthetic_weights, textured_images

    cfg = get_config(workload.preset, **(overrides or {}))
    sizes = (workload.image_size,) * workload.images
    images = coco_images(coco_root, workload.images, coco_split) if coco_root else textured_images(sizes, seed)
    if weights:
        state = load_weights_file(weights)
        desc = f"file {weights}"
    else:
        state = synthetic_weights(cfg, seed=seed)
        desc = f"synthetic_weights(seed={seed})"
    train, train_weights = [], {}
    if need_training:
        from mrcnn.model import MaskRCNN

        train = training_samples(workload.image_size, TRAIN_BATCH, seed)
        torch.manual_seed(seed)
        train_weights = MaskRCNN(cfg).state_dict()
    ctx = Context(workload.preset, dict(overrides or {}), workload, state, images, train, threads, seed, train_weights)
    return ctx, desc


def load_weights_file(path: str) -> dict[str, Tensor]:
    """A torchvision Mask R-CNN state_dict (or a training checkpoint holding one under "model")."""
    if not Path(path).is_file():
        raise ValueError(f"--weights {path}: no such file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"--weights {path}: not a torch state_dict ({type(e).__name__}: {e})") from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(f"--weights {path}: expected a dict of tensors (a state_dict)")
    return state


def coco_images(root: str, count: int, split: str = "val2017") -> list[Tensor]:
    """The first ``count`` images of a COCO-layout split, as [3, h, w] floats in [0, 1]."""
    from mrcnn.data.coco import CocoDataset

    dataset = CocoDataset(root, split)
    return [dataset[i][0].float() / 255 for i in range(min(count, len(dataset)))]


def save_context(ctx: Context, workdir: Path) -> None:
    meta = {"preset": ctx.preset, "overrides": ctx.overrides, "workload": dataclasses.asdict(ctx.workload),
            "threads": ctx.threads, "seed": ctx.seed}
    (workdir / "context.json").write_text(json.dumps(meta))
    torch.save({"weights": ctx.weights, "images": ctx.images, "train_samples": ctx.train_samples,
                "train_weights": ctx.train_weights}, workdir / "inputs.pt")


def load_context(workdir: Path) -> Context:
    meta = json.loads((workdir / "context.json").read_text())
    inputs = torch.load(workdir / "inputs.pt", weights_only=True)
    w = meta["workload"]
    workload = Workload(w["preset"], tuple(w["image_size"]), w["batch_size"], w["images"])
    return Context(meta["preset"], meta["overrides"], workload, inputs["weights"], inputs["images"],
                   inputs["train_samples"], meta["threads"], meta["seed"], inputs["train_weights"])


# ------------------------------------------------------------------------------------------------
# Pipelines: one call of a case


def compact(outputs: list[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
    """CPU copies with masks thresholded to bool: 1/4 of the memory, same parity statistics."""
    out = []
    for d in outputs:
        c = {k: v.detach().cpu() for k, v in d.items() if k != "masks"}
        if "masks" in d:
            m = d["masks"].detach().cpu()
            c["masks"] = m if m.dtype == torch.bool else m > 0.5
        out.append(c)
    return out


class Pipeline:
    """A built case: ``call(index)`` runs call ``index`` (inference: compact outputs; training: losses)."""

    def __init__(self, row: Row, ctx: Context) -> None:
        self.row, self.ctx = row, ctx
        self.case = row.case
        self.cfg = ctx.config(row.variant)
        self.device = backends.device(self.case.backend)
        self.model: torch.nn.Module | None = None
        self._deploy: Any = None
        self._fn: Callable[[int], Any] | None = None
        self._infer: Callable[[list[Tensor]], list[dict[str, Tensor]]] | None = None

    def setup(self) -> None:
        case, ctx = self.case, self.ctx
        torch.manual_seed(ctx.seed)
        weights = ctx.train_weights if case.phase == "training" else ctx.weights
        if case.impl == "torchvision":
            from mrcnn.reference import torchvision_model

            model = torchvision_model(self.cfg)
            model.load_state_dict(weights)
        else:
            from mrcnn.model import MaskRCNN
            from mrcnn.weights import load_torchvision_weights

            model = load_torchvision_weights(MaskRCNN(self.cfg), weights)
        model = model.train(case.phase == "training").to(self.device)
        self.model = model
        if case.phase == "training":
            # Compiled: the training forward in one graph (fullgraph), backward by AOTAutograd.
            forward = torch.compile(model, fullgraph=True) if case.compiler == "inductor" else model
            self._fn = self._training_step(forward)
            return
        if case.compiler in ("export", "aoti"):
            from mrcnn.export import DeployOnFirstCall

            self._deploy = DeployOnFirstCall(model, "exported" if case.compiler == "export" else "aoti")
            forward = self._deploy
        elif case.compiler == "inductor":
            forward = torch.compile(model, fullgraph=case.impl == "static")
        else:
            forward = model
        self._infer = (self._torchvision_inference if case.impl == "torchvision" else self._static_inference)(forward)
        self._fn = lambda index: self.infer(ctx.call_images(index))

    def call(self, index: int) -> Any:
        assert self._fn is not None, "setup() first"
        return self._fn(index)

    def infer(self, images: list[Tensor]) -> list[dict[str, Tensor]]:
        """Inference cases: any list of images -> compact torchvision-style outputs."""
        assert self._infer is not None, "an inference case, after setup()"
        return self._infer(images)

    def counters(self) -> dict[str, float]:
        """Compile counters of this row's backend (process-wide, absolute)."""
        if self.case.backend == "xla":
            return backends.xla_counters()
        if self.case.compiler == "inductor":
            return backends.dynamo_counters()
        if self._deploy is not None:
            return self._deploy.counters()
        return {}

    # -- inference -------------------------------------------------------------------------------

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.case.precision == "bf16")

    def _static_inference(self, forward: Callable):
        """images -> host transform -> (device) forward -> sync -> CPU -> postprocess."""
        from mrcnn.postprocess import postprocess
        from mrcnn.structures import Detections, ImageBatch
        from mrcnn.transform import to_image_batch

        cfg, dev = self.cfg, self.device

        def run(images: list[Tensor]) -> list[dict[str, Tensor]]:
            with torch.no_grad():
                # Transform on the host: on XLA, resizing each original size would compile anew.
                batch = to_image_batch(images, cfg)
                with self._autocast():
                    det = forward(ImageBatch(*(t.to(dev) for t in batch)))
                backends.sync(dev)
                det = Detections(*(t.float().cpu() if t.is_floating_point() else t.cpu() for t in det))
            return compact(postprocess(det, batch))

        return run

    def _torchvision_inference(self, forward: Callable):
        """images -> device -> torchvision MaskRCNN (its own transform and postprocess) -> sync -> CPU."""
        dev = self.device

        def run(images: list[Tensor]) -> list[dict[str, Tensor]]:
            with torch.no_grad(), self._autocast():
                outputs = forward([img.to(dev) for img in images])
            backends.sync(dev)
            return compact([{k: v.float() if v.is_floating_point() else v for k, v in o.items()} for o in outputs])

        return run

    # -- training --------------------------------------------------------------------------------

    def _training_step(self, forward: Callable) -> Callable[[int], dict[str, float]]:
        """One SGD step (torchvision reference settings, lr 0.002) on the run's training samples."""
        from mrcnn.data.collate import collate
        from mrcnn.structures import ImageBatch, Targets
        from mrcnn.train import build_optimizer

        dev, samples = self.device, self.ctx.train_samples
        assert self.model is not None
        optimizer = build_optimizer(self.model, lr=0.002, momentum=0.9, weight_decay=1e-4)
        if self.case.impl == "torchvision":
            images = [img.float().div(255).to(dev) for img, _ in samples]
            targets = [{k: t[k].to(dev) for k in ("boxes", "labels", "masks")} for _, t in samples]
            inputs: tuple = (images, targets)
        else:
            batch, targets_, _ = collate(samples, self.cfg)
            inputs = (ImageBatch(*(t.to(dev) for t in batch)), Targets(*(t.to(dev) for t in targets_)))

        def step(_index: int) -> dict[str, float]:
            optimizer.zero_grad(set_to_none=True)
            with self._autocast():
                losses = forward(*inputs)
            total = sum(losses.values())
            total.backward()
            optimizer.step()
            backends.sync(dev)
            return {"loss": float(total.detach())}

        return step


# ------------------------------------------------------------------------------------------------
# Running a row in this process, or in a bounded worker


class RowTimeout(Exception):
    """The worker passed its time limit; ``detail`` says how far it got."""

    def __init__(self, limit: float, detail: str, counters: dict | None = None, reasons: dict | None = None) -> None:
        super().__init__(f"> {limit:g} s ({detail})" if detail else f"> {limit:g} s")
        self.limit, self.detail, self.counters, self.reasons = limit, detail, counters or {}, reasons or {}


class RowError(Exception):
    pass


class InProcessRow:
    """``setup()`` once, then ``call(index) -> (seconds, result, peak GB, call's extra GB)``."""

    def __init__(self, row: Row, ctx: Context) -> None:
        self.pipeline = Pipeline(row, ctx)

    def setup(self) -> None:
        self.pipeline.setup()

    def call(self, index: int, first: bool = False) -> tuple[float, Any, float, float]:
        return timed_call(self.pipeline, index)

    def counters(self) -> dict[str, float]:
        return self.pipeline.counters()

    def close(self) -> None:
        pass


def timed_call(pipeline: Pipeline, index: int) -> tuple[float, Any, float, float]:
    """(seconds, result, peak memory GB, peak minus memory before the call GB) of one call."""
    before = backends.memory_reset(pipeline.device)
    t0 = time.perf_counter()
    result = pipeline.call(index)
    seconds = time.perf_counter() - t0
    peak = backends.memory_peak(pipeline.device)
    return seconds, result, peak, peak - before


class WorkerRow:
    """A row run by ``python -m mrcnn_bench.worker`` in its own process group.

    The time limit bounds set-up plus the first call (time to first result), and then each call.
    The worker writes its compile counters to ``status.json`` every half second (and after each
    call), so a killed worker still says how far it got. ``PYTHONPATH`` puts the variant's
    checkout (if any) first, so its ``mrcnn`` is the one imported; the harness is this one.
    """

    def __init__(self, row: Row, workdir: Path, limit: float) -> None:
        self.row, self.limit = row, float(limit)
        self.dir = workdir / row.name.replace("/", "_").replace(":", "_")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self._buf = b""
        self._deadline = 0.0
        self.last_counters: dict[str, float] = {}
        self.last_reasons: dict[str, list[str]] = {}

    def setup(self) -> None:
        """Start the worker and wait until it has built its model (counts against the first call)."""
        env = dict(os.environ)
        harness = str(Path(__file__).resolve().parent.parent)
        paths = [p for p in (self.row.variant.code, harness, env.get("PYTHONPATH")) if p]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        (self.dir / "row.json").write_text(json.dumps(
            {"case": dataclasses.asdict(self.row.case), "variant": dataclasses.asdict(self.row.variant)}))
        self._log = open(self.dir / "worker.log", "wb")  # noqa: SIM115 (closed in close())
        self._deadline = time.monotonic() + self.limit
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mrcnn_bench.worker", str(self.workdir), str(self.dir)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env,
            start_new_session=True,  # its own process group: killing it kills inductor's compile workers too
        )
        msg = self._receive()
        if msg.get("event") != "ready":
            raise RowError(msg.get("error") or f"worker sent {msg} instead of 'ready'")

    def call(self, index: int, first: bool = False) -> tuple[float, Any, float, float]:
        if not first:
            self._deadline = time.monotonic() + self.limit
        out = self.dir / "outputs.pt"
        self._send({"cmd": "call", "index": index, "out": str(out)})
        msg = self._receive()
        if not msg.get("ok"):
            raise RowError(msg.get("error", f"bad reply {msg}"))
        self.last_counters = msg.get("counters", {})
        self.last_reasons = msg.get("reasons") or {}
        result = torch.load(out, weights_only=True)
        out.unlink()
        return float(msg["seconds"]), result, float(msg["peak_gb"]), float(msg["delta_gb"])

    def counters(self) -> dict[str, float]:
        return dict(self.last_counters)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self._send({"cmd": "exit"})
                self.proc.wait(timeout=10)
        self._kill()
        with contextlib.suppress(Exception):
            self._log.close()

    def _kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(Exception):
                pipe.close()

    def _send(self, msg: dict) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError as e:
            raise RowError(f"worker exited: {self.log_tail()}") from e

    def _receive(self) -> dict:
        """Next JSON line from the worker, before the deadline; kills the worker on timeout."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            if b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                with contextlib.suppress(ValueError):
                    return json.loads(line)
                continue
            remaining = self._deadline - time.monotonic()
            ready = select.select([fd], [], [], max(0.0, remaining))[0] if remaining > 0 else []
            if not ready:
                status = self._read_status()
                self._kill()
                raise RowTimeout(self.limit, describe_status(status), status.get("counters"), status.get("reasons"))
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self._kill()
                raise RowError(f"worker exited with code {self.proc.returncode}: {self.log_tail()}")
            self._buf += chunk

    def _read_status(self) -> dict:
        try:
            return json.loads((self.dir / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def log_tail(self, n: int = 1500) -> str:
        with contextlib.suppress(Exception):
            self._log.flush()
            return (self.dir / "worker.log").read_bytes()[-n:].decode(errors="replace").strip()
        return ""


def describe_status(status: dict) -> str:
    """'in first call, UncachedCompile=12, ...' from a worker's last status.json."""
    if not status:
        return "no status from the worker yet"
    parts = [f"in {status.get('phase', '?')}"]
    c = status.get("counters", {})
    if "uncached_compile" in c:
        parts.append(f"UncachedCompile={c['uncached_compile']}, XLA CompileTime={c['compile_s']:.0f} s, "
                     f"fallback ops={c.get('fallback_ops', '?')}")
    if "unique_graphs" in c:
        parts.append(f"dynamo graphs={c['unique_graphs']}, graph breaks={c['graph_breaks']}")
    return ", ".join(parts)


# ------------------------------------------------------------------------------------------------
# Machine peaks, FLOPs, machine state


def _best_rate(fn: Callable[[], Any], flops: float, reps: int) -> float:
    fn()
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return flops / best / 1e9


def measure_peaks(reps: int = 5) -> dict[str, float]:
    """GFLOP/s of a 2048^3 matmul and a channels-last 3x3 conv [1,256,100,136] 256->256, fp32 and bf16.

    These are the dense kernels that dominate Mask R-CNN; their best-of-``reps`` rates stand in for
    the machine's peak (2 FLOP per multiply-add, as FlopCounterMode counts).
    """
    import torch.nn.functional as F

    out = {}
    with torch.no_grad():
        for dtype, tag in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            n = 2048
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            out[f"matmul_{tag}"] = _best_rate(lambda a=a, b=b: a @ b, 2.0 * n**3, reps)
            x = torch.randn(1, 256, 100, 136, dtype=dtype).to(memory_format=torch.channels_last)
            w = torch.randn(256, 256, 3, 3, dtype=dtype).to(memory_format=torch.channels_last)
            flops = 2.0 * 256 * 256 * 9 * 100 * 136
            out[f"conv3x3_{tag}"] = _best_rate(lambda x=x, w=w: F.conv2d(x, w, padding=1), flops, reps)
    return out


def count_flops(fn: Callable[[], Any]) -> float:
    """FLOPs (2 per multiply-add) that ``FlopCounterMode`` sees in one call of ``fn``."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


def case_flops(row: Row, ctx: Context) -> float:
    """FLOPs of one call of ``row`` (eager, CPU, same inputs): the work its GFLOP/s divides."""
    case = dataclasses.replace(row.case, backend="cpu", compiler="eager", precision="fp32", bounded=False)
    pipeline = Pipeline(Row(case, row.variant), ctx)
    pipeline.setup()
    return count_flops(lambda: pipeline.call(0))


def machine_state(pids: list[int] | None = None) -> dict[str, float]:
    """Load average, available memory and resident sizes (GB): what else was using the machine."""
    state: dict[str, float] = {"loadavg_1m": os.getloadavg()[0]}
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                state["mem_available_gb"] = int(line.split()[1]) / 2**20
    state["rss_gb"] = sum(backends._proc_status_gb("VmRSS", pid) for pid in [os.getpid(), *(pids or [])])
    return state


# ------------------------------------------------------------------------------------------------
# The run


@dataclass
class RowResult:
    row: Row
    status: str = "pending"  # ok | skipped | timeout | error
    detail: str = ""
    setup_s: float = math.nan
    first_result_s: float = math.nan
    times: list[float] = field(default_factory=list)
    counters_start: dict[str, float] = field(default_factory=dict)
    counters_warm: dict[str, float] = field(default_factory=dict)
    counters_end: dict[str, float] = field(default_factory=dict)
    counters_rounds: dict[str, float] = field(default_factory=dict)  # summed over the timed calls only
    reasons: dict[str, list[str]] = field(default_factory=dict)  # dynamo's graph-break / recompile reasons
    accuracy: dict[str, float] = field(default_factory=dict)  # COCO metrics (--eval)
    parity: list[dict[str, Any]] = field(default_factory=list)
    peak_mem_gb: float = math.nan
    call_mem_gb: float = math.nan
    flops: float = math.nan
    losses: list[float] = field(default_factory=list)


@dataclass
class RunOptions:
    workload: Workload
    rows: list[Row]
    rounds: int = 10
    warmup: int = 1
    threads: int | None = None
    seed: int = 0
    time_limit: float = 120.0
    weights: str | None = None
    coco_root: str | None = None
    coco_split: str = "val2017"  # the split of coco_root whose images are timed
    overrides: dict[str, Any] = field(default_factory=dict)
    fresh_compile_cache: bool = True
    progress: bool = True
    peak_reps: int = 5
    flops: bool = True
    profile: bool = False
    eval_images: int = 0  # COCO mAP of the eager rows on this many images of the evaluation set
    eval_root: str | None = None  # COCO-layout root for it (default: a generated synthetic val set)
    eval_split: str = "val2017"


_T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[mrcnn-bench {time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def _new_reasons(before: dict[str, list[str]], after: dict[str, list[str]]) -> dict[str, list[str]]:
    """The entries of ``after`` beyond those already in ``before`` (as multisets), per kind."""
    from collections import Counter

    return {kind: list((Counter(texts) - Counter(before.get(kind, []))).elements()) for kind, texts in after.items()}


def _delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: b[k] - a.get(k, 0) for k in b if isinstance(b[k], (int, float))}


def run(opts: RunOptions) -> dict[str, Any]:
    """Run every row interleaved; returns the raw run (see :mod:`mrcnn_bench.store` for its records)."""
    from mrcnn_bench.parity import parity_stats

    threads = opts.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    torch.manual_seed(opts.seed)
    results = [RowResult(row) for row in opts.rows]
    t_run = time.perf_counter()

    active = []
    for r in results:
        reason = r.row.case.skip_reason()
        if reason:
            r.status, r.detail = "skipped", reason
            log(f"{r.row.name}: skipped ({reason})")
        else:
            active.append(r)
    need_training = any(r.row.case.phase == "training" for r in active)
    ctx, weights_desc = make_context(opts.workload, opts.weights, opts.seed, threads, need_training,
                                     opts.coco_root, opts.overrides, opts.coco_split)
    log(f"{opts.workload.label}, {len(ctx.images)} image(s), threads {threads}, weights {weights_desc}")
    peaks_start = measure_peaks(opts.peak_reps) if opts.peak_reps else {}

    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mrcnn-bench-")))
        if opts.fresh_compile_cache:
            # A cold cache, so compile times are those of a first run (workers inherit it).
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(workdir / "inductor-cache")
            stack.callback(os.environ.pop, "TORCHINDUCTOR_CACHE_DIR", None)
        if any(r.row.in_worker for r in active):
            save_context(ctx, workdir)
        runners: dict[str, InProcessRow | WorkerRow] = {}
        for r in active:
            runner = WorkerRow(r.row, workdir, opts.time_limit) if r.row.in_worker else InProcessRow(r.row, ctx)
            stack.callback(runner.close)
            runners[r.row.name] = runner

        def call(r: RowResult, index: int, first: bool = False) -> Any:
            seconds, result, peak, extra = runners[r.row.name].call(index, first=first)
            r.peak_mem_gb = peak if math.isnan(r.peak_mem_gb) else max(peak, r.peak_mem_gb)
            r.call_mem_gb = extra if math.isnan(r.call_mem_gb) else max(extra, r.call_mem_gb)
            return seconds, result

        # Set-up and warm-up, row by row; a worker row gets the limit for set-up + first call.
        reasons_before: dict[str, dict[str, list[str]]] = {}
        for r in active:
            runner = runners[r.row.name]
            try:
                log(f"{r.row.name}: set-up" + (f" (bounded at {opts.time_limit:g} s)" if r.row.in_worker else ""))
                r.counters_start = runner.counters()
                if r.row.case.compiler == "inductor" and not r.row.in_worker:
                    reasons_before[r.row.name] = backends.dynamo_reasons()
                t0 = time.perf_counter()
                runner.setup()
                r.setup_s = time.perf_counter() - t0
                if not r.row.in_worker:
                    r.counters_start = runner.counters()
                for w in range(opts.warmup):
                    seconds, _ = call(r, w, first=w == 0)
                    if w == 0:
                        r.first_result_s = seconds
                        log(f"{r.row.name}: first result in {seconds:.2f} s (set-up {r.setup_s:.1f} s)")
                r.counters_warm = runner.counters()
                if r.row.name in reasons_before:
                    # Dynamo's reasons are process-wide: keep those its own warm-up added.
                    r.reasons = _new_reasons(reasons_before[r.row.name], backends.dynamo_reasons())
                r.status = "ok"
            except RowTimeout as e:
                r.status, r.detail, r.counters_end, r.reasons = "timeout", str(e), e.counters, e.reasons
                log(f"{r.row.name}: TIMEOUT {e}")
            except Exception as e:
                r.status, r.detail = "error", f"{type(e).__name__}: {e}"
                log(f"{r.row.name}: ERROR in set-up/warm-up\n{traceback.format_exc()}")

        # Interleaved rounds: the order rotates every round; each variant's reference row's output of
        # the round is the parity oracle for that variant's other inference rows.
        running = [r for r in active if r.status == "ok"]
        rounds: Any = range(opts.rounds)
        if opts.progress:
            from tqdm import tqdm

            rounds = tqdm(rounds, desc="rounds", file=sys.stderr, dynamic_ncols=True)
        worker_pids = [w.proc.pid for w in runners.values() if isinstance(w, WorkerRow) and w.proc]
        machine = [machine_state(worker_pids)]
        for rnd in rounds:
            index = opts.warmup + rnd
            order = running[rnd % len(running):] + running[: rnd % len(running)] if running else []
            outputs: dict[Row, Any] = {}
            for r in order:
                if r.status != "ok":
                    continue
                runner = runners[r.row.name]
                # Counters are process-wide: attribute to a row only what changed during its own call
                # (a worker reports its counters with each reply).
                before = (r.counters_end or r.counters_warm) if r.row.in_worker else runner.counters()
                try:
                    seconds, outputs[r.row] = call(r, index)
                    r.times.append(seconds)
                except RowTimeout as e:
                    r.status, r.detail, r.counters_end = "timeout", f"in round {rnd + 1}: {e}", e.counters
                    r.reasons = e.reasons
                    continue
                except Exception as e:
                    r.status, r.detail = "error", f"in round {rnd + 1}: {type(e).__name__}: {e}"
                    log(f"{r.row.name}: ERROR in round {rnd + 1}\n{traceback.format_exc()}")
                    continue
                after = runner.counters()
                r.counters_end = after
                for k, v in _delta(before, after).items():
                    r.counters_rounds[k] = r.counters_rounds.get(k, 0) + v
                if r.row.case.phase == "training":
                    r.losses.append(outputs[r.row]["loss"])
            machine.append(machine_state(worker_pids))
            for r in running:
                ref = Row(Case("torchvision"), r.row.variant)
                if r.row.case.phase == "inference" and r.row in outputs and ref in outputs and r.row != ref:
                    r.parity.extend(parity_stats(a, b) for a, b in zip(outputs[ref], outputs[r.row], strict=True))
        for r in active:
            runner = runners[r.row.name]
            if isinstance(runner, WorkerRow) and r.row.case.compiler == "inductor" and r.status != "timeout":
                r.reasons = runner.last_reasons
        if opts.eval_images:
            evaluate_rows([r for r in results if r.status == "ok"], runners, ctx, opts)

    peaks_end = measure_peaks(opts.peak_reps) if opts.peak_reps else {}
    if opts.flops:
        _count_flops(results, ctx)
    stages = None
    if opts.profile:
        from mrcnn_bench.profile import profile_stages

        log("profiling the stages of static and torchvision, eager")
        stages = profile_stages(ctx)
    return {
        "stages": stages,
        "workload": dataclasses.asdict(opts.workload),
        "rows": results,
        "peaks": {k: max(peaks_start[k], peaks_end[k]) for k in peaks_start},
        "machine_per_round": machine,
        "limit_s": opts.time_limit,
        "weights": weights_desc,
        "total_s": time.perf_counter() - t_run,
        "threads": threads,
        "options": {"rounds": opts.rounds, "warmup": opts.warmup, "seed": opts.seed,
                    "fresh_compile_cache": opts.fresh_compile_cache, "coco_root": opts.coco_root,
                    "coco_split": opts.coco_split, "overrides": opts.overrides},
    }


def _count_flops(results: list[RowResult], ctx: Context) -> None:
    """FLOPs per call, counted once per (implementation, phase, variant) on the eager CPU model."""
    cache: dict[tuple, float] = {}
    for r in results:
        if r.row.variant.code is not None or r.status != "ok":
            continue  # other code is counted in its own process only
        key = (r.row.case.impl, r.row.case.phase, r.row.variant)
        if key not in cache:
            try:
                cache[key] = case_flops(r.row, ctx)
            except Exception:
                log(f"FLOP count of {r.row.name} failed:\n{traceback.format_exc()}")
                cache[key] = math.nan
        r.flops = cache[key]


EVAL_CASES = ("static/eager", "torchvision/eager")


def evaluate_rows(results: list[RowResult], runners: dict[str, Any], ctx: Context, opts: RunOptions) -> None:
    """COCO box and mask AP (pycocotools) of the eager inference rows on ``opts.eval_images`` images."""
    from mrcnn.data.coco import CocoDataset
    from mrcnn.evaluate import CocoEvaluator

    with contextlib.ExitStack() as stack:
        root, split = opts.eval_root, opts.eval_split
        if root is None:  # the synthetic data set's val split, generated for this run
            from mrcnn.data.synthetic import generate

            root, split = stack.enter_context(tempfile.TemporaryDirectory(prefix="mrcnn_bench_val_")), "val"
            generate(root, opts.eval_images, seed=10_000 + ctx.seed, split=split, progress=False)
        dataset = CocoDataset.from_config(root, split, ctx.config(Variant()))
        count = min(opts.eval_images, len(dataset))
        for r in results:
            if r.row.case.name not in EVAL_CASES or r.row.in_worker:
                continue
            log(f"{r.row.name}: COCO evaluation on {count} images of {root} ({split})")
            pipeline = runners[r.row.name].pipeline
            evaluator = CocoEvaluator(dataset.coco, dataset.label_to_category_id)
            for i in range(count):
                image, target = dataset[i]
                evaluator.update(pipeline.infer([image.float() / 255]), [int(target["image_id"])])
            metrics = evaluator.summarize()
            r.accuracy = {"box_ap": metrics["bbox/AP"], "mask_ap": metrics["segm/AP"], "eval_images": count}
