"""The static model against torchvision on generated images, on every backend present, as one table.

Every row turns a list of images into torchvision-style ``list[dict]`` (resize, pad, forward, box
rescale and mask pasting included), with the same weights. Rows run interleaved in one process:

    for each round: for each row (order rotated every round): time one call on the round's image

so slow drift of a shared machine hits every row alike. The first call of each row is timed apart
("time to first result", compilation included); rounds report the median and IQR of steady state.

Rows that may never finish (torchvision on XLA did not finish one image in 15 minutes here, and
torch.compile of torchvision makes dozens of graphs) run in a worker subprocess bounded by
``--tv-time-limit``: on timeout the worker's process group is killed and the row reads
"> limit s" with the compile counters it had reached. A backend that is absent (CUDA here) is a
row marked "skipped" with the reason, never a missing row.

Parity is checked on the timed outputs themselves: each static row's detections against
torchvision eager's on the same image (:func:`parity_stats`). FLOPs are counted once per
implementation with ``FlopCounterMode``; the machine's matmul and conv peaks are measured in the
same run, so each row also reads as a fraction of peak.

Run it as ``python -m mrcnn.compare --preset tiny`` (or ``mrcnn compare``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.util
import json
import math
import os
import platform
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mrcnn.config import Config, get_config
from mrcnn.parity import match_detections
from mrcnn.structures import Detections, ImageBatch

__all__ = [
    "ROWS",
    "RowSpec",
    "add_arguments",
    "aggregate_parity",
    "match_detections",
    "parity_stats",
    "run",
    "run_comparison",
]

# ------------------------------------------------------------------------------------------------
# Rows


@dataclass(frozen=True)
class RowSpec:
    """One way of running inference: an implementation on a backend, maybe compiled."""

    name: str
    impl: str  # "static" | "torchvision"
    backend: str  # "cpu" | "xla" | "cuda"
    compiled: bool = False  # torch.compile (inductor)
    bf16: bool = False  # forward under torch.autocast(dtype=bfloat16)
    bounded: bool = False  # runs in a worker subprocess under the time limit


ROWS: dict[str, RowSpec] = {
    s.name: s
    for s in (
        RowSpec("torchvision/eager", "torchvision", "cpu"),
        RowSpec("static/eager", "static", "cpu"),
        RowSpec("static/inductor", "static", "cpu", compiled=True),
        RowSpec("static/inductor-bf16", "static", "cpu", compiled=True, bf16=True),
        RowSpec("static/xla", "static", "xla"),
        RowSpec("torchvision/inductor", "torchvision", "cpu", compiled=True, bounded=True),
        RowSpec("torchvision/xla", "torchvision", "xla", bounded=True),
        RowSpec("torchvision/cuda", "torchvision", "cuda"),
        RowSpec("static/cuda", "static", "cuda"),
        RowSpec("static/cuda-inductor", "static", "cuda", compiled=True),
        RowSpec("static/cuda-inductor-bf16", "static", "cuda", compiled=True, bf16=True),
    )
}
REFERENCE_ROW = "torchvision/eager"
# A worker-only row for tests of the time limit: its setup never finishes.
_TEST_ROWS = {"test/hang": RowSpec("test/hang", "hang", "cpu", bounded=True)}

# The targets: median latency as a multiple of a baseline row's median.
SPEED_TARGETS: dict[str, tuple[str, float]] = {
    "static/eager": (REFERENCE_ROW, 1.0),
    "static/inductor": (REFERENCE_ROW, 0.7),
    "static/inductor-bf16": (REFERENCE_ROW, 0.4),
    "static/xla": ("static/eager", 1.5),
}
PARITY_MIN_MATCHED = 0.90
PARITY_MIN_MASK_IOU = 0.85

DEFAULT_IMAGE_SIZES = {"tiny": ((240, 320),), "coco_r50_fpn": ((480, 640),)}
DEFAULT_TV_TIME_LIMIT = {"tiny": 120.0, "coco_r50_fpn": 300.0}


def row_unavailable(spec: RowSpec) -> str | None:
    """Why ``spec`` cannot run on this machine, or None when it can."""
    if spec.backend == "cuda" and not torch.cuda.is_available():
        return "no CUDA device"
    if spec.backend == "xla":
        if importlib.util.find_spec("torch_xla") is None:
            return "torch_xla is not installed"
        if not os.environ.get("PJRT_DEVICE"):
            return "PJRT_DEVICE is not set (use PJRT_DEVICE=CPU for XLA on the CPU)"
    return None


def parse_rows(text: str | None) -> list[RowSpec]:
    """Comma list of row names (None or "all": every row) -> specs, in the order given."""
    if text is None or text.strip() in ("", "all"):
        return list(ROWS.values())
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        raise ValueError(f"unknown row(s) {unknown}; choose from {list(ROWS)} (or 'all')")
    if len(set(names)) != len(names):
        raise ValueError(f"row listed twice in {names}")
    return [ROWS[n] for n in names]


# ------------------------------------------------------------------------------------------------
# Parity


def parity_stats(ref: dict[str, Tensor], other: dict[str, Tensor]) -> dict[str, Any]:
    """Partner statistics of ``other``'s detections against ``ref``'s, for one image.

    A partner has the same label, box IoU >= 0.9 and |score difference| <= 0.02 (see
    :func:`mrcnn.parity.match_detections`). Masks may be probabilities or booleans [N, 1, h, w];
    they are compared after thresholding at 0.5.

    Returns a dict: num_ref, num_other, matched, matched_ref and matched_other (fractions, 1.0 when
    both sides are empty), mask_iou_mean and mask_iou_min (NaN without a matched pair), mask_ious.
    """
    p = match_detections(ref, other)
    ious = [float(x) for x in p.mask_ious]
    return {
        "num_ref": p.num_ref,
        "num_other": p.num_other,
        "matched": p.matched,
        "matched_ref": p.ref_matched,
        "matched_other": p.other_matched,
        "mask_iou_mean": sum(ious) / len(ious) if ious else math.nan,
        "mask_iou_min": min(ious) if ious else math.nan,
        "mask_ious": ious,
    }


def aggregate_parity(per_image: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool :func:`parity_stats` over images: fractions of all detections, IoU over all pairs."""
    if not per_image:
        return {"images": 0, "matched_ref": math.nan, "matched_other": math.nan,
                "mask_iou_mean": math.nan, "mask_iou_min": math.nan}
    n_ref = sum(s["num_ref"] for s in per_image)
    n_other = sum(s["num_other"] for s in per_image)
    matched = sum(s["matched"] for s in per_image)
    ious = [x for s in per_image for x in s["mask_ious"]]
    return {
        "images": len(per_image),
        "num_ref": n_ref,
        "num_other": n_other,
        "matched": matched,
        "matched_ref": matched / n_ref if n_ref else float(n_other == 0),
        "matched_other": matched / n_other if n_other else float(n_ref == 0),
        "mask_iou_mean": sum(ious) / len(ious) if ious else math.nan,
        "mask_iou_min": min(ious) if ious else math.nan,
    }


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


