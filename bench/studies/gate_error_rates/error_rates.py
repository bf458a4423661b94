"""Measure the latency gate's error rates: false alarms on A/A, detections of an injected slowdown.

    python bench/studies/gate_error_rates/error_rates.py --trials 10 --rounds 7,15,25 --out results/latency_gate

Case: the tiny preset with ``synthetic_weights(cfg, seed=0)``, static model, CPU eager, one batch
of textured images (default one 320x448 image, about 0.3 s per call with one thread). Each trial
builds nothing new: it times two model instances, A and B, interleaved in rounds (A B, then B A,
...), after a warm-up, and applies :func:`mrcnn_bench.gates.stats.compare_latency`. In an A/A trial B
has A's settings (a separate instance, as a second install would be); in an A/B trial B has the
harness's slowdown hook (:func:`mrcnn_bench.running.slowdown.inject_slowdown`: extra compute inside the
forward, outputs unchanged). A/A and A/B trials alternate, so load changes during the study hit
both kinds alike.

Each trial times the largest round count asked for; a smaller count N is judged on the trial's
first N rounds, which is exactly what a run of N rounds would have timed. Both rules (paired
Wilcoxon, unpaired Mann-Whitney) are judged on the same timings. Writes ``error_rates.json``
(everything, raw timings included) and ``error_rates.md`` (the tables) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path
from typing import Any

import torch
from scipy import stats

from mrcnn.config import get_config
from mrcnn.model import MaskRCNN
from mrcnn.progress import progress
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, synthetic_weights, textured_images
from mrcnn_bench.base import timing
from mrcnn_bench.gates.stats import RULES, compare_latency, min_p_value
from mrcnn_bench.running.slowdown import inject_slowdown

FALSE_ALARM_GOAL = 0.05  # at most
DETECTION_GOAL = 0.90  # at least


def _size(text: str) -> tuple[int, int]:
    h, _, w = text.partition("x")
    return int(h), int(w)


def _rate(k: int, n: int) -> dict:
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95) if n else None
    return {"count": k, "trials": n, "rate": k / n if n else None,
            "ci95": [ci.low, ci.high] if ci else None}


def run_trial(a: MaskRCNN, b: MaskRCNN, batch, rounds: int, warmup: int, b_first: bool, bar: Any) -> dict:
    """Warm up both, then ``rounds`` interleaved rounds; which goes first alternates every round."""
    for _ in range(warmup):
        a(batch)
        b(batch)
    times: dict[str, list[float]] = {"a": [], "b": []}
    models = {"a": a, "b": b}
    # b_first=True: A first on even rounds, B on odd ones; b_first=False: the other way round.
    for _, order in timing.schedule(("a", "b") if b_first else ("b", "a"), "alternate", rounds):
        for name in order:
            times[name].append(timing.timed(models[name], batch)[0])
        bar.update(1)
    return times


def _fmt_rate(r: dict) -> str:
    return f"{r['count']}/{r['trials']} = {r['rate']:.0%} [{r['ci95'][0]:.0%}, {r['ci95'][1]:.0%}]"


def summarize(trials: list[dict], round_counts: list[int], threshold: float, alpha: float) -> dict:
    """False-alarm and detection rates per rule and round count, and the smallest count meeting both goals."""
    table: dict[str, dict[str, dict]] = {rule: {} for rule in RULES}
    for rule in RULES:
        for n in round_counts:
            if min_p_value(rule, n) >= alpha:
                continue  # this test cannot reach alpha with n rounds
            flags = {"aa": [], "ab": []}
            for t in trials:
                v = compare_latency(t["a"][:n], t["b"][:n], threshold, alpha, rule=rule)
                flags[t["kind"]].append(v.regression)
            table[rule][str(n)] = {"false_alarms": _rate(sum(flags["aa"]), len(flags["aa"])),
                                   "detections": _rate(sum(flags["ab"]), len(flags["ab"]))}
    smallest = {}
    for rule, rows in table.items():
        meets = [int(n) for n, r in rows.items()
                 if r["false_alarms"]["rate"] <= FALSE_ALARM_GOAL and r["detections"]["rate"] >= DETECTION_GOAL]
        smallest[rule] = min(meets) if meets else None
    return {"rates": table, "smallest_rounds_meeting_goals": smallest}


def write_markdown(path: Path, result: dict) -> None:
    s, setup = result["summary"], result["setup"]
    lines = [
        "# Latency gate: measured error rates",
        "",
        f"Case: preset `{setup['preset']}`, synthetic weights (seed 0), static model, CPU eager, "
        f"{setup['images']} image(s) of {setup['size'][0]}x{setup['size'][1]}, {setup['torch_threads']} torch "
        f"thread(s); median call {setup['median_call_s']:.3f} s (A, over all trials). "
        f"{setup['trials_per_kind']} A/A and {setup['trials_per_kind']} A/B trials (B: `inject_slowdown="
        f"{setup['slowdown']}`), alternating; {setup['warmup']} warm-up call(s) each per trial; "
        f"rounds interleaved A B / B A. Rule: `p < {setup['alpha']}` and ratio `> 1 + {setup['threshold']}`.",
        "",
        f"Effective slowdown (A/B trials, {setup['max_rounds']} rounds): median paired ratio "
        f"{result['effective_slowdown']['paired_ratio_median']:.3f} "
        f"(range {result['effective_slowdown']['paired_ratio_min']:.3f} to "
        f"{result['effective_slowdown']['paired_ratio_max']:.3f}), median ratio of medians "
        f"{result['effective_slowdown']['ratio_median']:.3f}.",
        f"A/A ratios (paired, {setup['max_rounds']} rounds): {result['aa_spread']['paired_ratio_min']:.3f} to "
        f"{result['aa_spread']['paired_ratio_max']:.3f}.",
        "",
        f"Load average (1, 5, 15 min) at start {setup['loadavg_start']}, at end {setup['loadavg_end']}; "
        f"wall time {setup['wall_s']:.0f} s; nice {setup['nice']}.",
        "",
        "Rates are counts over trials with 95% Clopper-Pearson intervals. Goals: false alarms "
        f"<= {FALSE_ALARM_GOAL:.0%}, detections >= {DETECTION_GOAL:.0%}.",
        "",
        "| rule | rounds | false alarms (A/A) | detections (A/B, +10%) | meets goals |",
        "|---|---|---|---|---|",
    ]
    for rule, rows in s["rates"].items():
        for n, r in rows.items():
            ok = r["false_alarms"]["rate"] <= FALSE_ALARM_GOAL and r["detections"]["rate"] >= DETECTION_GOAL
            lines.append(f"| {rule} | {n} | {_fmt_rate(r['false_alarms'])} | {_fmt_rate(r['detections'])} | "
                         f"{'yes' if ok else 'no'} |")
    lines += ["", "Smallest round count meeting both goals: "
              + ", ".join(f"{rule}: {n if n is not None else 'none tried'}"
                          for rule, n in s["smallest_rounds_meeting_goals"].items()), "",
              f"## Trials at {setup['max_rounds']} rounds", "",
              "| # | kind | median A (s) | median B (s) | ratio | paired ratio | p Wilcoxon | p Mann-Whitney "
              "| paired flags | unpaired flags | load (1 min) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, t in enumerate(result["trials"]):
        v = t["verdict"]
        lines.append(
            f"| {i} | {t['kind'].upper()} | {v['median_a']:.4f} | {v['median_b']:.4f} | {v['ratio']:.3f} | "
            f"{v['paired_ratio']:.3f} | {v['p_wilcoxon']:.2g} | {v['p_mannwhitney']:.2g} | "
            f"{v['regression_paired']} | {v['regression_unpaired']} | {t['loadavg'][0]:.2f} |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10, help="trials of each kind, A/A and A/B (default 10)")
    parser.add_argument("--rounds", default="7,15,25", help="round counts to judge, comma-separated (default 7,15,25)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls of each model per trial (default 2)")
    parser.add_argument("--slowdown", type=float, default=0.10, help="inject_slowdown fraction of B in A/B trials")
    parser.add_argument("--size", type=_size, default=(320, 448), help="image HxW (default 320x448)")
    parser.add_argument("--images", type=int, default=1, help="images per call (default 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--threshold", type=float, default=0.05)
    parser.add_argument("--alpha", type=float, default=0.01)
    parser.add_argument("--out", type=Path, default=Path("results/latency_gate"))
    args = parser.parse_args(argv)
    round_counts = sorted({int(x) for x in args.rounds.split(",")})
    if args.trials < 1 or not round_counts or round_counts[0] < 1:
        parser.error("--trials and --rounds must be positive")
    max_rounds = round_counts[-1]

    torch.set_num_threads(args.threads)
    cfg = get_config("tiny")
    weights = synthetic_weights(cfg, seed=0)

    def build() -> MaskRCNN:
        return load_torchvision_weights(MaskRCNN(cfg).eval(), weights)

    a, a2, slow = build(), build(), build()
    inject_slowdown(slow, args.slowdown)
    batch = to_image_batch(textured_images((args.size,) * args.images, seed=1), cfg)

    load_start = os.getloadavg()
    wall, trials = timing.timed(run_trials, a, a2, slow, batch, args, max_rounds)
    setup = {
        "preset": cfg.name, "size": list(args.size), "images": args.images,
        "torch_threads": torch.get_num_threads(),
        "trials_per_kind": args.trials, "round_counts": round_counts, "max_rounds": max_rounds,
        "warmup": args.warmup, "slowdown": args.slowdown, "threshold": args.threshold, "alpha": args.alpha,
        "median_call_s": statistics.median(x for t in trials for x in t["a"]),
        "loadavg_start": [round(x, 2) for x in load_start], "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "nice": os.nice(0), "cpu_count": os.cpu_count(), "wall_s": wall, "torch": torch.__version__,
        "python": platform.python_version(), "machine": platform.machine(),
    }
    result = {"setup": setup, **spread(trials),
              "summary": summarize(trials, round_counts, args.threshold, args.alpha), "trials": trials}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "error_rates.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    write_markdown(args.out / "error_rates.md", result)
    print((args.out / "error_rates.md").read_text(encoding="utf-8"))


def run_trials(a: MaskRCNN, a2: MaskRCNN, slow: MaskRCNN, batch, args: argparse.Namespace,
               max_rounds: int) -> list[dict]:
    """A/A and A/B trials, alternating; each with its timings, load and verdict at ``max_rounds``."""
    trials = []
    total = 2 * args.trials * max_rounds
    with torch.inference_mode(), progress(total=total, desc="rounds", unit="round") as bar:
        for i in range(2 * args.trials):
            kind = "aa" if i % 2 == 0 else "ab"
            times = run_trial(a, a2 if kind == "aa" else slow, batch, max_rounds, args.warmup,
                              b_first=(i // 2) % 2 == 1, bar=bar)
            v = compare_latency(times["a"], times["b"], args.threshold, args.alpha)
            verdict = {k: getattr(v, k) for k in ("median_a", "median_b", "ratio", "paired_ratio", "ci_low",
                                                  "ci_high", "p_wilcoxon", "p_mannwhitney")}
            verdict.update({f"regression_{rule}": v.regression_by(rule) for rule in RULES})
            trials.append({"kind": kind, "loadavg": os.getloadavg(), **times, "verdict": verdict})
            bar.set_postfix(kind=kind, ratio=f"{v.paired_ratio:.3f}")
    return trials


def spread(trials: list[dict]) -> dict:
    """The slowdown the A/B trials measured, and how far A/A trials strayed from 1."""
    ab = [t["verdict"] for t in trials if t["kind"] == "ab"]
    aa = [t["verdict"] for t in trials if t["kind"] == "aa"]
    return {
        "effective_slowdown": {
            "paired_ratio_median": statistics.median(v["paired_ratio"] for v in ab),
            "paired_ratio_min": min(v["paired_ratio"] for v in ab),
            "paired_ratio_max": max(v["paired_ratio"] for v in ab),
            "ratio_median": statistics.median(v["ratio"] for v in ab),
        },
        "aa_spread": {"paired_ratio_min": min(v["paired_ratio"] for v in aa),
                      "paired_ratio_max": max(v["paired_ratio"] for v in aa)},
    }


if __name__ == "__main__":
    main()
