"""The CPU levers, each timed on and off in one interleaved run of the static model.

    python bench/studies/cpu_levers/levers.py channels_last [--workloads coco,tiny] [--rounds N] [--out results/levers]
    python bench/studies/cpu_levers/levers.py layout        [--workloads coco,tiny] [--rounds N]
    python bench/studies/cpu_levers/levers.py freezing      [--workloads coco,tiny] [--rounds N]
    python bench/studies/cpu_levers/levers.py linear        [--workloads coco,tiny] [--rounds N]
    python bench/studies/cpu_levers/levers.py aoti          [--workloads coco,tiny] [--rounds N]
    python bench/studies/cpu_levers/levers.py buckets       [--workloads coco_thresh075,coco,tiny_thresh075]
    python bench/studies/cpu_levers/levers.py report LEVER  # rewrite LEVER.md and LEVER.json from LEVER.jsonl

Levers (``off`` is the model and compiler as shipped):

- ``channels_last``: ``Config.channels_last`` False / True, eager and under inductor
  (``torch.compile(fullgraph=True, dynamic=False)``).
- ``layout``: the default ``channels_last="auto"`` (on the CPU: NHWC activations, the conv weights
  as loaded) against False and against True (weights converted too), eager and under inductor; and
  torchvision's own model (``torchvision_model``, eager, its own transform on the raw image) with its
  conv weights in channels_last against as shipped, the layout the harness gives its eager rows when
  the static model's resolves to channels_last. The committed run's inductor row converted the input
  to NHWC; it measured slower, so "auto" now keeps NCHW under torch.compile and that row compares
  two equal graphs.
- ``freezing``: inductor with ``torch._inductor.config.freezing`` False / True (constant folding,
  batch norm folded into the convolutions, weights prepacked for oneDNN and MKL), under no_grad.
  The option must be set globally while dynamo traces: ``torch.compile(options={"freezing": True})``
  and a backend that patches it around ``compile_fx`` do not freeze in torch 2.9 (dynamo has made
  the parameters graph inputs by then; no weight-pack pattern fires). Each compiled variant gets a
  forward code object of its own (:func:`mrcnn.frozen.own_forward`).
- ``linear``: the box head's linear layers (TwoMLPHead's fc6 and fc7, the predictor's two) through
  MKL's sgemm (``F.linear``, eager as shipped) or through oneDNN with the weights packed once
  (``torch.ops.mkldnn._linear_pointwise``); alone (``box_head``, on the P RoIs of one image, with the
  MKL-packed form freezing emits, ``torch.ops.mkl._mkl_linear``, as a third variant) and in the eager
  model. Under freezing, inductor packs fp32 linears for MKL whenever torch has MKL (x86); it has
  no option for oneDNN there.
- ``buckets``: the mask branch on all K slots (``mask_detection_buckets=()``, the single graph)
  against the default "auto" buckets run staged (:class:`mrcnn.staged.StagedDetector`: box stage,
  host read of the valid count, mask stage on the smallest bucket that holds it), eager and under
  inductor (each stage ``fullgraph=True, dynamic=False``), on workloads with few detections
  (``*_thresh075``) and with all K valid.
- ``aoti``: where an AOTInductor package loses time against inductor. Inductor as shipped (the CPU
  runs torchvision's NMS and RoIAlign kernels) against inductor on the pure-tensor ops
  (``ops_impl="tensor"``, the form every package is exported in), and that against the package
  (``mrcnn.export.build_packages``, loaded by ``DeployedModel``): the first ratio is the ops' share,
  the second the package's own (its compilation and its runner's call path). Eager on the two
  forms of the ops beside them. The package is built during set-up, so its first call holds no
  compilation.

Workloads: ``coco``: coco_r50_fpn, one textured 480x640 image (canvas 800x1088), weights
``synthetic_weights(cfg, seed=0)`` (calibrated: all 100 detection slots valid); ``tiny``: the tiny
preset, one 240x320 image (canvas 320x448), ``synthetic_weights(tiny, 0)``; ``*_thresh075``: the
same with ``box_score_thresh=0.75`` (a few detections, as ``results/runs``' thresh075 table). The
timed call is the model's forward (or staged form) on the prepared ``ImageBatch`` under no_grad
(the host's resize and mask pasting are the same for every setting and left out). Default rounds:
coco 20, tiny 40; each variant is called twice before the rounds (its first call, with any
compilation, is reported apart).

Method (:mod:`studies.onoff`): every round calls each variant of a workload once, the order
reversed every other round; each call is appended to ``OUT/LEVER.jsonl`` with the machine's state
(a rerun skips the rounds already there, so an interrupted run resumes; the variants are rebuilt
and recompiled). ``OUT/LEVER.json`` and ``OUT/LEVER.md`` hold, per workload and mode, the median of
the per-round ratio on / off with its 95% bootstrap interval, the rounds, the raw medians, the cores
other processes kept busy during the rounds, the first calls and the parity of on against off.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the studies' shared modules (studies.*)

import torch
import torch._inductor.config
from studies.onoff import paired, run_rounds
from torch import Tensor, nn
from torch._dynamo.utils import counters

from mrcnn.config import get_config
from mrcnn.export import DeployedModel, build_packages
from mrcnn.frozen import FrozenInference, own_forward
from mrcnn.model import MaskRCNN
from mrcnn.reference import torchvision_model
from mrcnn.staged import StagedDetector
from mrcnn.structures import ImageBatch
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, synthetic_weights, textured_images
from mrcnn_bench.base import (
    timing,
    vcs,
)
from mrcnn_bench.running import store
from mrcnn_bench.running.journal import read_lines
from mrcnn_bench.running.probes import machine_state

# name -> (preset, image size, default rounds, config changes)
WORKLOADS = {
    "coco": ("coco_r50_fpn", (480, 640), 20, {}),
    "coco_thresh075": ("coco_r50_fpn", (480, 640), 20, {"box_score_thresh": 0.75}),
    "tiny": ("tiny", (240, 320), 40, {}),
    "tiny_thresh075": ("tiny", (240, 320), 40, {"box_score_thresh": 0.75}),
}
LEVERS = ("channels_last", "layout", "freezing", "linear", "aoti", "buckets")
REPO = Path(__file__).resolve().parents[3]
Call = Callable[[], Any]


# ------------------------------------------------------------------------------------------------
# Variants: name -> call, and the pairs (mode, off, on) whose per-round ratio is reported


def _static(cfg, weights: dict[str, Tensor], **changes) -> MaskRCNN:
    return load_torchvision_weights(MaskRCNN(cfg.replace(**changes)).eval(), weights)


def _compiled(model: nn.Module, freezing: bool = False) -> Callable[[ImageBatch], Any]:
    """inductor, static shapes, one graph, on a forward of its own; with ``freezing``, the library's
    :class:`mrcnn.frozen.FrozenInference` (freezing patched in around every call, where dynamo and
    inductor read it at the first call; later calls of the same canvas compile nothing)."""
    return FrozenInference(model) if freezing else torch.compile(own_forward(model), fullgraph=True, dynamic=False)


class OneDNNLinear(nn.Module):
    """``linear`` through oneDNN, its weight packed once for ``rows`` input rows (inductor's freezing
    emits this op for low-precision weights and on CPUs without MKL)."""

    def __init__(self, linear: nn.Linear, rows: int) -> None:
        super().__init__()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows)
        self.bias = linear.bias.detach()

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


class MKLPackedLinear(nn.Module):
    """``linear`` through MKL's packed sgemm (what inductor's freezing emits for fp32 on x86)."""

    def __init__(self, linear: nn.Linear, rows: int) -> None:
        super().__init__()
        self.weight = linear.weight.detach()
        self.packed = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, rows)
        self.bias, self.rows = linear.bias.detach(), rows

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, self.rows)


BOX_LINEARS = ("box_head.fc6", "box_head.fc7", "box_predictor.cls_score", "box_predictor.bbox_pred")


def with_box_linears(model: MaskRCNN, kind: type[nn.Module], rows: int) -> MaskRCNN:
    """``model`` with the box head's four linear layers replaced by ``kind(linear, rows)``, in place."""
    for name in BOX_LINEARS:
        parent, attr = name.split(".")
        owner = getattr(model.roi_heads, parent)
        setattr(owner, attr, kind(getattr(owner, attr), rows))
    return model


