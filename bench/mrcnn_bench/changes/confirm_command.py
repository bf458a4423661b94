"""The command that confirms a step of the history live, and how many rounds it needs.

A live compare tests the per-round ratios B/A, paired; their scatter is the per-round scatter of a
case against the ruler in an A/A study (its ``run_*.json``; ``regression_report --noise
MACHINE=DIR`` gives each machine its own, since hosts scatter differently), so a step of relative
size d is found with 90% power by a one-sided test at 5% when the rounds are at least ((z_0.95 +
z_0.90) s / ln(1 + d))^2 / 0.955 (0.955: the Wilcoxon test's efficiency against the t-test for
normal data). A process draws a level of its own that rounds cannot average away
(results/asv/README.md), so the figure is a floor, and each block's note says so.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from scipy import stats as scipy_stats

from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.files import read_json

POWER, ALPHA = 0.90, 0.05
WILCOXON_EFFICIENCY = 0.955
MIN_ROUNDS = 10


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


def rounds_for(change_pct: float, sd: float) -> int:
    """Rounds of a paired live compare that find a step of ``change_pct`` percent with 90% power
    (one-sided, alpha 5%), given the per-round scatter ``sd`` of ln(B / A)."""
    d = math.log1p(abs(change_pct) / 100)
    z = float(scipy_stats.norm.ppf(1 - ALPHA) + scipy_stats.norm.ppf(POWER))
    return max(MIN_ROUNDS, math.ceil((z * sd / d) ** 2 / WILCOXON_EFFICIENCY))


def confirm(metric: str, parent: str, commit: str, change_pct: float | None, noise: dict[str, float]
            ) -> tuple[str, int | None, str]:
    """(command, rounds, note) that confirms a step of ``metric`` at ``commit`` live."""
    case = case_of(metric)
    if metric.startswith("Accuracy."):
        command = (f"for r in {parent} {commit}; do git worktree add -f /tmp/mrcnn-$r $r && "
                   f"PYTHONPATH=/tmp/mrcnn-$r:bench python -m mrcnn_bench.history.fixed_accuracy "
                   f"evaluate /tmp/mrcnn-$r.json; "
                   "done  # 1 - AP of the fixed checkpoint with each commit's inference: exact")
        return command, None, ""
    if metric.startswith("Compiles."):
        return (f"mrcnn-bench compare {parent} {commit} --cases {case} --threshold 0 --rounds {MIN_ROUNDS}", None,
                "live and interleaved; compile counts are exact, so one run shows them")
    sd = noise.get(case)
    if sd is None or change_pct is None or change_pct == 0:
        rounds, note = 100, "no A/A study of this case to size the rounds: 100 is a guess"
    else:
        rounds = rounds_for(change_pct, sd)
        note = (f"live and interleaved; from the A/A study's per-round scatter of ln(case / ruler), {sd:.3f}: "
                f"rounds for 90% power against a {abs(change_pct):.1f}% step, process levels aside")
    return f"mrcnn-bench compare {parent} {commit} --cases {case} --threshold 0 --rounds {rounds}", rounds, note
