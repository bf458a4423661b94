"""Where the A/A noise of a commit's ratio comes from: the single calls, the processes or the run.

    python bench/studies/commit_cost/noise_components.py LABEL=DIR [LABEL=DIR ...] [--out FILE.md]

Each DIR is an A/A study's folder (``run_K.json`` of ``mrcnn-bench asv spread``): the same
commit measured K times, each run's record holding every timed round of every process. Per study
and ratio the table gives

- **per call**: the robust standard deviation (1.4826 MAD) of one call's log seconds, for the
  case's calls, the ruler's and their ratio in the same round, and the correlation of the case's
  and the ruler's changes from round to round (how much of the machine's drift the ruler cancels);
- **per process**: the standard deviation of the processes' median ratios within a run (pooled over
  runs), beside what the per-call scatter alone predicts for a median of that many rounds
  (sqrt(pi / 2) sigma / sqrt(n)): a process level of its own shows as an excess;
- **per run**: the coefficient of variation of the commit's figure over the runs, and the part of it
  that the processes within a run do not explain (a level the whole run draws: the VM of the day);
- **the first process**: its median ratio over the second's, run by run (mean, the runs where it is
  above, a one-sample t-test of no gap): the first process runs the compile probes.

All of it in % of the figure. The per-call scatter is taken from the differences of successive
rounds (their robust standard deviation over sqrt(2)), so a process's own level, and a slow drift,
do not count as scatter; the records keep each process's median ratio but not where its rounds end,
and the few differences across a boundary between processes do not move a median absolute deviation.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

# The sibling study, found beside this script (Python puts the script's folder on the path).
from cv_compare import RATIOS, study_args
from scipy import stats


def robust_sd(values: np.ndarray) -> float:
    """1.4826 times the median absolute deviation: the standard deviation where the values are
    normal, and not moved by the few calls a busy neighbour slows by half."""
    return float(1.4826 * np.median(np.abs(values - np.median(values))))


def call_scatter(log_seconds: np.ndarray) -> float:
    """Per-call standard deviation of a series of log seconds from its successive differences."""
    return robust_sd(np.diff(log_seconds)) / math.sqrt(2)


def load_runs(folder: Path) -> list[dict]:
    """The timing records of an A/A study's runs (``run_K.json``, case -> part), in run order."""
    paths = sorted(folder.glob("run_*.json"), key=lambda p: int(p.stem.split("_")[1]))
    return [json.loads(path.read_text())["timing"] for path in paths]


def components(runs: Sequence[dict], case: str) -> dict[str, float] | None:
    """The noise of ``case``'s ratio in an A/A study's ``runs`` (:func:`load_runs`; module
    docstring), in % of the figure; None where the study has fewer than 2 runs of that case."""
    calls: dict[str, list[float]] = {"case": [], "ruler": [], "ratio": [], "corr": []}
    per_process: list[list[float]] = []
    rounds: list[float] = []
    for timing in runs:
        part = timing.get(case)
        if not part or not part.get("record"):
            continue
        rec = part["record"]
        case_log, ruler_log = np.log(rec["case_s"]), np.log(rec["ruler_s"])
        calls["case"].append(call_scatter(case_log))
        calls["ruler"].append(call_scatter(ruler_log))
        calls["ratio"].append(call_scatter(case_log - ruler_log))
        calls["corr"].append(float(np.corrcoef(np.diff(case_log), np.diff(ruler_log))[0, 1]))
        per_process.append(list(rec["ratio_per_process"]))
        rounds.append(len(rec["case_s"]) / len(rec["ratio_per_process"]))
    if len(per_process) < 2 or len({len(p) for p in per_process}) != 1:
        return None
    n_proc = len(per_process[0])
    figure = np.median(per_process, axis=1)  # the tracked figure: the median of the process medians
    mean = float(figure.mean())
    out = {
        "runs": float(len(figure)),
        "processes": float(n_proc),
        "rounds": float(np.mean(rounds)),
        "call_case": 100 * float(np.mean(calls["case"])),
        "call_ruler": 100 * float(np.mean(calls["ruler"])),
        "call_ratio": 100 * float(np.mean(calls["ratio"])),
        "corr": float(np.mean(calls["corr"])),
        "figure_cv": 100 * float(figure.std(ddof=1)) / mean,
    }
    # A median of n independent rounds scatters by sqrt(pi/2) sigma / sqrt(n).
    out["process_expected"] = math.sqrt(math.pi / 2) * out["call_ratio"] / math.sqrt(out["rounds"])
    if n_proc > 1:
        levels = np.asarray(per_process) / mean
        within = float(levels.var(axis=1, ddof=1).mean())
        out["process_observed"] = 100 * math.sqrt(within)
        between = float(levels.mean(axis=1).var(ddof=1)) - within / n_proc
        out["run_level"] = 100 * math.sqrt(max(0.0, between))
        # The first process against the second, run by run: a level of the first process's own
        # (it runs the compile probes) shows as a gap of one sign.
        gaps = 100 * (np.asarray([p[0] / p[1] for p in per_process]) - 1)
        out["first_gap"] = float(gaps.mean())
        out["first_above"] = float((gaps > 0).sum())
        out["first_gap_p"] = float(stats.ttest_1samp(gaps, 0).pvalue) if gaps.std() > 0 else math.nan
    return out


COLUMNS = {
    "runs": ("runs", "{:.0f}"),
    "processes": ("processes", "{:.0f}"),
    "rounds": ("rounds per process", "{:.0f}"),
    "call_case": ("per call: case", "{:.1f}%"),
    "call_ruler": ("ruler", "{:.1f}%"),
    "call_ratio": ("ratio", "{:.1f}%"),
    "corr": ("corr.", "{:+.2f}"),
    "process_expected": ("per process: from the calls", "{:.2f}%"),
    "process_observed": ("observed", "{:.2f}%"),
    "run_level": ("per run: a level of its own", "{:.2f}%"),
    "figure_cv": ("figure's CV", "{:.2f}%"),
    "first_gap": ("process 1 over 2: mean", "{:+.1f}%"),
    "first_above": ("runs above", "{:.0f}"),
    "first_gap_p": ("t-test p", "{:.2g}"),
}


def table(studies: Sequence[tuple[str, Path]]) -> pd.DataFrame:
    rows = []
    for label, folder in studies:
        runs = load_runs(folder)
        for case in RATIOS:
            got = components(runs, case)
            if got is None:
                continue
            row = {"study": label, "figure": case}
            for key, (name, fmt) in COLUMNS.items():
                value = got.get(key, math.nan)
                row[name] = fmt.format(value) if math.isfinite(value) else "-"
            rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parsed = study_args("noise_components", __doc__.split("\n")[0], argv, "DIR/run_K.json",
                        lambda folder: any(folder.glob("run_*.json")))
    if parsed is None:
        return 2
    text = table(parsed.studies).to_markdown(index=False)
    print(text)
    if parsed.out:
        what = __doc__.split("\n", 1)[1].split("All of it")[0].strip()  # the usage line and the columns
        command = parsed.command("noise_components.py")
        parsed.out.write_text(f"# Where the A/A noise of each ratio comes from\n\n`{command}`\n\n{what}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
