"""How many process pairs, and how many rounds each, does a live compare need? Sized on measured noise.

    PYTHONPATH=bench python bench/studies/compare_pairs/design.py [--compare A_A.json ...]
        [--out results/compare_pairs/design.md]

The noise model: a pair's mean log ratio ``d`` varies by ``process_sd`` (the two processes' levels)
plus ``round_sd / sqrt(R)`` (its R rounds). It is read from two sources, each named in the output:

- ``results/latency_gate_live/trials.jsonl``: 72 A/A live compares of one pair of 30 rounds each
  (static/eager, tiny); ``process_sd`` from the spread of the trials' means beyond their rounds'.
- ``--compare``: outputs (``--out``) of A/A ``mrcnn-bench compare`` runs in process pairs on the
  host at hand; the spread of the pairs' ``d`` within each start order, beyond their rounds'. The
  seconds each pair took give the cost model (a pair's fixed cost, and the seconds of a round).

For each noise model, the (K pairs, R rounds) that meet the goals at the least cost: a 3% slowdown
found with power 0.8 and 5% with 0.95, by the one-sided t-test across pairs (K - 2 degrees of freedom,
as :func:`mrcnn_bench.gates.stats.compare_pairs` has with both start orders) against the default
threshold at the default alpha; power from the noncentral t distribution
(:func:`mrcnn_bench.gates.stats.pair_power`). The A/A false-alarm rate
of that test is at most alpha by construction, below it for a threshold above 0.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/

from mrcnn_bench.base import defaults
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.gates.stats import pair_power

REPO = Path(__file__).resolve().parents[3]
TRIALS = REPO / "results/latency_gate_live/trials.jsonl"
GOALS = ((0.03, 0.80), (0.05, 0.95))  # (slowdown, power)


@dataclass(frozen=True)
class Noise:
    source: str
    process_sd: float
    round_sd: float
    samples: str  # what the figures rest on


@dataclass(frozen=True)
class Cost:
    pair_s: float  # fixed seconds per pair: two processes' set-up and warm-up
    round_s: float  # seconds of one round (one call of each side)
    source: str


def noise_from_trials(path: Path) -> Noise:
    """One pair per trial: sd of the trials' mean log ratios beyond their rounds' share."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    aa = [r for r in rows if r["kind"] == "aa"]
    logs = [np.log(np.array(r["b_s"]) / np.array(r["a_s"])) for r in aa]
    round_var = statistics.fmean(float(x.var(ddof=1)) for x in logs)
    n = statistics.fmean(x.size for x in logs)
    d_var = float(np.var([x.mean() for x in logs], ddof=1))
    return Noise(f"{path.relative_to(REPO)}", math.sqrt(max(d_var - round_var / n, 0.0)), math.sqrt(round_var),
                 f"{len(aa)} A/A pairs of {n:.0f} rounds")


def noise_and_cost_from_compares(paths: list[Path]) -> tuple[Noise, Cost]:
    """Pooled over A/A compare outputs: the spread of ``d`` within each start order, and the pairs' seconds."""
    groups: list[list[float]] = []
    round_vars, rounds, seconds, round_s = [], [], [], []
    for path in paths:
        data = json.loads(path.read_text())
        by_order: dict[bool, list[float]] = {True: [], False: []}
        for pair in data["pairs"]:
            rows = pair["rows"]
            a = next(np.array(v["times_s"]) for k, v in rows.items() if k.startswith("A:"))
            b = next(np.array(v["times_s"]) for k, v in rows.items() if k.startswith("B:"))
            x = np.log(b / a)
            by_order[pair["a_first"]].append(float(x.mean()))
            round_vars.append(float(x.var(ddof=1)))
            rounds.append(x.size)
            seconds.append(pair["seconds"])
            round_s.append(float(np.median(a) + np.median(b)))
        groups += [g for g in by_order.values() if len(g) >= 2]
    df = sum(len(g) - 1 for g in groups)
    d_var = sum(sum((v - statistics.fmean(g)) ** 2 for v in g) for g in groups) / df
    round_var, n = statistics.fmean(round_vars), statistics.fmean(rounds)
    names = ", ".join(str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p) for p in paths)
    noise = Noise(names, math.sqrt(max(d_var - round_var / n, 0.0)), math.sqrt(round_var),
                  f"{len(rounds)} A/A pairs of {n:.0f} rounds in {len(paths)} compare(s)")
    per_round = statistics.median(round_s)
    fixed = statistics.median(s - r * per_round for s, r in zip(seconds, rounds, strict=True))
    return noise, Cost(fixed, per_round, f"median over the {len(seconds)} pairs of {names}")


