"""Does a Duet compare (A and B at once, each pinned to a core of its own) measure a one-thread A/A
ratio more tightly per minute than process pairs that take turns on one core?

    PYTHONPATH=bench python bench/studies/compare_duet/duet.py run --trials 12 [--pairs 8 --rounds 16]
    PYTHONPATH=bench python bench/studies/compare_duet/duet.py summary

Duet benchmarking (Bulej et al., ICPE 2020) runs the two versions at the same time on one VM, so
that what the machine does to one round (a noisy neighbour, frequency, the host's scheduler) it
does to the other, and the per-round ratio cancels it. Both modes here time ``static/eager`` of the
tiny preset on one torch thread, the same commit on both sides (A/A), and decide with the same
statistic (:func:`mrcnn_bench.gates.stats.compare_pairs`: the pair is the unit):

- ``alternate``: ``mrcnn-bench compare HEAD HEAD --threads 1 --cpus C`` with ``--pairs`` and
  ``--rounds``: in each pair, A's and B's workers take turns on core C, the other core idle;
- ``duet``: ``--pairs`` duets, each two ``mrcnn-bench run`` processes started together, A pinned to
  one core and B to the other, ``--rounds`` rounds each, paired by round; the cores swap every duet
  (the statistic's start-order groups then hold the core asymmetry, which cancels).

A trial runs both modes, in an order that alternates between trials. Trials append to
``OUT/<host>/trials.jsonl`` (resumable: ``run`` adds trials until there are ``--trials``); each
line holds one mode's estimate, its standard error, its noise model, its seconds and every
timing it came from. ``summary`` writes ``OUT/<host>/summary.md``: per mode the spread of the
estimate over trials, the mean standard error, the minutes, and their product with the square
root of the minutes (the spread that one minute of the machine buys: smaller is better), with the
F-test of the two spreads. Run it from a checkout nobody edits (a ``git worktree``), the machine
otherwise idle.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/

from studies.compare_pairs.teeth import read_trials, trials_file  # OUT/<host>/trials.jsonl, one line each

from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.base.timing import Stopwatch
from mrcnn_bench.cli.args import bounded, parse_cpus
from mrcnn_bench.gates import stats

REPO = Path(__file__).resolve().parents[3]
CASE = "static/eager"
MODES = ("alternate", "duet")
COMMON = ["--cases", CASE, "--preset", "tiny", "--image-size", "240x320", "--threads", "1", "--no-progress"]


def mrcnn_bench(*args: str) -> list[str]:
    return [sys.executable, "-m", "mrcnn_bench", *args]


def check_exit(proc: subprocess.CompletedProcess | subprocess.Popen, what: str, stderr: str) -> None:
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{what} exited {proc.returncode}:\n{stderr[-3000:]}")


def alternate(cpus: tuple[int, int], pairs: int, rounds: int) -> tuple[list, list, list]:
    """One ``compare HEAD HEAD`` on core ``cpus[0]``: (A's rounds, B's rounds, A first) per pair."""
    with tempfile.TemporaryDirectory(prefix="mrcnn-duet-") as tmp:
        out = Path(tmp) / "cmp.json"
        proc = subprocess.run(mrcnn_bench("compare", "HEAD", "HEAD", *COMMON, "--cpus", str(cpus[0]),
                                          "--pairs", str(pairs), "--rounds", str(rounds), "--out", str(out)),
                              cwd=REPO, capture_output=True, text=True, check=False)
        check_exit(proc, "compare", proc.stderr)
        timings = json.loads(out.read_text())["pairs"]
    a = [p["rows"][f"A:{CASE}"]["times_s"] for p in timings]
    b = [p["rows"][f"B:{CASE}"]["times_s"] for p in timings]
    return a, b, [p["a_first"] for p in timings]


def duet(cpus: tuple[int, int], pairs: int, rounds: int) -> tuple[list, list, list]:
    """``pairs`` duets of two ``run`` processes at once, one per core, cores swapped every duet:
    (A's rounds, B's rounds, A on ``cpus[0]``) per duet."""
    a, b, a_on_first = [], [], []
    for k in range(pairs):
        order = cpus if k % 2 == 0 else cpus[::-1]
        with tempfile.TemporaryDirectory(prefix="mrcnn-duet-") as tmp:
            procs = {}
            for side, cpu in zip("AB", order, strict=True):
                args = mrcnn_bench("run", *COMMON, "--cpus", str(cpu), "--rounds", str(rounds), "--peak-reps", "0",
                                   "--no-flops", "--no-plots", "--out", f"{tmp}/{side}", "--name", "run")
                procs[side] = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                               text=True)
            errors = {side: p.communicate()[1] for side, p in procs.items()}
            for side, p in procs.items():
                check_exit(p, f"run of {side} on core {order['AB'.index(side)]}", errors[side])
            times = {side: next(r["times_s"] for r in json.loads(Path(f"{tmp}/{side}/run.json").read_text())["records"]
                                if r["case"] == CASE) for side in "AB"}
        a.append(times["A"])
        b.append(times["B"])
        a_on_first.append(k % 2 == 0)
    return a, b, a_on_first


def one(mode: str, cpus: tuple[int, int], pairs: int, rounds: int) -> dict:
    """One compare in ``mode``: its verdict's estimate (log B/A), standard error and noise, its seconds."""
    load = os.getloadavg()[0]
    with Stopwatch() as clock:
        a, b, first = (alternate if mode == "alternate" else duet)(cpus, pairs, rounds)
    v = stats.compare_pairs(a, b, first)
    log_ratio = math.log(v.estimate)
    se = (math.log(v.ci_high) - math.log(v.ci_low)) / (2 * sps.t.ppf(0.975, len(a) - 2))
    return {"mode": mode, "case": CASE, "log_ratio": log_ratio, "se": se, "ratio": v.estimate,
            "ci95": [v.ci_low, v.ci_high], "process_sd": v.process_sd, "round_sd": v.round_sd,
            "order_effect": v.order_effect, "median_a_s": v.median_a, "pairs": pairs, "rounds": rounds,
            "cpus": list(cpus), "seconds": clock.seconds, "loadavg_before": load, "a": a, "b": b, "a_first": first}