def _layout_variants(cfg, weights: dict[str, Tensor], batch: ImageBatch, images: list[Tensor], modes: list[str]):
    """Static: channels_last False (off), True (on: weights converted) and "auto"; torchvision eager
    with its conv weights in channels_last (on) or as shipped (off), on the raw image."""
    calls: dict[str, Call] = {}
    pairs: list[tuple[str, str, str]] = []
    for mode in modes:
        states = {"off": False, "on": True, "auto": "auto"} if mode == "eager" else {"off": False, "auto": "auto"}
        for state, value in states.items():
            model = _static(cfg, weights, channels_last=value)
            fn = _compiled(model) if mode == "inductor" else model
            calls[f"{mode}:{state}"] = lambda fn=fn: fn(batch)
        pairs += [(mode, f"{mode}:off", f"{mode}:{state}") for state in list(states)[1:]]
    for state in ("off", "on"):
        reference = torchvision_model(cfg).eval()
        reference.load_state_dict(weights)
        if state == "on":
            reference.to(memory_format=torch.channels_last)
        calls[f"torchvision_eager:{state}"] = lambda reference=reference: reference(images)
    pairs.append(("torchvision_eager", "torchvision_eager:off", "torchvision_eager:on"))
    return calls, pairs


def variants(lever: str, cfg, weights: dict[str, Tensor], batch: ImageBatch, modes: list[str], images=None):
    """-> ({variant: call}, [(mode, off variant, on variant)]). ``images``: the raw images of ``batch``."""
    calls: dict[str, Call] = {}
    pairs: list[tuple[str, str, str]] = []
    if lever == "layout":
        calls, pairs = _layout_variants(cfg, weights, batch, images, modes)
    elif lever == "channels_last":
        for mode in modes:
            for state in ("off", "on"):
                model = _static(cfg, weights, channels_last=state == "on")
                fn = _compiled(model) if mode == "inductor" else model
                calls[f"{mode}:{state}"] = lambda fn=fn: fn(batch)
            pairs.append((mode, f"{mode}:off", f"{mode}:on"))
    elif lever == "freezing":
        for state in ("off", "on"):
            fn = _compiled(_static(cfg, weights), freezing=state == "on")
            calls[f"inductor:{state}"] = lambda fn=fn: fn(batch)
        pairs.append(("inductor", "inductor:off", "inductor:on"))
    elif lever == "linear":
        rows = batch.tensors.shape[0] * cfg.rpn_post_nms_top_n_test  # the box head's rows: B * P
        model = _static(cfg, weights)
        head = nn.Sequential(model.roi_heads.box_head, model.roi_heads.box_predictor)
        x = torch.randn(rows, cfg.fpn_channels * cfg.box_roi_size**2, generator=torch.Generator().manual_seed(0))
        x = x.relu().view(rows, cfg.fpn_channels, cfg.box_roi_size, cfg.box_roi_size)
        for state, kind in (("mkl", None), ("onednn", OneDNNLinear), ("mkl_packed", MKLPackedLinear)):
            m = with_box_linears(_static(cfg, weights), kind, rows) if kind else model
            h = nn.Sequential(m.roi_heads.box_head, m.roi_heads.box_predictor) if kind else head
            calls[f"box_head:{state}"] = lambda h=h: h(x)
        pairs += [("box_head", "box_head:mkl", "box_head:onednn"), ("box_head", "box_head:mkl", "box_head:mkl_packed")]
        onednn = with_box_linears(_static(cfg, weights), OneDNNLinear, rows)
        calls["eager:off"], calls["eager:on"] = (lambda: model(batch)), (lambda: onednn(batch))
        pairs.append(("eager", "eager:off", "eager:on"))
    elif lever == "aoti":
        calls, pairs = _aoti_variants(cfg, weights, batch)
    elif lever == "buckets":
        for mode in modes:
            single, auto = _static(cfg, weights, mask_detection_buckets=()), _static(cfg, weights)
            fn = _compiled(single) if mode == "inductor" else single
            # Inductor: the compiled staged form, built at the call's bucket only (not warm_ahead).
            staged = StagedDetector.compiled(auto) if mode == "inductor" else StagedDetector(auto)
            calls[f"{mode}:off"], calls[f"{mode}:on"] = (lambda fn=fn: fn(batch)), (lambda s=staged: s(batch))
            pairs.append((mode, f"{mode}:off", f"{mode}:on"))
    else:
        raise ValueError(f"unknown lever {lever!r}; choose from {LEVERS}")
    return calls, pairs