def power(noise: Noise, pairs: int, rounds: int, slowdown: float, threshold: float, alpha: float) -> float:
    return pair_power(noise.process_sd, noise.round_sd, pairs, rounds, slowdown, threshold, alpha)


def cheapest(noises: list[Noise], cost: Cost, threshold: float, alpha: float) -> tuple[int, int] | None:
    """The (pairs, rounds) meeting :data:`GOALS` under every noise model at the least seconds; None
    if none does up to 200 pairs."""
    best: tuple[float, int, int] | None = None
    for rounds in range(2, 101, 2):
        for pairs in range(4, 201):
            if all(power(n, pairs, rounds, s, threshold, alpha) >= p for s, p in GOALS for n in noises):
                seconds = pairs * (cost.pair_s + rounds * cost.round_s)
                if best is None or seconds < best[0]:
                    best = (seconds, pairs, rounds)
                break
    return None if best is None else (best[1], best[2])


def report(noises: list[Noise], cost: Cost, threshold: float, alpha: float, command: str) -> str:
    k0, r0 = defaults.COMPARE_PAIRS, defaults.COMPARE_ROUNDS
    lines = [
        "# Live compare in process pairs: the noise model and the pairs and rounds it asks for",
        "",
        f"`{command}`",
        "",
        f"Goals: a slowdown of 3% found with power 0.8 and 5% with 0.95, by the one-sided t-test across pairs "
        f"against a threshold of {threshold:.0%} at alpha {alpha} (A/A false alarms at most alpha by construction). "
        f"Cost model: {cost.pair_s:.1f} s per pair of processes (set-up, warm-up) plus {cost.round_s:.2f} s per "
        f"round ({cost.source}). Power from the noncentral t with K - 2 degrees of freedom.",
        "",
        "| noise model from | rests on | process sd | round sd | cheapest K x R | its minutes | "
        f"power 3% / 5% at the default {k0} x {r0} | minutes at the default |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for noise in noises:
        best = cheapest([noise], cost, threshold, alpha)
        shown = (f"{best[0]} x {best[1]}", f"{best[0] * (cost.pair_s + best[1] * cost.round_s) / 60:.1f}") if best \
            else ("none up to 200 pairs", "")
        at_default = " / ".join(f"{power(noise, k0, r0, s, threshold, alpha):.2f}" for s, _ in GOALS)
        lines.append(f"| {noise.source} | {noise.samples} | {noise.process_sd:.4f} | {noise.round_sd:.4f} | "
                     f"{shown[0]} | {shown[1]} | {at_default} | {k0 * (cost.pair_s + r0 * cost.round_s) / 60:.1f} |")
    both = cheapest(noises, cost, threshold, alpha)
    lines += ["", "Cheapest meeting the goals under every noise model above: "
              + (f"{both[0]} pairs x {both[1]} rounds, {both[0] * (cost.pair_s + both[1] * cost.round_s) / 60:.1f} "
                 "minutes" if both else "none up to 200 pairs")
              + f"; the defaults (`mrcnn_bench.base.defaults`): {k0} pairs x {r0} rounds."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", type=Path, action="append", default=[],
                        help="an A/A compare's --out file, in process pairs (repeatable)")
    parser.add_argument("--out", type=Path, default=REPO / "results/compare_pairs/design.md")
    args = parser.parse_args()
    noises = [noise_from_trials(TRIALS)]
    if not args.compare:
        print("design.py: give at least one --compare file: the cost model comes from its pairs", file=sys.stderr)
        return 2
    noise, cost = noise_and_cost_from_compares([p.resolve() for p in args.compare])
    noises.append(noise)
    command = "PYTHONPATH=bench python bench/studies/compare_pairs/design.py " + " ".join(
        f"--compare {p.resolve().relative_to(REPO) if p.resolve().is_relative_to(REPO) else p}" for p in args.compare)
    text = report(noises, cost, defaults.PAIR_THRESHOLD, defaults.ALPHA, command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
