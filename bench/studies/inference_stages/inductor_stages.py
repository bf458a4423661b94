"""Where the static model's time goes, stage by stage, eager and under inductor, against the ceiling.

    python bench/studies/inference_stages/inductor_stages.py [--preset coco_r50_fpn] [--rounds 10]
        [--out results/levers]

``run --profile`` times stages with module hooks, which only eager execution allows. Here the
static model is cut where its own API cuts it, so each piece can be compiled on its own:
``features`` (ResNet body + FPN with the padding masks), ``box_stage`` (features, RPN, box head and
detection: everything before the mask branch), ``mask_stage`` (RoIAlign, mask head and predictor on
the K slots) and the whole ``forward``. Each is timed eager and under inductor
(``torch.compile(fullgraph=True, dynamic=False)``), all eight interleaved round by round in one
process (:func:`studies.onoff.run_rounds`: the order reversed every other round, each call
appended to ``OUT/stages_PRESET.jsonl``, so an interrupted run resumes).

Workload: one textured image (480x640 for ``coco_r50_fpn``, 240x320 for ``tiny``) with
``synthetic_weights(cfg, seed=0)`` (every detection slot valid); the host's resize, padding and
mask pasting are outside every timed call. A derived stage's seconds are the median over rounds of
its per-round difference (RPN + box head = box_stage - features; the rest = forward - box_stage -
mask_stage). Its FLOPs (``FlopCounterMode`` on the eager piece, 2 per multiply-add; RoIAlign and
NMS count none) over its seconds give GFLOP/s, as a fraction of the fp32 ceiling measured at the
start (:func:`mrcnn_bench.running.ceiling.measure`). Writes ``OUT/stages_PRESET.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the studies' shared modules (studies.*)

import torch
from studies.onoff import run_rounds, seconds_by_round

from mrcnn.config import get_config
from mrcnn.model import MaskRCNN
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, synthetic_weights, textured_images
from mrcnn_bench.base import timing, vcs
from mrcnn_bench.running import ceiling, store
from mrcnn_bench.running.journal import read_lines
from mrcnn_bench.running.probes import count_flops

IMAGE = {"coco_r50_fpn": (480, 640), "tiny": (240, 320)}
PIECES = ("features", "box_stage", "mask_stage", "forward")
# stage label -> (pieces added, pieces subtracted), per round
STAGES = {
    "backbone: ResNet body + FPN": (("features",), ()),
    "RPN + box head + detection": (("box_stage",), ("features",)),
    "mask branch: RoIAlign, mask head, predictor (K slots)": (("mask_stage",), ()),
    "rest of forward (the two stages' seams)": (("forward",), ("box_stage", "mask_stage")),
    "forward, whole": (("forward",), ()),
}


def pieces(preset: str) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    """The eager pieces of the static model on the workload's batch, and what the run used."""
    cfg = get_config(preset)
    model = load_torchvision_weights(MaskRCNN(cfg).eval(), synthetic_weights(cfg, seed=0))
    batch = to_image_batch(textured_images((IMAGE[preset],), seed=0), cfg)
    with torch.no_grad():
        det, pooled = model.box_stage(batch)
    calls = {
        "features": lambda: model.features(batch),
        "box_stage": lambda: model.box_stage(batch),
        "mask_stage": lambda: model.mask_stage(pooled, det),
        "forward": lambda: model(batch),
    }
    info = {"canvas": list(batch.tensors.shape[-2:]), "valid_detections": int(det.valid.sum()),
            "slots": int(det.valid.shape[1])}
    return calls, info


def setup(preset: str) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    """Eager and inductor variants of every piece, each called once (its first call timed apart)."""
    eager, info = pieces(preset)
    with torch.no_grad():
        info["gflop"] = {name: count_flops(fn) / 1e9 for name, fn in eager.items()}
    variants = {f"eager:{name}": fn for name, fn in eager.items()}
    variants |= {f"inductor:{name}": torch.compile(fn, fullgraph=True, dynamic=False) for name, fn in eager.items()}
    info["first_call_s"] = {}
    with torch.no_grad():
        for name, fn in variants.items():
            info["first_call_s"][name], _ = timing.timed(fn)
            print(f"first call {name}: {info['first_call_s'][name]:.1f} s", flush=True)
    return variants, info


Rows = list[dict[str, Any]]