def _aoti_variants(cfg, weights: dict[str, Tensor], batch: ImageBatch) -> tuple[dict[str, Call], list]:
    """Inductor on each form of the ops, the AOTInductor package of the same weights, eager on each form."""
    shipped, tensor_ops = _static(cfg, weights), _static(cfg, weights, ops_impl="tensor")
    calls: dict[str, Call] = {}
    for name, model in (("off", shipped), ("tensor", tensor_ops)):
        fn = _compiled(model)
        calls[f"inductor:{name}"] = lambda fn=fn: fn(batch)
        calls[f"eager:{name}"] = lambda model=model: model(batch)
    canvas = tuple(batch.tensors.shape[-2:])
    # Left in the temp folder: whether a loaded package still reads its file is the runner's business.
    folder = tempfile.mkdtemp(prefix="levers_aoti_")
    built = build_packages(shipped, folder, canvas, batch_size=batch.tensors.shape[0], formats=("aoti",))
    package = DeployedModel(built["paths"]["aoti"])
    calls["inductor:aoti"] = lambda: package.detect(batch)
    pairs = [("inductor", "inductor:off", "inductor:tensor"), ("inductor", "inductor:off", "inductor:aoti"),
             ("inductor", "inductor:tensor", "inductor:aoti"), ("eager", "eager:off", "eager:tensor")]
    return calls, pairs


