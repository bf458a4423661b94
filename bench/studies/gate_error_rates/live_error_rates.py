"""The latency gate's error rates, measured live through the gate's own code path, resumably.

The logic of ``bench/studies/gate_error_rates/gate_error_rates.py`` (its docstring says the method):
:func:`trial` is one live ``compare`` of this tree against itself as ``mrcnn-bench gate
--latency-against`` runs it (:func:`mrcnn_bench.gates.ab.run_live`), B slowed by :data:`KINDS`; :func:`run`
appends trials to ``OUT/trials.jsonl`` until :data:`TARGETS` are reached, the kind furthest behind
first (:func:`next_kind`); :func:`summary` writes ``OUT/error_rates.md`` from the raw per-round
times: per round count (each trial judged on its first N rounds), the false-alarm and detection
rates with two-sided 95% Clopper-Pearson intervals (:class:`Rate`), the fewest rounds meeting
:data:`GOALS`, and what B really measured as (:func:`measured_ratios`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from mrcnn.progress import progress
from mrcnn_bench.base import defaults, timing
from mrcnn_bench.gates import ab
from mrcnn_bench.gates.stats import compare_latency, mean_ratio_ci
from mrcnn_bench.running import runner
from mrcnn_bench.running.cases import default_time_limit, default_workload, parse_cases
from mrcnn_bench.running.journal import read_lines

ROUNDS = 30  # each trial; smaller counts are judged on its first rounds
ROUND_COUNTS = (7, 10, 15, 20, 25, 30)
KINDS = {"aa": 0.0, "slow10": 0.10, "slow05": 0.05}  # trial kind -> slowdown injected into B
TARGETS = {"aa": 72, "slow10": 30, "slow05": 30}
# What a default round count must show: false alarms at most 5%, proved (the interval's upper bound;
# what TARGETS["aa"] trials can prove), and a 10% slowdown caught 90% of the time (the point estimate:
# proving it would take far more than 30 trials per kind, so the rate is reported with its interval).
GOALS = {"aa": 0.05, "slow10": 0.90}


def next_kind(done: dict[str, int]) -> str | None:
    """The kind furthest behind its target, or None when every target is reached."""
    behind = {k: done.get(k, 0) / n for k, n in TARGETS.items() if done.get(k, 0) < n}
    return min(behind, key=lambda k: (behind[k], k)) if behind else None


def trial(kind: str) -> dict[str, Any]:
    """One live compare of this tree against itself, B slowed by ``KINDS[kind]``; its raw times."""
    opts = ab.CompareOptions(".", ".", cases=parse_cases(defaults.COMPARE_CASES), slowdown_b=KINDS[kind])
    opts.run = runner.RunOptions(workload=default_workload("tiny"), rows=[], rounds=ROUNDS,
                                 time_limit=default_time_limit("tiny"), progress=False, peak_reps=0, flops=False)
    t0, wall = time.time(), timing.Stopwatch()
    load = os.getloadavg()[0]
    recs_a, recs_b, _ = ab.run_live(opts)
    (a,), (b,) = recs_a, recs_b
    if len(a.times_s) != ROUNDS or len(b.times_s) != ROUNDS:
        raise RuntimeError(f"{kind}: a row did not finish its rounds ({a.status}: {a.detail}; {b.status}: {b.detail})")
    return {"kind": kind, "slowdown": KINDS[kind], "a_s": a.times_s, "b_s": b.times_s, "started": t0,
            "seconds": wall.elapsed(), "loadavg_before": load, "loadavg_after": os.getloadavg()[0]}


def run(out: Path, hours: float, show: bool) -> int:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "trials.jsonl"
    done: dict[str, int] = {}
    for t in read_lines(path):
        done[t["kind"]] = done.get(t["kind"], 0) + 1
    total, deadline = sum(TARGETS.values()), time.monotonic() + hours * 3600
    bar = progress(total=total, initial=sum(min(done.get(k, 0), n) for k, n in TARGETS.items()), desc="trials",
                   unit="trial", enabled=show)
    while (kind := next_kind(done)) is not None and time.monotonic() < deadline:
        record = trial(kind)
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        done[kind] = done.get(kind, 0) + 1
        bar.update(1)
    bar.close()
    left = {k: n - done.get(k, 0) for k, n in TARGETS.items() if done.get(k, 0) < n}
    print(f"trials: {done}; still to run: {left or 'none'}")
    return 0


@dataclasses.dataclass(frozen=True)
class Rate:
    flagged: int
    trials: int

    def interval(self) -> tuple[float, float]:
        """Two-sided 95% Clopper-Pearson interval of the rate; (0, 1) with no trials."""
        if not self.trials:
            return 0.0, 1.0
        ci = stats.binomtest(self.flagged, self.trials).proportion_ci(confidence_level=0.95, method="exact")
        return ci.low, ci.high

    def text(self) -> str:
        if not self.trials:
            return "no trials"
        low, high = self.interval()
        return f"{self.flagged}/{self.trials} = {self.flagged / self.trials:.1%} [{low:.1%}, {high:.1%}]"


def rates(trials: list[dict[str, Any]], rounds: int) -> dict[str, Rate]:
    """Per kind: how many trials the gate's rule flags on their first ``rounds`` rounds."""
    out = {}
    for kind in KINDS:
        mine = [t for t in trials if t["kind"] == kind]
        flagged = sum(compare_latency(t["a_s"][:rounds], t["b_s"][:rounds], defaults.THRESHOLD,
                                      defaults.ALPHA).regression for t in mine)
        out[kind] = Rate(flagged, len(mine))
    return out


