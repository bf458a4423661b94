"""The command that confirms a step of the history live, and how many process pairs it needs.

A live compare runs K pairs of fresh processes, R rounds each, and tests across the pairs
(:func:`mrcnn_bench.gates.stats.compare_pairs`): a pair's mean log ratio B/A varies by the
between-process sd plus the round sd over sqrt(R). The round sd is the per-round scatter of a case
against the ruler in an A/A study (its ``run_*.json``; ``regression_report --noise MACHINE=DIR``
gives each machine its own, since hosts scatter differently); the between-process sd is the one the
compare's defaults were sized on (``defaults.PROCESS_SD``). K is the fewest pairs whose one-sided
t-test (K - 2 degrees of freedom, as with both start orders) at the compare's alpha finds a step of
the given size with 90% power, from the noncentral t distribution.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from scipy import stats as scipy_stats

from mrcnn_bench.base import defaults
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.files import read_json

POWER = 0.90
MIN_PAIRS, MAX_PAIRS = 4, 400
GUESS_PAIRS = 40  # no A/A study of the case: a guess, and the block says so


def case_of(metric: str) -> str:
    """``Latency.track_ratio(static/eager)`` -> ``static/eager`` (the first parameter), else ""."""
    return metric.partition("(")[2].rstrip(")").split(", ")[0] if "(" in metric else ""


def round_noise(folder: Path | None) -> dict[str, float]:
    """Case -> standard deviation of ln(case / ruler) per round, within each process of the A/A
    study in ``folder`` (``run_*.json`` of :mod:`mrcnn_bench.history.aa_spread`), pooled over its processes
    and runs; empty when there is no such study."""
    if folder is None or not folder.is_dir():
        return {}
    return _pooled(sorted(folder.glob("run_*.json")))


def _pooled(paths: Sequence[Path]) -> dict[str, float]:
    """:func:`round_noise` over the study files ``paths``."""
    squares: dict[str, list[float]] = {}
    for path in paths:
        timing = read_json(path, "a run file of an A/A study", dict).get("timing", {})
        for case, part in timing.items():
            record = part.get("record") or {}
            logs = [math.log(c / r) for c, r in zip(record.get("case_s", []), record.get("ruler_s", []), strict=True)]
            per = max(1, record.get("processes", 1))
            size = max(1, len(logs) // per)
            for chunk in (logs[i:i + size] for i in range(0, len(logs), size)):
                if len(chunk) > 2:
                    mean = statistics.fmean(chunk)
                    squares.setdefault(case, []).extend((x - mean) ** 2 * len(chunk) / (len(chunk) - 1) for x in chunk)
    return {case: math.sqrt(statistics.fmean(v)) for case, v in squares.items() if v}


def noise_by_machine(specs: Sequence[str]) -> dict[str | None, dict[str, float]]:
    """``DIR`` or ``MACHINE=DIR`` per spec -> {machine (None: every other one): :func:`round_noise`};
    ValueError for a folder without ``run_*.json`` or a machine named twice."""
    out: dict[str | None, dict[str, float]] = {}
    for spec in specs:
        machine, _, folder = spec.partition("=") if "=" in spec else (None, "", spec)
        paths = sorted(Path(folder).glob("run_*.json"))
        if not paths:
            raise UsageError(f"--noise {spec}: no A/A study (run_*.json) in {folder}")
        if machine in out:
            raise UsageError(f"--noise {spec}: {machine or 'the default'} has an A/A study already")
        out[machine or None] = _pooled(paths)
    return out


def pairs_for(change_pct: float, round_sd: float, process_sd: float = defaults.PROCESS_SD,
              rounds: int = defaults.COMPARE_ROUNDS, alpha: float = defaults.ALPHA) -> int:
    """Process pairs of ``rounds`` rounds each that find a step of ``change_pct`` percent with 90%
    power (one-sided t-test across pairs at ``alpha``), given the noise model (sds of ln(B / A))."""
    d = math.log1p(abs(change_pct) / 100)
    sd = math.sqrt(process_sd**2 + round_sd**2 / rounds)
    for pairs in range(MIN_PAIRS, MAX_PAIRS + 1):
        df = pairs - 2
        if scipy_stats.nct.sf(scipy_stats.t.ppf(1 - alpha, df), df, d / (sd / math.sqrt(pairs))) >= POWER:
            return pairs
    return MAX_PAIRS


def confirm(metric: str, parent: str, commit: str, change_pct: float | None, noise: dict[str, float]
            ) -> tuple[str, int | None, str]:
    """(command, process pairs, note) that confirms a step of ``metric`` at ``commit`` live."""
    case = case_of(metric)
    if metric.startswith("Accuracy."):
        command = (f"for r in {parent} {commit}; do git worktree add -f /tmp/mrcnn-$r $r && "
                   f"PYTHONPATH=/tmp/mrcnn-$r:bench python -m mrcnn_bench.history.fixed_accuracy "
                   f"evaluate /tmp/mrcnn-$r.json; "
                   "done  # 1 - AP of the fixed checkpoint with each commit's inference: exact")
        return command, None, ""
    if metric.startswith("Compiles."):
        return (f"mrcnn-bench compare {parent} {commit} --cases {case} --pairs 1 --rounds 2", None,
                "live; compile counts are exact, so one pair of processes shows them")
    sd = noise.get(case)
    if sd is None or change_pct is None or change_pct == 0:
        pairs, note = GUESS_PAIRS, f"no A/A study of this case to size the pairs: {GUESS_PAIRS} is a guess"
    else:
        pairs = pairs_for(change_pct, sd)
        note = (f"live, in process pairs of {defaults.COMPARE_ROUNDS} rounds; the A/A study's per-round scatter of "
                f"ln(case / ruler), {sd:.3f}, and a between-process sd of {defaults.PROCESS_SD}: pairs for 90% power "
                f"against a {abs(change_pct):.1f}% step at alpha {defaults.ALPHA}")
    return f"mrcnn-bench compare {parent} {commit} --cases {case} --threshold 0 --pairs {pairs}", pairs, note