# ------------------------------------------------------------------------------------------------
# Parity and setup


def _difference(a: Any, b: Any) -> dict[str, Any]:
    """Max |on - off| per output field; valid and labels compared exactly."""
    if isinstance(a, Tensor):
        return {"max_abs": float((a - b).abs().max())}
    if isinstance(a, list):  # torchvision's outputs, one dict per image
        a, b = a[0], b[0]
        out = {"detections": [len(a["boxes"]), len(b["boxes"])]}
        if len(a["boxes"]) == len(b["boxes"]) > 0:
            out.update({f"{k}_max_abs": float((a[k] - b[k]).abs().max()) for k in ("boxes", "scores")})
            out["labels_equal"] = bool(torch.equal(a["labels"], b["labels"]))
        return out
    if isinstance(a, tuple) and not hasattr(a, "_fields"):  # the box head alone: (logits, deltas)
        return {f"out{i}_max_abs": float((x - y).abs().max()) for i, (x, y) in enumerate(zip(a, b))}
    out: dict[str, Any] = {"valid_equal": bool(torch.equal(a.valid, b.valid))}
    if hasattr(a, "labels"):
        out["labels_equal"] = bool(torch.equal(a.labels, b.labels))
    for field in ("boxes", "scores", "masks"):
        out[f"{field}_max_abs"] = float((getattr(a, field) - getattr(b, field)).abs().max())
    out["detections"] = int(a.valid.sum())
    return out


def setup(lever: str, workload: str, modes: list[str], warmup: int) -> tuple[dict[str, Call], list, dict]:
    preset, size, _, changes = WORKLOADS[workload]
    cfg = get_config(preset, **changes)
    weights_s, weights = timing.timed(lambda: synthetic_weights(cfg, seed=0))
    info: dict[str, Any] = {"preset": preset, "changes": changes, "image_size": list(size), "weights_s": weights_s}
    images = textured_images((size,), seed=0)
    batch = to_image_batch(images, cfg)
    info["canvas"] = list(batch.tensors.shape[-2:])
    calls, pairs = variants(lever, cfg, weights, batch, modes, images)
    first: dict[str, float] = {}
    outputs: dict[str, Any] = {}
    packs = {}
    with torch.no_grad():
        for name, call in calls.items():
            before = dict(counters["inductor"])
            first[name], outputs[name] = timing.timed(call)
            packs[name] = {k: v - before.get(k, 0) for k, v in counters["inductor"].items()
                           if "pack" in k and v - before.get(k, 0)}  # fmt: skip
            for _ in range(warmup - 1):
                call()
    info["first_call_s"] = first
    info["weight_packs"] = {k: v for k, v in packs.items() if v}  # freezing: the weights it prepacked
    info["parity"] = {f"{on} vs {off}": _difference(outputs[on], outputs[off]) for _, off, on in pairs}
    return calls, pairs, info


