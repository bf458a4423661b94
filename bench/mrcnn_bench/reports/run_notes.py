"""The lines under a run's table: the machine's ceiling, FLOPs, load, workload and environment.

:func:`notes` writes them; :func:`other_load` reads the load from other processes out of the
machine's state per round; :func:`images_text` and :func:`workload_kind` say what a run timed.
"""

from __future__ import annotations

import itertools
import math
import statistics

from mrcnn_bench.gates.goals import speed_goals
from mrcnn_bench.running.records import RunDocument, RunInfo, as_number


def other_load(states: list[dict[str, float]]) -> dict[str, float]:
    """From consecutive :func:`mrcnn_bench.running.probes.machine_state` readings: the median over the
    intervals of the cores other processes kept busy, and of the cores the hypervisor took (steal); {} without the
    counters."""
    others, steals = [], []
    for a, b in itertools.pairwise(states):
        wall = b.get("wall_s", 0) - a.get("wall_s", 0)
        if wall <= 0 or not all(k in a and k in b for k in ("cpu_busy_s", "own_cpu_s", "steal_s")):
            continue
        others.append(max(0.0, (b["cpu_busy_s"] - a["cpu_busy_s"]) - (b["own_cpu_s"] - a["own_cpu_s"])) / wall)
        steals.append((b["steal_s"] - a["steal_s"]) / wall)
    if not others:
        return {}
    return {"other_cores": statistics.median(others), "steal_cores": statistics.median(steals),
            "intervals": float(len(others))}


def notes(doc: RunDocument) -> list[str]:
    """The lines under the table: peaks, FLOPs, load, workload, environment."""
    run, env = doc.run, doc.environment
    out = []
    c = run.ceiling
    if c.get("unreliable"):
        out.append(f"frac_peak not shown: this run's kernel rates contradict the machine's ceiling. {c['unreliable']}.")
    elif c and c.get("fma_units"):
        out.append(f"frac_peak: GFLOP/s over this machine's ceiling, {c['fp32_gflops']:.0f} GFLOP/s fp32 and "
                   f"{c['bf16_gflops']:.0f} bf16 = {c['cores']} cores x {c['fma_units']} FMA units x "
                   f"{c['lanes']} fp32 lanes x 2 x {c['clock_ghz']:.2f} GHz (clock and units measured by "
                   f"{c['source']}).")
    elif c:
        out.append(f"frac_peak: GFLOP/s over {c['fp32_gflops']:.0f} fp32 / {c['bf16_gflops']:.0f} bf16 GFLOP/s "
                   f"({c['source']}).")
    if run.peaks:
        out.append("Kernel rates (GFLOP/s, best of start and end of run): "
                   + ", ".join(f"{k} {v:.0f}" for k, v in run.peaks.items())
                   + ("." if c else ". frac_peak: of the fp32 peak for fp32 rows, of the bf16 peak for bf16 rows."))
    flops = {r.case: r.flops for r in doc.records if not math.isnan(as_number(r.flops))}
    if flops:
        out.append("FLOPs per call (FlopCounterMode, eager CPU; NMS/RoIAlign not counted): "
                   + ", ".join(f"{k} {v / 1e9:.1f} G" for k, v in flops.items()))
    if any(speed_goals(r.case, r.preset, r.image_size, run.overrides) for r in doc.records):
        out.append("target: this project's speed goals for the row in this workload "
                   "(bench/mrcnn_bench/gates/goals.py), each a multiple of another row's median "
                   "(`<= 0.7x tv`: at most 0.7 times torchvision eager's "
                   "latency per call; training: at least that many times torchvision's training throughput), "
                   "and whether this run met it, decided by the 95% interval of the per-round ratio to that row; "
                   "a goal set against a torchvision row also needs parity with its detections to count as met. "
                   "'needs 0.9 of the ceiling': the fraction of the ceiling the row would run at, on torchvision's "
                   "FLOPs (the useful column), if it took exactly the goal's time; near 1, no schedule of that "
                   "work meets the goal on this machine.")
    evaluated = [r for r in doc.records if r.eval_images]
    if evaluated:
        out.append(f"box_ap, mask_ap: COCO AP (pycocotools) on {evaluated[0].eval_images} images of the "
                   f"evaluation set, with this run's weights.")
    machine = run.machine_per_round
    if machine:
        load = sorted(m["loadavg_1m"] for m in machine)[len(machine) // 2]
        text = f"Median 1-min load average during the rounds: {load:.1f} on {env['affinity']} usable cores"
        other = other_load(machine)
        if other:
            text += (f" (it counts the run's own threads); other processes kept {other['other_cores']:.2f} cores "
                     f"busy and the hypervisor took {other['steal_cores']:.2f} (medians over "
                     f"{other['intervals']:.0f} rounds)")
        out.append(text + (f"; CPUs {env['cpus']}, governor {env.get('governor') or 'not shown'}." if "cpus" in env
                           else "."))
    w, options = run.workload, run.options
    preset = w.preset + "".join(f", {k}={v}" for k, v in (options.get("overrides") or {}).items())
    if run.interrupted:
        done = max((len(r.times_s) for r in doc.records), default=0)
        out.append(f"INTERRUPTED by {run.interrupted} after {done} of {options['rounds']} rounds: the figures "
                   f"rest on the rounds that finished (`mrcnn-bench run ... --resume` times the rest).")
    if run.resumed_from_round:
        out.append(f"Resumed: rounds 1-{run.resumed_from_round} come from the interrupted run's journal; every "
                   f"row was set up and warmed up again before round {run.resumed_from_round + 1}.")
    out.append(
        f"Workload: preset {preset}, images: {images_text(run)}, {w.batch_size} per inference call; weights "
        f"{run.weights}; rounds {options['rounds']} (warm-up: once over every distinct image before round 1, at "
        f"least {options['warmup']} call(s)); time limit of bounded rows {run.limit_s:g} s; "
        f"whole run {run.total_s:.0f} s."
    )
    out.append(
        f"Environment: torch {env['torch']}, torchvision {env['torchvision']}, torch_xla {env['torch_xla']}, "
        f"CPU {env['cpu']}, GPU {env['gpu']}, threads {env['threads']}, seed {env['seed']}, "
        f"commit {env['commit']}{' (dirty)' if env.get('dirty') else ''}, {env['date']}."
    )
    return out


def images_text(run: RunInfo) -> str:
    """What the run's images were: a stream of sizes, one fixed size, or a COCO-layout split's own."""
    w, options = run.workload, run.options
    if options.get("coco_root"):
        return (f"the first {w.images} of {options['coco_root']} ({options.get('coco_split', 'val2017')}) at "
                f"their own sizes")
    h, wd = w.image_size
    if w.sizes:
        return (f"a {w.sizes_label}, one image of the synthetic data set (mrcnn.data.synthetic: 0 to 28 shaped "
                f"objects) resized to each, in this order; training steps at {h}x{wd}")
    return f"{w.sizes_label}, {w.images} generated textured image(s)"


def workload_kind(run: RunInfo) -> str:
    """``stream of 8 sizes``, ``fixed 240x320``, or ``own sizes of ROOT (SPLIT)`` for a COCO-layout root's images."""
    root = run.options.get("coco_root")
    return f"own sizes of {root} ({run.options.get('coco_split', 'val2017')})" if root else run.workload.kind
