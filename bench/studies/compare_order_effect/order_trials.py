"""Does a live compare favour a row for its position? A/A trials with the rows' order swapped.

The logic of ``bench/studies/compare_order_effect/order_effect.py`` (its docstring says the method):
:func:`trial` is one A/A run of the compare's case built with :func:`mrcnn_bench.running.runner.run`, the rows
listed A, B or B, A; :func:`run` appends trials to ``OUT/order_effect.jsonl``, alternating the order;
:func:`summary` writes ``OUT/order_effect.md``, per order the ratio B/A with its 95% t-interval and
the ratio over the rounds in which A, or B, ran first.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from mrcnn_bench.base import defaults
from mrcnn_bench.gates.stats import mean_ratio_ci
from mrcnn_bench.running import runner
from mrcnn_bench.running.cases import Row, Variant, default_time_limit, default_workload, parse_cases
from mrcnn_bench.running.journal import read_lines

ROUNDS = 30


def trial(swap: bool) -> dict:
    """One A/A run; ``swap``: the rows listed (and so set up and ordered) B first."""
    (case,) = parse_cases(defaults.COMPARE_CASES)
    a, b = Row(case, Variant("A", ".")), Row(case, Variant("B", "."))
    opts = runner.RunOptions(workload=default_workload("tiny"), rows=[b, a] if swap else [a, b], rounds=ROUNDS,
                             time_limit=default_time_limit("tiny"), progress=False, peak_reps=0, flops=False)
    times = {r.row.variant.label: np.asarray(r.times) for r in runner.run(opts).rows}
    log_ratio = np.log(times["B"] / times["A"])
    first_is_a = log_ratio[1::2] if swap else log_ratio[0::2]  # round r runs the list rotated by r
    first_is_b = log_ratio[0::2] if swap else log_ratio[1::2]
    return {"swap": swap, "log_b_over_a": float(log_ratio.mean()), "a_first": float(first_is_a.mean()),
            "b_first": float(first_is_b.mean())}


def summary(out: Path) -> int:
    trials = read_lines(out / "order_effect.jsonl")
    if not any(sum(t["swap"] == swap for t in trials) >= 2 for swap in (False, True)):
        print(f"fewer than 2 trials of either order in {out / 'order_effect.jsonl'}: nothing to summarise",
              file=sys.stderr)
        return 2
    lines = ["# Live A/A with the rows' order swapped (bench/studies/compare_order_effect/order_effect.py)", "",
             f"{defaults.COMPARE_CASES}, tiny preset, {ROUNDS} rounds per trial. Ratio B/A: the mean over trials of "
             "each trial's mean log ratio, with its 95% t-interval; then over the rounds in which A, or B, ran first.",
             "", "| rows listed | trials | ratio B/A | 95% CI | A first | B first |",
             "| --- | --- | --- | --- | --- | --- |"]
    for swap in (False, True):
        mine = [t for t in trials if t["swap"] == swap]
        if len(mine) < 2:
            continue
        ratio, low, high = mean_ratio_ci([t["log_b_over_a"] for t in mine])
        lines.append(f"| {'B, A' if swap else 'A, B'} | {len(mine)} | {ratio:.4f} | {low:.4f} to "
                     f"{high:.4f} | {np.exp(np.mean([t['a_first'] for t in mine])):.4f} "
                     f"| {np.exp(np.mean([t['b_first'] for t in mine])):.4f} |")
    (out / "order_effect.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def run(out: Path, trials: int) -> None:
    """Append A/A trials to ``OUT/order_effect.jsonl`` until it holds ``trials``, alternating the order."""
    path = out / "order_effect.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    for i in range(len(read_lines(path)), trials):
        with path.open("a") as f:
            f.write(json.dumps(trial(swap=i % 2 == 1)) + "\n")