def _state() -> dict[str, Any]:
    state = machine_state()
    return {"pid": os.getpid(), **{k: state[k] for k in ("loadavg_1m", "wall_s", "cpu_busy_s", "own_cpu_s",
                                                         "steal_s") if k in state}}  # fmt: skip


def other_cores(rows: list[dict[str, Any]]) -> float | None:
    """Median over consecutive calls (of one process) of the cores other processes kept busy."""
    values = []
    for a, b in itertools.pairwise(rows):
        wall = b.get("wall_s", 0) - a.get("wall_s", 0)
        if a.get("pid") != b.get("pid") or wall <= 0 or "cpu_busy_s" not in a:
            continue
        values.append(max(0.0, (b["cpu_busy_s"] - a["cpu_busy_s"]) - (b["own_cpu_s"] - a["own_cpu_s"])) / wall)
    return statistics.median(values) if values else None


# ------------------------------------------------------------------------------------------------
# Summary


def _meta(lever: str, argv: list[str]) -> dict[str, Any]:
    def git(*args: str) -> str:
        return vcs.output(store.REPO, *args) or ""

    dirty = git("diff", "--name-only", "HEAD", "--", "mrcnn").split() + git(
        "ls-files", "--others", "--exclude-standard", "mrcnn").split()
    return {
        "lever": lever, "command": "python bench/studies/cpu_levers/levers.py " + " ".join(argv),
        "commit": git("rev-parse", "--short", "HEAD"),
        # Uncommitted library files the run imported (another change in progress), by content hash.
        "uncommitted": {p: hashlib.sha1((REPO / p).read_bytes()).hexdigest()[:10]
                        for p in dirty if (REPO / p).is_file()},
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "cpu": f"{store.cpu_model()} x{os.cpu_count()}", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }  # fmt: skip