def run(out: Path, trials: int, pairs: int, rounds: int, cpus: tuple[int, int]) -> None:
    path = trials_file(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    done = len(read_trials(path)) // len(MODES)
    for i in range(done, trials):
        for mode in (MODES if i % 2 == 0 else MODES[::-1]):
            line = one(mode, cpus, pairs, rounds)
            with path.open("a") as f:
                f.write(json.dumps(line) + "\n")
            print(f"trial {i + 1}/{trials} {mode}: ratio {line['ratio']:.4f} se {line['se']:.4f} "
                  f"({line['seconds']:.0f} s)", flush=True)


def summary(out: Path) -> int:
    path = trials_file(out)
    rows = read_trials(path)
    by_mode = {m: [r for r in rows if r["mode"] == m] for m in MODES}
    if min(len(v) for v in by_mode.values()) < 2:
        print(f"{path}: fewer than 2 trials of a mode", file=sys.stderr)
        return 2
    lines = [f"# Duet against alternating process pairs, one thread, A/A ({path.parent.name})", "",
             "`PYTHONPATH=bench python bench/studies/compare_duet/duet.py run`, then `summary` "
             f"({CASE}, tiny preset, 240x320, one torch thread; the same commit on both sides).", "",
             "| mode | trials | pairs x rounds | mean ratio B/A | sd of log ratio over trials | mean se | "
             "median minutes | sd x sqrt(minutes) | median process sd | median round sd |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    spread = {}
    for mode, rs in by_mode.items():
        logs = np.array([r["log_ratio"] for r in rs])
        minutes = float(np.median([r["seconds"] for r in rs])) / 60
        spread[mode] = float(logs.std(ddof=1))
        shapes = sorted({f"{r['pairs']} x {r['rounds']}" for r in rs})
        lines.append(f"| {mode} | {len(rs)} | {', '.join(shapes)} | {math.exp(logs.mean()):.4f} | "
                     f"{spread[mode]:.4f} | {np.mean([r['se'] for r in rs]):.4f} | {minutes:.1f} | "
                     f"{spread[mode] * math.sqrt(minutes):.4f} | "
                     f"{np.median([r['process_sd'] for r in rs]):.4f} | {np.median([r['round_sd'] for r in rs]):.4f} |")
    n_alt, n_duet = len(by_mode["alternate"]), len(by_mode["duet"])
    f = (spread["duet"] / spread["alternate"]) ** 2
    p = float(sps.f.cdf(f, n_duet - 1, n_alt - 1))  # one-sided: the duet's spread is the smaller
    lines += ["", f"Variance ratio duet / alternate: {f:.3f} (F-test, one-sided p that the duet's is smaller: "
              f"{p:.3f}, {n_duet - 1} and {n_alt - 1} degrees of freedom)."]
    text = "\n".join(lines) + "\n"
    atomic_write(path.parent / "summary.md", text)
    print(text)
    return 0


def two_cpus(text: str) -> tuple[int, int]:
    """The harness's CPU list (:func:`mrcnn_bench.cli.args.parse_cpus`), of exactly two CPUs."""
    cpus = parse_cpus(text)
    if len(cpus) != 2:
        raise argparse.ArgumentTypeError(f"--cpus wants two distinct CPUs like 0,1, got {text!r}")
    return cpus  # type: ignore[return-value]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("run", "summary"))
    parser.add_argument("--trials", type=bounded(int, 1), default=12,
                        help="trials in all, each both modes (default: %(default)s)")
    parser.add_argument("--pairs", type=bounded(int, 1), default=8,
                        help="process pairs or duets a compare (default: %(default)s)")
    parser.add_argument("--rounds", type=bounded(int, 1), default=16, help="rounds a process (default: %(default)s)")
    parser.add_argument("--cpus", type=two_cpus, default="0,1", help="the two cores (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=REPO / "results/compare_duet")
    args = parser.parse_args()
    if args.what == "run":
        if args.pairs < 4 or args.rounds < 2:
            parser.error("--pairs 4 or more (two of each core order) and --rounds 2 or more")
        run(args.out, args.trials, args.pairs, args.rounds, args.cpus)
    return summary(args.out)


if __name__ == "__main__":
    sys.exit(main())