# ------------------------------------------------------------------------------------------------
# Setting up and calling one row (in this process, or in a worker)


@dataclass
class Context:
    """What every row shares: config, weights, images, threads."""

    cfg: Config
    weights: dict[str, Tensor]
    images: list[Tensor]
    threads: int
    seed: int


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "xla":
        import torch_xla

        torch_xla.sync()
        # sync() only launches the graph; reading a result back (done by every row) waits for it.


def _device(backend: str) -> torch.device:
    if backend == "xla":
        import torch_xla

        return torch_xla.device()
    return torch.device(backend)


def _dynamo_counters() -> dict[str, float]:
    from torch._dynamo.utils import compilation_time_metrics, counters

    # Wall time of every frame compilation (dynamo tracing + inductor), one entry per frame.
    compile_s = float(sum(compilation_time_metrics.get("_compile.compile_inner", [])))
    return {
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "compile_s": compile_s,
    }


def _xla_counters() -> dict[str, float]:
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return {
        "uncached_compile": int(met.counter_value("UncachedCompile") or 0),
        "compile_s": (data[1] / 1e9) if data else 0.0,
        "fallback_ops": len(met.executed_fallback_ops()),
    }


class InProcessRow:
    """A row run by this process: ``setup()`` once, then ``call(images) -> list[dict]``."""

    def __init__(self, spec: RowSpec, ctx: Context) -> None:
        self.spec, self.ctx = spec, ctx
        self._fn: Callable[[list[Tensor]], list[dict[str, Tensor]]] | None = None

    def setup(self) -> None:
        spec, ctx = self.spec, self.ctx
        if spec.impl == "hang":
            while True:  # the time-limit test's worker
                time.sleep(1.0)
        torch.manual_seed(ctx.seed)
        device = _device(spec.backend)
        if spec.impl == "torchvision":
            from mrcnn.reference import torchvision_model

            model = torchvision_model(ctx.cfg).eval()
            model.load_state_dict(ctx.weights)
        else:
            from mrcnn.model import MaskRCNN
            from mrcnn.weights import load_torchvision_weights

            model = load_torchvision_weights(MaskRCNN(ctx.cfg).eval(), ctx.weights)
        model = model.to(device)
        if spec.compiled:
            model = torch.compile(model, fullgraph=spec.impl == "static")
        self.model = model
        self._fn = (_torchvision_pipeline if spec.impl == "torchvision" else _static_pipeline)(
            model, ctx.cfg, device, spec.bf16
        )

    def call(self, images: list[Tensor]) -> list[dict[str, Tensor]]:
        assert self._fn is not None, "setup() first"
        with torch.no_grad():
            return self._fn(images)

    def counters(self) -> dict[str, float]:
        """Compile counters of this row's backend (process-wide, absolute)."""
        if self.spec.backend == "xla":
            return _xla_counters()
        if self.spec.compiled:
            return _dynamo_counters()
        return {}


def _static_pipeline(model: torch.nn.Module, cfg: Config, device: torch.device, bf16: bool):
    """images -> host transform -> (device) forward -> sync -> CPU -> postprocess."""
    from mrcnn.postprocess import postprocess
    from mrcnn.transform import to_image_batch

    def forward(batch: ImageBatch) -> Detections:
        if not bf16:
            return model(batch)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            det = model(batch)
        return Detections(*(t.float() if t.is_floating_point() else t for t in det))

    def run(images: list[Tensor]) -> list[dict[str, Tensor]]:
        if device.type == "xla":
            # Transform on the host, then one transfer: done on XLA, the resize and the per-image
            # checks would each be a graph execution.
            batch = to_image_batch(images, cfg)
            det = forward(ImageBatch(*(t.to(device) for t in batch)))
        else:
            batch = to_image_batch([img.to(device) for img in images], cfg)
            det = forward(batch)
        _sync(device)
        return postprocess(Detections(*(t.cpu() for t in det)), batch)

    return run


def _torchvision_pipeline(model: torch.nn.Module, cfg: Config, device: torch.device, bf16: bool):
    """images -> device -> torchvision MaskRCNN (its own transform and postprocess) -> sync -> CPU."""

    def run(images: list[Tensor]) -> list[dict[str, Tensor]]:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            outputs = model([img.to(device) for img in images])
        _sync(device)
        return [{k: (v.float() if v.is_floating_point() else v).cpu() for k, v in o.items()} for o in outputs]

    return run


# ------------------------------------------------------------------------------------------------
# Bounded rows: a worker subprocess per row, killed when it passes the time limit