def summarize(lever: str, out: Path, meta: dict[str, Any], infos: dict[str, dict]) -> dict[str, Any]:
    """Rows of every workload in ``OUT/LEVER.jsonl`` -> ``OUT/LEVER.json`` and ``.md``."""
    rows = read_lines(out / f"{lever}.jsonl")
    old = json.loads((out / f"{lever}.json").read_text()) if (out / f"{lever}.json").exists() else {}
    summary: dict[str, Any] = {"meta": meta, "workloads": dict(old.get("workloads", {}))}
    for workload in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == workload]
        entry = dict(summary["workloads"].get(workload, {}))
        entry.update(infos.get(workload, {}))
        pairs = entry.get("pairs") or _pairs_of(mine)
        entry["pairs"] = pairs
        entry["ratios"] = {f"{on} / {off}": paired(mine, off, on) for _, off, on in pairs}
        entry["other_cores_median"] = other_cores(mine)
        entry["loadavg_1m_range"] = [min(r["loadavg_1m"] for r in mine), max(r["loadavg_1m"] for r in mine)]
        entry["processes"] = len({r["pid"] for r in mine})
        summary["workloads"][workload] = entry
    (out / f"{lever}.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / f"{lever}.md").write_text(markdown(summary))
    return summary


def _pairs_of(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    names = list(dict.fromkeys(r["variant"] for r in rows))
    offs = [n for n in names if n.endswith((":off", ":mkl"))]
    return [(off.split(":")[0], off, on) for off in offs for on in names
            if on != off and on.split(":")[0] == off.split(":")[0]]  # fmt: skip


def markdown(summary: dict[str, Any]) -> str:
    meta = summary["meta"]
    lines = [
        f"# Lever `{meta['lever']}`: on and off, interleaved round by round in one process",
        "",
        f"Command: `{meta['command']}` (see `bench/studies/cpu_levers/levers.py` for the method). "
        f"Commit {meta['commit']}"
        + (f" plus uncommitted {', '.join(f'`{p}` ({h})' for p, h in meta['uncommitted'].items())}"
           if meta.get("uncommitted") else "")
        + f"; torch {meta['torch']}, {meta['threads']} threads, {meta['cpu']}; {meta['date']}.",
        "",
        "| workload | mode | on / off | 95% interval | rounds | off: median s | on: median s | "
        "other processes (cores) | load avg 1 min |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]  # fmt: skip
    for workload, entry in summary["workloads"].items():
        load = entry.get("loadavg_1m_range", [float("nan")] * 2)
        others = entry.get("other_cores_median")
        for name, r in entry.get("ratios", {}).items():
            if not r.get("rounds"):
                continue
            lines.append(
                f"| {workload} ({entry.get('preset')} {'x'.join(map(str, entry.get('image_size', [])))}) | {name} | "
                f"{r['median_ratio']:.3f} | {r['ci95'][0]:.3f}-{r['ci95'][1]:.3f} | {r['rounds']} | "
                f"{r['median_s_off']:.4f} | {r['median_s_on']:.4f} | "
                f"{'n/a' if others is None else f'{others:.2f}'} | {load[0]:.1f}-{load[1]:.1f} |"
            )
    lines += ["", "Parity of on against off (after warm-up, same input), first calls (compilation included) and "
              "the weights freezing prepacked:", ""]  # fmt: skip
    for workload, entry in summary["workloads"].items():
        lines.append(f"- {workload}: canvas {entry.get('canvas')}; parity {json.dumps(entry.get('parity'))}; "
                     f"first call s {json.dumps({k: round(v, 2) for k, v in entry.get('first_call_s', {}).items()})}"
                     + (f"; packed {json.dumps(entry['weight_packs'])}" if entry.get("weight_packs") else ""))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lever", choices=(*LEVERS, "report"))
    parser.add_argument("name", nargs="?", help="report: the lever whose JSON lines to summarise")
    parser.add_argument("--workloads", default="coco,tiny", help=f"comma list of {', '.join(WORKLOADS)}")
    parser.add_argument("--modes", default="eager,inductor", help="channels_last, layout, buckets: eager, inductor")
    parser.add_argument("--rounds", type=int, default=0, help="0: coco* 20, tiny* 40")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "results" / "levers")
    opts = parser.parse_args(argv)
    torch.set_num_threads(opts.threads)
    opts.out.mkdir(parents=True, exist_ok=True)
    if opts.lever == "report":
        old = json.loads((opts.out / f"{opts.name}.json").read_text())
        print(summarize(opts.name, opts.out, old["meta"], {})["workloads"].keys())
        return
    # Every compile in full: an FX-graph-cache hit would skip the freezing passes' counters.
    torch._inductor.config.fx_graph_cache = False
    meta = _meta(opts.lever, argv)
    infos: dict[str, dict] = {}
    unknown = set(opts.workloads.split(",")) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workload(s) {sorted(unknown)}; choose from {', '.join(WORKLOADS)}")
    for workload in opts.workloads.split(","):
        calls, pairs, info = setup(opts.lever, workload, opts.modes.split(","), opts.warmup)
        infos[workload] = {**info, "pairs": pairs}
        print(f"[{workload}] set up: {json.dumps(info)}", flush=True)
        rounds = opts.rounds or WORKLOADS[workload][2]
        with torch.no_grad():
            run_rounds(calls, rounds, opts.out / f"{opts.lever}.jsonl", prefix=f"{workload}:",
                       extra=lambda workload=workload: {"workload": workload, **_state()})  # fmt: skip
        summary = summarize(opts.lever, opts.out, meta, infos)
        print(json.dumps(summary["workloads"][workload]["ratios"], indent=1), flush=True)
        del calls


if __name__ == "__main__":
    main()