def fewest_rounds(trials: list[dict[str, Any]]) -> int | None:
    """The smallest round count whose error rates meet :data:`GOALS`, or None.

    A false-alarm rate counts as at most ``GOALS["aa"]`` only when its whole interval is (the upper
    bound, not the point estimate); a detection rate counts as at least ``GOALS["slow10"]`` on its
    point estimate.
    """
    for n in ROUND_COUNTS:
        r = rates(trials, n)
        if r["aa"].interval()[1] <= GOALS["aa"] and r["slow10"].flagged >= GOALS["slow10"] * r["slow10"].trials:
            return n
    return None


def measured_ratios(trials: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per kind, what B measured as: the mean over trials of each trial's geometric-mean ratio B/A
    (all its rounds) with a 95% t-interval across the trials, and the same over the rounds A ran
    first (even rounds: the order rotates every round) and B ran first.

    An A/A mean away from 1 is a bias of the live compare itself; the slowdown kinds' means are the
    slowdowns the detection rates were really measured at (the injection is nominal)."""
    out = {}
    for kind in KINDS:
        logs = [np.log(np.asarray(t["b_s"]) / np.asarray(t["a_s"])) for t in trials if t["kind"] == kind]
        if len(logs) < 2:
            continue
        ratio, low, high = mean_ratio_ci([x.mean() for x in logs])
        out[kind] = {"trials": len(logs), "ratio": ratio, "low": low, "high": high,
                     "a_first": float(np.exp(np.mean([x[0::2].mean() for x in logs]))),
                     "b_first": float(np.exp(np.mean([x[1::2].mean() for x in logs])))}
    return out


def summary(out: Path) -> int:
    trials = read_lines(out / "trials.jsonl")
    if not trials:
        print(f"no trials in {out / 'trials.jsonl'}", file=sys.stderr)
        return 2
    lines = [
        "# The latency gate's error rates, live (bench/studies/gate_error_rates/gate_error_rates.py)", "",
        f"Rule: {defaults.TEST}, threshold {defaults.THRESHOLD:.0%}, alpha {defaults.ALPHA}; case "
        f"{defaults.COMPARE_CASES}, tiny preset, 240x320, each trial a live compare of this tree against itself "
        "(B with the injected slowdown for the A/B kinds). Rates with two-sided 95% Clopper-Pearson intervals.", "",
    ]
    measured = measured_ratios(trials)

    def head(kind: str) -> str:
        seen = f", measured {measured[kind]['ratio']:.3f}x" if kind in measured else ""
        return f"detected, {KINDS[kind]:.0%} injected{seen}"

    lines += [f"| rounds | false alarms (A/A) | {head('slow10')} | {head('slow05')} |", "| --- | --- | --- | --- |"]
    for n in ROUND_COUNTS:
        r = rates(trials, n)
        lines.append(f"| {n} | {r['aa'].text()} | {r['slow10'].text()} | {r['slow05'].text()} |")
    chosen = fewest_rounds(trials)
    lines += ["", f"Goals: false alarms <= {GOALS['aa']:.0%} on the interval's upper bound (proved), a 10% "
              f"slowdown detected >= {GOALS['slow10']:.0%} on the point estimate (its interval is in the "
              "table: 30 trials cannot prove it). Smallest round "
              f"count meeting both: {chosen if chosen is not None else 'none of ' + str(ROUND_COUNTS)} "
              "(the rule of `compare --pairs 1`, one process per side)."]
    lines += ["", "What B measured as (geometric-mean ratio B/A per trial; mean over trials with its 95% "
              "t-interval; then over the rounds in which A, or B, ran first):", "",
              "| kind | nominal slowdown | trials | ratio B/A | 95% CI | A first | B first |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for kind, m in measured.items():
        lines.append(f"| {kind} | {KINDS[kind]:.0%} | {m['trials']} | {m['ratio']:.4f} | {m['low']:.4f} to "
                     f"{m['high']:.4f} | {m['a_first']:.4f} | {m['b_first']:.4f} |")
    loads = sorted(t["loadavg_before"] for t in trials)
    lines += ["", f"{len(trials)} trials, {sum(t['seconds'] for t in trials) / 3600:.1f} h; median 1-min load "
              f"before a trial {loads[len(loads) // 2]:.2f}."]
    (out / "error_rates.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0