def stage_seconds(rows: Rows, mode: str, plus: tuple[str, ...], minus: tuple[str, ...]) -> tuple[float, int]:
    """(median over the rounds every piece ran of the stage's per-round seconds, those rounds)."""
    by = {p: seconds_by_round(rows, f"{mode}:{p}") for p in (*plus, *minus)}
    rounds = set.intersection(*(set(v) for v in by.values()))
    values = [sum(by[p][r] for p in plus) - sum(by[p][r] for p in minus) for r in rounds]
    return (statistics.median(values) if values else float("nan")), len(values)


def summarize(rows: Rows, info: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per stage: eager and inductor seconds, GFLOP, and the fraction of the fp32 ceiling."""
    limit = info["ceiling"]["fp32_gflops"]
    out = []
    for label, (plus, minus) in STAGES.items():
        gflop = sum(info["gflop"][p] for p in plus) - sum(info["gflop"][p] for p in minus)
        row: dict[str, Any] = {"stage": label, "gflop": gflop}
        for mode in ("eager", "inductor"):
            seconds, rounds = stage_seconds(rows, mode, plus, minus)
            row |= {f"{mode}_s": seconds, f"{mode}_frac_ceiling": gflop / seconds / limit if seconds > 0 else None,
                    "rounds": rounds}
        row["inductor_over_eager"] = row["inductor_s"] / row["eager_s"] if row["gflop"] > 0 else None  # not for a seam
        out.append(row)
    whole = out[-1]["inductor_s"]
    for row in out:
        row["inductor_share"] = row["inductor_s"] / whole
    return out


def markdown(table: Rows, meta: dict[str, Any]) -> str:
    lines = [
        f"# Static model stage by stage, eager and inductor ({meta['preset']})", "",
        f"Command: `{meta['command']}` (method: `bench/studies/inference_stages/inductor_stages.py`). "
        f"Commit {meta['commit']}; torch "
        f"{meta['torch']}, {meta['threads']} threads, {meta['cpu']}; {meta['date']}. Canvas {meta['canvas']}, "
        f"{meta['valid_detections']} of {meta['slots']} detection slots valid. Ceiling "
        f"{meta['ceiling']['fp32_gflops']:.0f} GFLOP/s fp32 ({meta['ceiling']['source']}). Median of "
        f"{table[-1]['rounds']} interleaved rounds.", "",
        "| stage | GFLOP | eager s | eager frac of ceiling | inductor s | inductor frac of ceiling | inductor / eager "
        "| share of inductor forward |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]  # fmt: skip
    for r in table:
        frac = {m: "n/a" if r[f"{m}_frac_ceiling"] is None else f"{r[f'{m}_frac_ceiling']:.2f}"
                for m in ("eager", "inductor")}
        lines.append(f"| {r['stage']} | {r['gflop']:.1f} | {r['eager_s']:.3f} | {frac['eager']} | "
                     f"{r['inductor_s']:.3f} | {frac['inductor']} | "
                     f"{'n/a' if r['inductor_over_eager'] is None else format(r['inductor_over_eager'], '.2f')} | "
                     f"{r['inductor_share']:.2f} |")
    lines += ["", "First calls (compilation included), s: "
              + ", ".join(f"{k} {v:.1f}" for k, v in meta["first_call_s"].items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(IMAGE), default="coco_r50_fpn")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/levers"))
    opts = parser.parse_args(argv)
    torch.set_num_threads(opts.threads)
    opts.out.mkdir(parents=True, exist_ok=True)
    journal = opts.out / f"stages_{opts.preset}.jsonl"
    meta: dict[str, Any] = {
        "preset": opts.preset, "command": "python bench/studies/inference_stages/inductor_stages.py " + " ".join(argv),
        "commit": vcs.output(store.REPO, "rev-parse", "--short", "HEAD"), "torch": torch.__version__,
        "threads": torch.get_num_threads(), "cpu": store.cpu_model(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "ceiling": dataclasses.asdict(ceiling.measure()),
    }  # fmt: skip
    variants, info = setup(opts.preset)
    meta |= info
    with torch.no_grad():
        run_rounds(variants, opts.rounds, journal)
    table = summarize(read_lines(journal), meta)
    (opts.out / f"stages_{opts.preset}.json").write_text(json.dumps({"meta": meta, "stages": table}, indent=1))
    (opts.out / f"stages_{opts.preset}.md").write_text(markdown(table, meta))
    print(markdown(table, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
