"""An A/A study's runs as a measured history: one commit measured N times, read as N commits.

    python bench/studies/change_point_power/aa_history_csv.py SPREAD_CSV OUT_CSV
    mrcnn-bench steps --series OUT_CSV

SPREAD_CSV is the ``spread.csv`` of ``mrcnn-bench asv spread``; OUT_CSV gets the columns
``metric, commit, value`` that ``mrcnn-bench steps --series`` reads: every held ratio and every stage
ratio, each run a "commit" (``run_1``, ``run_2``, ...) in run order. A change point in it is a false
alarm, or a change of machine between runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd


def history(spread: pd.DataFrame) -> pd.DataFrame:
    """spread.csv (figures x runs) -> rows (metric, commit, value), each metric's runs in order."""
    keep = [i for i in spread.index if i.endswith(" ratio") or (" stage " in i and "medians" not in i)]
    runs = sorted((c for c in spread.columns if c.startswith("run ")), key=lambda c: int(c.split()[1]))
    long = spread.loc[keep, runs].rename_axis("metric").reset_index().melt(
        id_vars="metric", var_name="commit", value_name="value")
    long["commit"] = long["commit"].str.replace(" ", "_")
    return long.sort_values("metric", kind="stable").reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("spread", type=Path, help="an A/A study's spread.csv")
    parser.add_argument("out", type=Path, help="the history CSV to write")
    args = parser.parse_args(argv)
    if not args.spread.is_file():
        print(f"aa_history_csv: {args.spread}: no such file", file=sys.stderr)
        return 2
    long = history(pd.read_csv(args.spread, index_col=0))
    long.to_csv(args.out, index=False, float_format="%.6g")
    print(f"{long['metric'].nunique()} metrics, {len(long)} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