class RowTimeout(Exception):
    """The worker passed its time limit; ``detail`` says how far it got."""

    def __init__(self, limit: float, detail: str, counters: dict | None = None) -> None:
        super().__init__(f"> {limit:g} s ({detail})" if detail else f"> {limit:g} s")
        self.limit, self.detail, self.counters = limit, detail, counters or {}


class RowError(Exception):
    pass


class BoundedRow:
    """A row run by ``python -m mrcnn.compare --worker NAME`` in its own process group.

    The time limit bounds setup plus the first call (time to first result), and then each call.
    The worker writes its compile counters to ``status.json`` every half second (and after each
    call), so a killed worker still says how far it got.
    """

    def __init__(self, spec: RowSpec, workdir: Path, limit: float) -> None:
        self.spec, self.limit = spec, float(limit)
        self.dir = workdir / spec.name.replace("/", "_")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self._buf = b""
        self._deadline = 0.0
        self.setup_s = math.nan
        self.last_counters: dict[str, float] = {}

    def start(self) -> None:
        env = dict(os.environ)
        # Workers must import this very package, even when it is not installed.
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._log = open(self.dir / "worker.log", "wb")  # noqa: SIM115 (closed in close())
        self._deadline = time.monotonic() + self.limit
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mrcnn.compare", "--worker", self.spec.name,
             "--worker-dir", str(self.dir.parent)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env,
            start_new_session=True,  # its own process group: killing it kills inductor's compile workers too
        )

    def setup(self) -> None:
        """Start the worker and wait until it has built its model (counts against the first call)."""
        t0 = time.perf_counter()
        self.start()
        msg = self._receive()
        if msg.get("event") != "ready":
            raise RowError(f"worker sent {msg} instead of 'ready'")
        self.setup_s = time.perf_counter() - t0

    def call_index(self, index: int, first: bool = False) -> tuple[float, list[dict[str, Tensor]]]:
        """Run the worker on image ``index``; returns (seconds measured in the worker, compact outputs)."""
        if not first:
            self._deadline = time.monotonic() + self.limit
        out = self.dir / "outputs.pt"
        self._send({"cmd": "call", "image": index, "out": str(out)})
        msg = self._receive()
        if not msg.get("ok"):
            raise RowError(msg.get("error", f"bad reply {msg}"))
        self.last_counters = msg.get("counters", {})
        outputs = torch.load(out, weights_only=True)
        out.unlink()
        return float(msg["seconds"]), outputs

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

    # -- plumbing ---------------------------------------------------------------------------------

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
            raise RowError(f"worker exited: {self._log_tail()}") from e

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
                raise RowTimeout(self.limit, _describe_status(status), status.get("counters"))
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self._kill()
                raise RowError(f"worker exited with code {self.proc.returncode}: {self._log_tail()}")
            self._buf += chunk

    def _read_status(self) -> dict:
        try:
            return json.loads((self.dir / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def _log_tail(self, n: int = 1500) -> str:
        with contextlib.suppress(Exception):
            self._log.flush()
            return (self.dir / "worker.log").read_bytes()[-n:].decode(errors="replace").strip()
        return ""


def _describe_status(status: dict) -> str:
    """'phase: first call, UncachedCompile=12, ...' from a worker's last status.json."""
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


def _worker_main(name: str, workdir: Path) -> int:
    """Body of ``--worker``: JSON commands on stdin, JSON replies on the original stdout."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever else prints (torch, XLA) goes to the log, not into the protocol
    spec = {**ROWS, **_TEST_ROWS}[name]
    rowdir = workdir / name.replace("/", "_")
    state = {"phase": "setup", "counters": {}}
    t_start = time.monotonic()

    def write_status() -> None:
        state["elapsed_s"] = time.monotonic() - t_start
        tmp = rowdir / "status.json.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, rowdir / "status.json")

    row: InProcessRow | None = None

    def heartbeat() -> None:
        while True:
            with contextlib.suppress(Exception):  # counters are read while the main thread writes them
                # Not during set-up: reading counters imports torch_xla, which would race (and
                # deadlock) with the main thread's own import of it.
                if row is not None and state["phase"] != "setup":
                    state["counters"] = row.counters()
                write_status()
            time.sleep(0.5)

    threading.Thread(target=heartbeat, daemon=True).start()
    meta = json.loads((workdir / "context.json").read_text())
    torch.set_num_threads(meta["threads"])
    ctx = Context(
        cfg=get_config(meta["preset"]),
        weights=torch.load(workdir / "weights.pt", weights_only=True) if spec.impl != "hang" else {},
        images=torch.load(workdir / "images.pt", weights_only=True) if spec.impl != "hang" else [],
        threads=meta["threads"],
        seed=meta["seed"],
    )
    row = InProcessRow(spec, ctx)
    row.setup()
    state["phase"] = "first call"
    print(json.dumps({"event": "ready"}), file=proto)
    calls = 0
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "exit":
            break
        try:
            t0 = time.perf_counter()
            outputs = row.call([ctx.images[msg["image"]]])
            seconds = time.perf_counter() - t0
            torch.save(compact(outputs), msg["out"])
            calls += 1
            state["phase"] = f"call {calls + 1}"
            state["counters"] = row.counters()
            reply = {"ok": True, "seconds": seconds, "counters": state["counters"]}
        except Exception:
            reply = {"ok": False, "error": traceback.format_exc(limit=8)}
        print(json.dumps(reply), file=proto)
    return 0


# ------------------------------------------------------------------------------------------------
# Machine peaks and FLOPs


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

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


# Where the time goes: eager stage timings from forward hooks (same module names in both models).
_STAGE_MODULES = (
    "backbone.body", "backbone.fpn", "rpn.head", "rpn", "roi_heads.box_head", "roi_heads.box_predictor",
    "roi_heads.mask_head", "roi_heads.mask_predictor", "roi_heads",
)
_STAGE_ROWS = (
    ("backbone: ResNet body", ("backbone.body",), ()),
    ("backbone: FPN", ("backbone.fpn",), ()),
    ("RPN head (convs)", ("rpn.head",), ()),
    ("RPN rest: anchors, top-k, decode, NMS", ("rpn",), ("rpn.head",)),
    ("box head (MLP) + predictor", ("roi_heads.box_head", "roi_heads.box_predictor"), ()),
    ("RoI heads rest: RoIAlign x2, box decode, NMS", ("roi_heads",),
     ("roi_heads.box_head", "roi_heads.box_predictor", "roi_heads.mask_head", "roi_heads.mask_predictor")),
    ("mask head (convs)", ("roi_heads.mask_head",), ()),
    ("mask predictor (deconv + 1x1)", ("roi_heads.mask_predictor",), ()),
    ("outside the network: resize, pad, box rescale, mask paste", ("total",),
     ("backbone.body", "backbone.fpn", "rpn", "roi_heads")),
    ("total, end to end", ("total",), ()),
)


def stage_times(runs: dict[str, tuple[torch.nn.Module, Callable[[], Any]]], reps: int = 3) -> dict[str, dict]:
    """Median seconds per stage of :data:`_STAGE_ROWS`, per run, over ``reps`` interleaved eager calls.

    ``runs`` maps a name to (model, call). Eager CPU ops run synchronously, so timing each module's
    forward with hooks is exact; a stage called several times per image is summed.
    """
    sums: dict[str, float] = {}
    starts: dict[str, float] = {}
    handles = []
    for model, _ in runs.values():
        for name in _STAGE_MODULES:
            module = model.get_submodule(name)

            def pre(_m, _a, name=name) -> None:
                starts[name] = time.perf_counter()

            def post(_m, _a, _o, name=name) -> None:
                sums[name] = sums.get(name, 0.0) + time.perf_counter() - starts[name]

            handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    per_rep: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    try:
        with torch.no_grad():
            for _, call in runs.values():
                call()
            for _ in range(reps):
                for name, (_, call) in runs.items():
                    sums.clear()
                    t0 = time.perf_counter()
                    call()
                    sums["total"] = time.perf_counter() - t0
                    per_rep[name].append(dict(sums))
    finally:
        for h in handles:
            h.remove()
    out: dict[str, dict] = {}
    for run_name, reps_ in per_rep.items():
        out[run_name] = {}
        for label, plus, minus in _STAGE_ROWS:
            values = [sum(r.get(k, 0.0) for k in plus) - sum(r.get(k, 0.0) for k in minus) for r in reps_]
            out[run_name][label] = _median_iqr(values)[0]
    return out


def profile_stages(ctx: Context, reps: int = 3) -> dict[str, dict[str, float]]:
    """Stage timings of the static and the torchvision model, eager on the CPU, on the first image."""
    from mrcnn.model import MaskRCNN
    from mrcnn.reference import torchvision_model
    from mrcnn.weights import load_torchvision_weights

    cpu = torch.device("cpu")
    static = load_torchvision_weights(MaskRCNN(ctx.cfg).eval(), ctx.weights)
    tv = torchvision_model(ctx.cfg).eval()
    tv.load_state_dict(ctx.weights)
    images = ctx.images[:1]
    static_fn = _static_pipeline(static, ctx.cfg, cpu, False)
    tv_fn = _torchvision_pipeline(tv, ctx.cfg, cpu, False)
    return stage_times(
        {"static": (static, lambda: static_fn(images)), "torchvision": (tv, lambda: tv_fn(images))}, reps
    )


# ------------------------------------------------------------------------------------------------
# The comparison


@dataclass
class RowResult:
    spec: RowSpec
    status: str = "pending"  # ok | skipped | timeout | error
    detail: str = ""
    setup_s: float = math.nan
    first_result_s: float = math.nan
    times: list[float] = field(default_factory=list)
    counters_start: dict[str, float] = field(default_factory=dict)
    counters_warm: dict[str, float] = field(default_factory=dict)
    counters_end: dict[str, float] = field(default_factory=dict)
    counters_rounds: dict[str, float] = field(default_factory=dict)  # summed over the timed calls only
    parity: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Options:
    preset: str = "tiny"
    rows: list[RowSpec] = field(default_factory=lambda: list(ROWS.values()))
    rounds: int = 10
    warmup: int = 1
    image_sizes: tuple[tuple[int, int], ...] | None = None
    images: int = 3
    threads: int | None = None
    seed: int = 0
    tv_time_limit: float | None = None
    weights: str | None = None
    fresh_compile_cache: bool = True
    progress: bool = True
    peak_reps: int = 5
    profile: bool = False


_T0 = time.monotonic()


def _log(msg: str) -> None:
    print(f"[compare {time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def _median_iqr(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return math.nan, math.nan
    t = torch.tensor(xs, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
    return float(q[1]), float(q[2] - q[0])


def machine_state(pids: list[int] | None = None) -> dict[str, float]:
    """Load average, available memory and resident sizes (GB): what else was using the machine."""
    state: dict[str, float] = {"loadavg_1m": os.getloadavg()[0]}
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                state["mem_available_gb"] = int(line.split()[1]) / 2**20
    rss = 0.0
    for pid in [os.getpid(), *(pids or [])]:
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) / 2**20
    state["rss_gb"] = rss
    return state


def _delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: b[k] - a.get(k, 0) for k in b}


def run_comparison(opts: Options) -> dict[str, Any]:
    """Run every row interleaved; returns a report dict (see :func:`report_frame`)."""
    from mrcnn.transform import resized_size, select_canvas
    from mrcnn.weights import synthetic_weights, textured_images

    cfg = get_config(opts.preset)
    threads = opts.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    torch.manual_seed(opts.seed)
    sizes = opts.image_sizes or DEFAULT_IMAGE_SIZES.get(opts.preset, ((cfg.min_size, cfg.min_size),))
    limit = opts.tv_time_limit or DEFAULT_TV_TIME_LIMIT.get(opts.preset, 300.0)
    results = [RowResult(spec) for spec in opts.rows]

    t_run = time.perf_counter()
    images = textured_images(tuple(sizes[k % len(sizes)] for k in range(opts.images)), opts.seed)
    buckets = []
    for img in images:
        h, w = resized_size(*img.shape[-2:], cfg)
        d = cfg.size_divisible
        buckets.append({
            "size": list(img.shape[-2:]), "resized": [h, w], "canvas": list(select_canvas([(h, w)], cfg)),
            "torchvision_padded": [-(-h // d) * d, -(-w // d) * d],
        })
    for b in buckets:
        if tuple(b["canvas"]) != tuple(b["torchvision_padded"]):
            _log(f"warning: image {b['size']} pads to {b['torchvision_padded']} in torchvision but to canvas "
                 f"{b['canvas']} here; border features differ, so parity is not expected to be exact")

    active = []
    for r in results:
        reason = row_unavailable(r.spec)
        if reason:
            r.status, r.detail = "skipped", reason
            _log(f"{r.spec.name}: skipped ({reason})")
        else:
            active.append(r)

    _log(f"preset {cfg.name}, {len(images)} image(s) {sorted({tuple(s) for s in sizes})}, threads {threads}")
    t0 = time.perf_counter()
    if opts.weights:
        weights = torch.load(opts.weights, map_location="cpu", weights_only=True)
        if "model" in weights and isinstance(weights["model"], dict):
            weights = weights["model"]
        weights_desc = f"file {opts.weights}"
    else:
        weights = synthetic_weights(cfg, seed=opts.seed)
        weights_desc = f"synthetic_weights(seed={opts.seed})"
    weights_s = time.perf_counter() - t0
    ctx = Context(cfg, weights, images, threads, opts.seed)
    _log(f"weights ({weights_desc}) in {weights_s:.1f} s")

    peaks_start = measure_peaks(opts.peak_reps)
    _log("peaks (GFLOP/s): " + ", ".join(f"{k} {v:.0f}" for k, v in peaks_start.items()))

    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mrcnn-compare-")))
        if opts.fresh_compile_cache and any(r.spec.compiled for r in active):
            # A cold cache, so compile times are those of a first run (workers inherit it).
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(workdir / "inductor-cache")
            stack.callback(os.environ.pop, "TORCHINDUCTOR_CACHE_DIR", None)
        if any(r.spec.bounded for r in active):
            (workdir / "context.json").write_text(
                json.dumps({"preset": opts.preset, "threads": threads, "seed": opts.seed}))
            torch.save(weights, workdir / "weights.pt")
            torch.save(images, workdir / "images.pt")

        runners: dict[str, InProcessRow | BoundedRow] = {}
        for r in active:
            runner = BoundedRow(r.spec, workdir, limit) if r.spec.bounded else InProcessRow(r.spec, ctx)
            if isinstance(runner, BoundedRow):
                stack.callback(runner.close)
            runners[r.spec.name] = runner

        def call(r: RowResult, index: int, first: bool = False) -> tuple[float, list[dict[str, Tensor]]]:
            runner = runners[r.spec.name]
            if isinstance(runner, BoundedRow):
                return runner.call_index(index, first=first)
            start = time.perf_counter()
            outputs = runner.call([images[index]])
            return time.perf_counter() - start, compact(outputs)

        def timed_call(r: RowResult, index: int) -> tuple[float, list[dict[str, Tensor]]]:
            """A round's call; counters are process-wide, so attribute to the row only its own calls."""
            runner = runners[r.spec.name]
            before = runner.counters()
            result = call(r, index)
            after = runner.counters()
            if isinstance(runner, BoundedRow):
                before = r.counters_end or r.counters_warm
            r.counters_end = after
            for k, v in _delta(before, after).items():
                r.counters_rounds[k] = r.counters_rounds.get(k, 0) + v
            return result

        # Set-up and warm-up, row by row; each bounded row gets `limit` for set-up + first call.
        for r in active:
            runner = runners[r.spec.name]
            try:
                if r.spec.compiled and not r.spec.bounded:
                    r.counters_start = runner.counters()
                _log(f"{r.spec.name}: set-up" + (f" (bounded at {limit:g} s)" if r.spec.bounded else ""))
                t0 = time.perf_counter()
                runner.setup()
                r.setup_s = time.perf_counter() - t0
                if not r.spec.bounded:
                    r.counters_start = runner.counters()
                for w in range(opts.warmup):
                    seconds, _ = call(r, w % len(images), first=w == 0)
                    if w == 0:
                        r.first_result_s = seconds
                        _log(f"{r.spec.name}: first result in {seconds:.2f} s (set-up {r.setup_s:.1f} s)")
                r.counters_warm = runner.counters()
                r.status = "ok"
            except RowTimeout as e:
                r.status, r.detail, r.counters_end = "timeout", str(e), e.counters
                _log(f"{r.spec.name}: TIMEOUT {e}")
            except Exception as e:
                r.status, r.detail = "error", f"{type(e).__name__}: {e}"
                _log(f"{r.spec.name}: ERROR in set-up/warm-up\n{traceback.format_exc()}")

        # Interleaved rounds: the order rotates every round; the reference row's output of the
        # round is the parity oracle for the others.
        running = [r for r in active if r.status == "ok"]
        rounds = range(opts.rounds)
        if opts.progress:
            from tqdm import tqdm

            rounds = tqdm(rounds, desc="rounds", file=sys.stderr, dynamic_ncols=True)
        worker_pids = [r.proc.pid for r in runners.values() if isinstance(r, BoundedRow) and r.proc]
        machine = [machine_state(worker_pids)]
        for rnd in rounds:
            index = rnd % len(images)
            order = running[rnd % len(running):] + running[: rnd % len(running)] if running else []
            outputs: dict[str, list[dict[str, Tensor]]] = {}
            for r in order:
                if r.status != "ok":
                    continue
                try:
                    seconds, outputs[r.spec.name] = timed_call(r, index)
                    r.times.append(seconds)
                except RowTimeout as e:
                    r.status, r.detail, r.counters_end = "timeout", f"in round {rnd + 1}: {e}", e.counters
                except Exception as e:
                    r.status, r.detail = "error", f"in round {rnd + 1}: {type(e).__name__}: {e}"
                    _log(f"{r.spec.name}: ERROR in round {rnd + 1}\n{traceback.format_exc()}")
            machine.append(machine_state(worker_pids))
            ref = outputs.get(REFERENCE_ROW)
            if ref is not None:
                for name, out in outputs.items():
                    if name != REFERENCE_ROW:
                        res = next(x for x in results if x.spec.name == name)
                        res.parity.extend(parity_stats(a, b) for a, b in zip(ref, out, strict=True))

    peaks_end = measure_peaks(opts.peak_reps)
    peaks = {k: max(peaks_start[k], peaks_end[k]) for k in peaks_start}

    flops = _count_model_flops(ctx, {r.spec.impl for r in results})
    stages = None
    if opts.profile:
        _log("profiling the stages of static and torchvision, eager")
        try:
            stages = profile_stages(ctx)
        except Exception:
            _log(f"stage profile failed:\n{traceback.format_exc()}")
    total_s = time.perf_counter() - t_run
    return {
        "preset": opts.preset,
        "rows": results,
        "peaks": peaks,
        "peaks_start": peaks_start,
        "peaks_end": peaks_end,
        "flops": flops,
        "stages": stages,
        "machine_per_round": machine,
        "images": buckets,
        "limit_s": limit,
        "weights": weights_desc,
        "weights_s": weights_s,
        "total_s": total_s,
        "environment": environment(threads, opts),
        "options": {k: v for k, v in dataclasses.asdict(opts).items() if k != "rows"}
        | {"rows": [s.name for s in opts.rows]},
    }


def _count_model_flops(ctx: Context, impls: set[str]) -> dict[str, float]:
    """FLOPs of one eager CPU forward per implementation on the first image."""
    flops: dict[str, float] = {}
    img = ctx.images[0]
    try:
        if "static" in impls:
            from mrcnn.model import MaskRCNN
            from mrcnn.transform import to_image_batch
            from mrcnn.weights import load_torchvision_weights

            model = load_torchvision_weights(MaskRCNN(ctx.cfg).eval(), ctx.weights)
            batch = to_image_batch([img], ctx.cfg)
            flops["static"] = count_flops(lambda: model(batch))
        if "torchvision" in impls:
            from mrcnn.reference import torchvision_model

            tv = torchvision_model(ctx.cfg).eval()
            tv.load_state_dict(ctx.weights)
            flops["torchvision"] = count_flops(lambda: tv([img]))
    except Exception:
        _log(f"FLOP count failed:\n{traceback.format_exc()}")
    return flops


def environment(threads: int, opts: Options) -> dict[str, Any]:
    """Versions, CPU, threads, seed, commit and date: what a result needs to be compared later."""
    env: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": threads,
        "seed": opts.seed,
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "pjrt_device": os.environ.get("PJRT_DEVICE"),
        "fresh_inductor_cache": opts.fresh_compile_cache,
    }
    for mod in ("torchvision", "torch_xla"):
        try:
            env[mod] = __import__(mod).__version__ if mod == "torchvision" else _dist_version(mod)
        except Exception:
            env[mod] = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                env["cpu"] = line.split(":", 1)[1].strip()
                break
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        flags = next((ln for ln in lines if ln.startswith("flags")), "")
        env["cpu_bf16"] = "avx512_bf16" in flags or "amx_bf16" in flags
    env["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    root = Path(__file__).resolve().parent.parent
    env["commit"] = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    env["dirty"] = None if status is None else bool(status)
    return env


def _dist_version(name: str) -> str | None:
    from importlib.metadata import version

    return version(name)


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


# ------------------------------------------------------------------------------------------------
# Report


COLUMNS = [
    "row", "status", "median_s", "iqr_s", "ratio_vs_tv", "first_result_s", "compile_s", "compiles/graphs",
    "gflops", "frac_peak", "parity_matched_tv", "parity_matched_static", "mask_iou_mean", "mask_iou_min",
    "target",
]


def _compile_summary(r: RowResult) -> tuple[float, str]:
    """(compile seconds, 'graphs=1 breaks=0 (+0 after warm-up)' or XLA's counts) for a row."""
    warm = _delta(r.counters_start, r.counters_warm) if r.counters_warm else {}
    later = r.counters_rounds
    if r.spec.backend == "xla" and warm:
        text = f"compiles={warm['uncached_compile']:.0f} (+{later.get('uncached_compile', 0):.0f} in rounds)"
        text += f", fallbacks={r.counters_end.get('fallback_ops', warm.get('fallback_ops', 0)):.0f}"
        return warm["compile_s"], text
    if r.spec.compiled and warm:
        text = (f"graphs={warm['unique_graphs']:.0f} breaks={warm['graph_breaks']:.0f} "
                f"(+{later.get('unique_graphs', 0):.0f} graphs in rounds)")
        return warm["compile_s"], text
    return math.nan, ""


def report_frame(report: dict[str, Any]):
    """The results as a pandas DataFrame with :data:`COLUMNS` (numbers left unformatted)."""
    import pandas as pd

    rows = {r.spec.name: r for r in report["rows"]}
    medians = {name: _median_iqr(r.times)[0] for name, r in rows.items()}
    ref_median = medians.get(REFERENCE_ROW, math.nan)
    peaks = report["peaks"]
    peak_fp32 = max(peaks["matmul_fp32"], peaks["conv3x3_fp32"])
    peak_bf16 = max(peaks["matmul_bf16"], peaks["conv3x3_bf16"])
    records = []
    for name, r in rows.items():
        med, iqr = _median_iqr(r.times)
        compile_s, compiles = _compile_summary(r)
        flops = report["flops"].get(r.spec.impl, math.nan)
        gflops = flops / med / 1e9 if med == med else math.nan
        on_cpu = r.spec.backend in ("cpu", "xla")  # the peaks were measured on the CPU
        peak = peak_bf16 if r.spec.bf16 else peak_fp32
        par = aggregate_parity(r.parity) if r.parity else None
        status = r.status if not r.detail else f"{r.status}: {r.detail}"
        if r.status == "ok" and len(r.times) == 0 and report["options"]["rounds"] > 0:
            status = "error: no timed round"
        records.append({
            "row": name,
            "status": status,
            "median_s": med,
            "iqr_s": iqr,
            "ratio_vs_tv": med / ref_median if ref_median == ref_median else math.nan,
            "first_result_s": r.first_result_s,
            "compile_s": compile_s,
            "compiles/graphs": compiles,
            "gflops": gflops,
            "frac_peak": gflops / peak if on_cpu else math.nan,
            "parity_matched_tv": par["matched_ref"] if par else math.nan,
            "parity_matched_static": par["matched_other"] if par else math.nan,
            "mask_iou_mean": par["mask_iou_mean"] if par else math.nan,
            "mask_iou_min": par["mask_iou_min"] if par else math.nan,
            "target": _target_verdict(name, med, medians, par),
        })
    return pd.DataFrame.from_records(records, columns=COLUMNS)


def _target_verdict(name: str, median: float, medians: dict[str, float], par: dict | None) -> str:
    if name not in SPEED_TARGETS:
        return ""
    base, factor = SPEED_TARGETS[name]
    base_med = medians.get(base, math.nan)
    label = "tv" if base == REFERENCE_ROW else base
    if median != median or base_med != base_med:
        return f"<= {factor:g}x {label}: not measured"
    ratio = median / base_med
    speed_ok = ratio <= factor
    # Mean, not min: the min is set by the smallest masks, where one pixel moves the IoU a lot.
    parity_ok = par is not None and par["matched_ref"] >= PARITY_MIN_MATCHED and (
        par["matched_other"] >= PARITY_MIN_MATCHED) and par["mask_iou_mean"] >= PARITY_MIN_MASK_IOU
    parity_txt = ""
    if base == REFERENCE_ROW and not parity_ok:
        parity_txt = ", parity FAILED" if par else ", parity not checked"
    return f"<= {factor:g}x {label}: {'met' if speed_ok else 'missed'} ({ratio:.3f}x){parity_txt}"


def stage_frame(report: dict[str, Any]):
    """Stage timings (``--profile``) as a DataFrame: seconds per implementation and static's share."""
    import pandas as pd

    stages = report["stages"]
    df = pd.DataFrame({f"{impl}_s": times for impl, times in stages.items()})
    df.index.name = "stage (eager, CPU, median of 3, interleaved)"
    if "static_s" in df:
        df["static_share"] = df["static_s"] / df["static_s"].iloc[-1]
    return df.reset_index()


def _fmt(x: Any, digits: int = 3) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return ""
        return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:.0f}"
    return str(x)


def format_table(report: dict[str, Any]) -> str:
    """Markdown: the main table, then peaks and FLOPs."""
    df = report_frame(report)
    shown = df.copy()
    for col in ("parity_matched_tv", "parity_matched_static"):
        shown[col] = [f"{v:.1%}" if v == v else "" for v in df[col]]
    for col in ("median_s", "iqr_s", "first_result_s", "compile_s", "gflops"):
        shown[col] = [_fmt(v) for v in df[col]]
    for col in ("ratio_vs_tv", "frac_peak", "mask_iou_mean", "mask_iou_min"):
        shown[col] = [_fmt(v, 3) for v in df[col]]
    for i, r in enumerate(report["rows"]):
        if r.status == "timeout" and not r.times:
            shown.loc[i, "median_s"] = f"> {report['limit_s']:g} s"
    out = [shown.to_markdown(index=False)]
    p = report["peaks"]
    out.append(
        "\nPeaks (GFLOP/s, best of start and end of run): "
        + ", ".join(f"{k} {v:.0f}" for k, v in p.items())
        + ". frac_peak: of the fp32 peak (max of matmul, conv) for fp32 rows, of the bf16 peak for bf16 rows."
    )
    if report["flops"]:
        out.append(
            "FLOPs per image (FlopCounterMode, eager forward on the canvas; NMS/RoIAlign not counted): "
            + ", ".join(f"{k} {v / 1e9:.1f} GFLOP" for k, v in report["flops"].items())
        )
    if report.get("stages"):
        out.append("\n" + stage_frame(report).to_markdown(index=False, floatfmt=".3f") + "\n")
    machine = report.get("machine_per_round") or []
    if machine:
        load = sorted(m["loadavg_1m"] for m in machine)[len(machine) // 2]
        mem = min(m.get("mem_available_gb", math.nan) for m in machine)
        rss = max(m["rss_gb"] for m in machine)
        out.append(
            f"During the rounds: median 1-min load average {load:.1f} on {report['environment']['affinity']} "
            f"usable cores (this run alone keeps it near its thread count), least memory available "
            f"{mem:.1f} GB, largest resident size of this run (with its workers) {rss:.1f} GB."
        )
    env = report["environment"]
    out.append(
        f"Preset {report['preset']}, images {[b['size'] for b in report['images']]} -> canvas "
        f"{report['images'][0]['canvas']}, weights {report['weights']}, {len(report['rows'])} rows, "
        f"rounds {report['options']['rounds']} (warm-up {report['options']['warmup']}), "
        f"threads {env['threads']}, seed {env['seed']}, time limit of bounded rows {report['limit_s']:g} s, "
        f"whole run {report['total_s']:.0f} s. "
        f"torch {env['torch']}, torchvision {env['torchvision']}, torch_xla {env['torch_xla']}, "
        f"CPU {env.get('cpu')}, commit {env['commit']}."
    )
    return "\n".join(out)


def to_json(report: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """Everything, raw per-round times included, as JSON-ready data."""
    rows = []
    for r in report["rows"]:
        rows.append({
            "row": r.spec.name, "spec": dataclasses.asdict(r.spec), "status": r.status, "detail": r.detail,
            "setup_s": r.setup_s, "first_result_s": r.first_result_s, "times_s": r.times,
            "counters_start": r.counters_start, "counters_after_warmup": r.counters_warm,
            "counters_end": r.counters_end, "counters_rounds": r.counters_rounds,
            "parity": aggregate_parity(r.parity) if r.parity else None,
        })
    out = {"name": name, **{k: v for k, v in report.items() if k != "rows"}}
    out["rows"] = rows
    out["table"] = json.loads(report_frame(report).to_json(orient="records"))
    return out


def write_outputs(report: dict[str, Any], out_dir: Path, name: str, table: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.json", out_dir / f"{name}.md", out_dir / f"{name}.csv"]
    paths[0].write_text(json.dumps(to_json(report, name), indent=1, default=_json_default) + "\n")
    paths[1].write_text(f"# {name}\n\n{table}\n")
    report_frame(report).to_csv(paths[2], index=False)
    return paths


def _json_default(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, (Path, torch.dtype)):
        return str(x)
    if isinstance(x, tuple):
        return list(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


# ------------------------------------------------------------------------------------------------
# Command line


def _parse_sizes(values: list[str] | None) -> tuple[tuple[int, int], ...] | None:
    if not values:
        return None
    sizes = []
    for value in values:
        for item in value.split(","):
            item = item.strip().lower()
            if not item:
                continue
            try:
                h, w = (int(x) for x in item.split("x"))
            except ValueError:
                raise ValueError(f"image size {item!r} is not HxW (e.g. 480x640)") from None
            if h <= 0 or w <= 0:
                raise ValueError(f"image size {item!r} must be positive")
            sizes.append((h, w))
    return tuple(sizes)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``mrcnn compare`` (also used by ``python -m mrcnn.compare``)."""
    parser.add_argument("--preset", default="tiny", help="config preset (default: tiny)")
    parser.add_argument("--rows", default=None,
                        help=f"comma list of rows (default: all): {', '.join(ROWS)}")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved timed rounds (default: 10)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="warm-up calls per row; the first is reported as time to first result "
                             "(default: 1)")
    parser.add_argument("--image-size", action="append", metavar="HxW",
                        help="image size(s), repeatable or comma list (default: one that fits a canvas of "
                             "the preset exactly: tiny 240x320, coco_r50_fpn 480x640)")
    parser.add_argument("--images", type=int, default=3, help="distinct generated images (default: 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: usable cores)")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and images (default: 0)")
    parser.add_argument("--tv-time-limit", type=float, default=None, metavar="SECONDS",
                        help="limit of each bounded row's set-up + first call, and of each later call "
                             "(default: 120 for tiny, 300 for coco_r50_fpn)")
    parser.add_argument("--weights", default=None,
                        help="torchvision Mask R-CNN state_dict to use instead of synthetic weights")
    parser.add_argument("--reuse-compile-cache", action="store_true",
                        help="use the usual inductor cache (default: a fresh one, so compile times are cold)")
    parser.add_argument("--out", default=None, metavar="DIR", help="write DIR/<name>.json, .md and .csv")
    parser.add_argument("--name", default=None, help="file name stem for --out (default: compare_<preset>)")
    parser.add_argument("--peak-reps", type=int, default=5,
                        help="repetitions of each peak-rate kernel, best taken (default: 5)")
    parser.add_argument("--profile", action="store_true",
                        help="also time each stage of the static and torchvision models (eager, CPU)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-dir", default=None, help=argparse.SUPPRESS)


def options_from_args(args: argparse.Namespace) -> Options:
    """Validated :class:`Options`; raises ValueError with a message meant for the user."""
    if args.rounds < 0 or args.warmup < 1 or args.images < 1 or args.peak_reps < 1:
        raise ValueError("--rounds must be >= 0, and --warmup, --images and --peak-reps >= 1")
    if args.threads is not None and args.threads < 1:
        raise ValueError("--threads must be >= 1")
    if args.tv_time_limit is not None and args.tv_time_limit <= 0:
        raise ValueError("--tv-time-limit must be > 0")
    get_config(args.preset)  # unknown preset -> ValueError
    return Options(
        preset=args.preset,
        rows=parse_rows(args.rows),
        rounds=args.rounds,
        warmup=args.warmup,
        image_sizes=_parse_sizes(args.image_size),
        images=args.images,
        threads=args.threads,
        seed=args.seed,
        tv_time_limit=args.tv_time_limit,
        weights=args.weights,
        fresh_compile_cache=not args.reuse_compile_cache,
        progress=not args.no_progress,
        peak_reps=args.peak_reps,
        profile=args.profile,
    )


def run(args: argparse.Namespace) -> int:
    """Entry point of ``mrcnn compare``: prints the table; non-zero when a row that ran errored."""
    if args.worker:
        return _worker_main(args.worker, Path(args.worker_dir))
    try:
        opts = options_from_args(args)
    except ValueError as e:
        print(f"mrcnn compare: error: {e}", file=sys.stderr)
        return 2
    report = run_comparison(opts)
    table = format_table(report)
    print(table)
    if args.out:
        name = args.name or f"compare_{opts.preset}"
        for path in write_outputs(report, Path(args.out), name, table):
            _log(f"wrote {path}")
    failed = [r.spec.name for r in report["rows"] if r.status == "error"]
    if failed:
        _log(f"rows that errored: {failed}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mrcnn.compare", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
