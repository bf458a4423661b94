"""The false-alarm rate of ``mrcnn-bench compare RUN_A.json RUN_B.json`` across separate runs of the same code.

The logic of ``bench/studies/stored_compare_false_alarms/stored_compare_aa.py`` (its docstring says
the method): :func:`run` appends trials (two separate ``mrcnn-bench run`` processes, the second
compared with the first as ``compare A.json B.json`` does) to ``OUT/trials.jsonl``; :func:`summary`
writes ``OUT/summary.md``: the per-round rule's false alarms, the spread of the stored ratio between
runs, the between-run sd beyond the rounds' noise (:func:`between_run_sd`) and the stored rule's
alarms on the trials cross-fitted by halves (:func:`stored_rule_alarms`).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

from scipy import stats

from mrcnn_bench.base import defaults, timing
from mrcnn_bench.gates import ab
from mrcnn_bench.gates.stats import compare_latency, compare_stored
from mrcnn_bench.running import store
from mrcnn_bench.running.journal import read_lines

CASES = "torchvision/eager,static/eager"
WORKLOAD = ["--preset", "tiny", "--image-size", "240x320", "--images", "3"]
RUNS = Path("out/stored_compare_aa")


def one_run(name: str, rounds: int) -> store.RunDocument:
    path = RUNS / f"{name}.json"
    if not path.is_file():
        cmd = [sys.executable, "-m", "mrcnn_bench", "run", *WORKLOAD, "--cases", CASES, "--rounds", str(rounds),
               "--peak-reps", "0", "--no-flops", "--no-plots", "--no-progress", "--out", str(RUNS), "--name", name,
               "--start-over"]  # an unfinished run of an interrupted study is measured again whole
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{name}: exit {result.returncode}\n{result.stderr[-2000:]}")
    return store.load(path)


def run(out: Path, pairs: int, rounds: int) -> int:
    """Append trials to ``OUT/trials.jsonl`` until it holds ``pairs``; each trial two runs of ``rounds``."""
    trials_path = out / "trials.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    done = len(read_lines(trials_path))
    for pair in range(done, pairs):
        wall, load = timing.Stopwatch(), os.getloadavg()[0]
        a, b = one_run(f"pair{pair:03d}_a", rounds), one_run(f"pair{pair:03d}_b", rounds)
        line = ab.compare_records(a.records, b.records, relative=True).set_index("case").loc["static/eager"]
        times = {f"{side}_{r.case}": r.times_s for side, doc in (("a", a), ("b", b)) for r in doc.records}
        low, high = (float(x) for x in line["ci95"].split("-"))
        trial = {"pair": pair, "ratio": float(line["ratio_b_over_a"]), "low": low, "high": high,
                 "p_value": float(line["p_value"]),
                 "regression": bool(line["regression"]), "verdict": line["verdict"], "rounds": rounds,
                 "seconds": wall.elapsed(), "loadavg_before": load, "loadavg_after": os.getloadavg()[0], **times}
        with trials_path.open("a") as f:
            f.write(json.dumps(trial) + "\n")
            f.flush()
            os.fsync(f.fileno())
        print(f"pair {pair}: ratio {trial['ratio']:.3f} [{trial['low']:.3f}-{trial['high']:.3f}] "
              f"p={trial['p_value']:.3g} {'FALSE ALARM' if trial['regression'] else 'ok'}", flush=True)
    return 0


def ratios(trial: dict, side: str, scale: float = 1.0) -> list[float]:
    """One run's per-round static/eager / torchvision/eager, its static rows' times times ``scale``."""
    return [scale * s / r for s, r in zip(trial[f"{side}_static/eager"], trial[f"{side}_torchvision/eager"],
                                          strict=True)]


def log_levels(trial: dict, side: str) -> list[float]:
    """:func:`ratios` as logs: what the between-run sd is computed on."""
    return [math.log(x) for x in ratios(trial, side)]


def between_run_sd(trials: list[dict]) -> float:
    """The sd of the difference of two runs' mean log ratios beyond their rounds' noise: sqrt(var(d) -
    mean(within variance of d)), 0 when the rounds' noise explains it all."""
    d, within = [], []
    for t in trials:
        a, b = log_levels(t, "a"), log_levels(t, "b")
        d.append(statistics.fmean(b) - statistics.fmean(a))
        within.append(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    return math.sqrt(max(statistics.variance(d) - statistics.fmean(within), 0.0))


def stored_rule_alarms(trials: list[dict], scale: float = 1.0) -> tuple[int, int]:
    """(flagged, trials) by the stored rule, B's static rows' times times ``scale``; each half of the
    trials is judged with the between-run sd estimated on the other half (no trial judges itself)."""
    halves = (trials[0::2], trials[1::2])
    flagged = 0
    for judged, fitted in (halves, halves[::-1]):
        sd = between_run_sd(fitted)
        for t in judged:
            flagged += compare_stored(ratios(t, "a"), ratios(t, "b", scale), sd).regression
    return flagged, len(trials)


def _rate(k: int, n: int) -> str:
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return f"{k} of {n} = {k / n:.1%} [{ci.low:.1%}, {ci.high:.1%}]"


def summary(out: Path) -> int:
    """Write ``OUT/summary.md`` from the trials so far; exit status 2 with fewer than 4."""
    trials = read_lines(out / "trials.jsonl")
    if len(trials) < 4:
        print(f"{len(trials)} trials in {out}: a summary needs 4 or more", file=sys.stderr)
        return 2
    n = len(trials)
    # The per-round rule, recomputed from the times (the trials' own "regression" is whatever rule
    # compare used when they ran): one tested case, so Holm leaves its p as it is.
    alarms = sum(compare_latency(ratios(t, "a"), ratios(t, "b")).regression for t in trials)
    estimates = sorted(math.exp(statistics.fmean(log_levels(t, "b")) - statistics.fmean(log_levels(t, "a")))
                    for t in trials)  # the stored rule's estimate
    q, lowest, highest = statistics.quantiles(estimates, n=20), estimates[0], estimates[-1]
    sd = between_run_sd(trials)
    text = [
        f"# Stored-run compare, A/A: {n} trials of {trials[0]['rounds']} rounds",
        "",
        "`python bench/studies/stored_compare_false_alarms/stored_compare_aa.py run` then `summary`. "
        "A trial: two separate `mrcnn-bench run`s of the",
        "same code (static/eager and torchvision/eager, tiny preset, 240x320, 2 threads), each row's rounds",
        "taken over the same round's torchvision/eager time in its own run. Rates with two-sided 95%",
        "Clopper-Pearson intervals.",
        "",
        "**The per-round rule**, what `compare A.json B.json` used before (Wilcoxon on the per-round ratios, rounds",
        "of the two runs paired by index, against 1.05, alpha 0.01): false alarms " + _rate(alarms, n) + ".",
        f"The stored ratio B/A between two runs of the same code: median {statistics.median(estimates):.3f}, "
        f"5th-95th percentile {q[0]:.3f}-{q[-1]:.3f},",
        f"range {lowest:.3f}-{highest:.3f}: each process settles at a level of its own, which the per-round",
        "test cannot see.",
        "",
        f"**Between-run sd** of the difference of the runs' mean log ratios beyond their rounds' noise: {sd:.4f}",
        f"(halves of the trials: {between_run_sd(trials[0::2]):.4f} and {between_run_sd(trials[1::2]):.4f}).",
        f"`compare`'s default (`mrcnn_bench.base.defaults.BETWEEN_RUN_SD`) is {defaults.BETWEEN_RUN_SD}.",
        "",
        "**The stored rule** (`mrcnn_bench.gates.stats.compare_stored`, what `compare A.json B.json` uses now):",
        "a z-test of the difference of the runs' mean log ratios against log 1.05, its variance the rounds' plus the",
        "between-run sd squared, alpha 0.01. Each half of the trials judged with the sd estimated on the other",
        "half; a slowdown is B's static/eager times multiplied after the fact (real noise, synthetic change):",
        "",
        "| B's static/eager times x | flagged |",
        "| --- | --- |",
    ]
    for scale in (1.0, 1.10, 1.20, 1.30):
        text.append(f"| {scale:.2f} | {_rate(*stored_rule_alarms(trials, scale))} |")
    load = statistics.median(t["loadavg_before"] for t in trials)
    text += ["", f"Load average before the trials: median {load:.2f}."]
    (out / "summary.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    return 0

