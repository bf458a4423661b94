"""The A/A coefficient of variation of each held ratio, side by side for several A/A studies, with
95% intervals: is one way of measuring a commit noisier than another?

    python bench/studies/commit_cost/cv_compare.py LABEL=DIR [LABEL=DIR ...] [--out FILE.md]

Each DIR is an A/A study's folder (``spread.csv`` of ``bench/tools/history_spread.py``). The
interval of a coefficient of variation from n runs is the chi-square interval of a standard
deviation, (n - 1) s^2 / sigma^2 ~ chi2(n - 1), scaled by the mean: with 3 or 5 runs it is wide,
and the table says so rather than ranking two values that it cannot tell apart. A second table
tests each later study against the first: the ratio of their squared coefficients of variation
(the relative variances), with the two-sided F-test's p on (n - 1, n_first - 1) degrees of freedom.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

import pandas as pd
from scipy import stats

RATIOS = ("static/eager", "static/xla", "static/inductor", "static/train", "torchvision/eager")


def cv_interval(cv: float, runs: int) -> tuple[float, float]:
    """95% interval of a coefficient of variation estimated from ``runs`` values (chi-square)."""
    if runs < 2 or not math.isfinite(cv):
        return math.nan, math.nan
    df = runs - 1
    return cv * math.sqrt(df / stats.chi2.ppf(0.975, df)), cv * math.sqrt(df / stats.chi2.ppf(0.025, df))


def row(label: str, folder: Path) -> dict[str, str]:
    cvs, runs = _cv_and_runs(folder)
    out = {"study": f"{label} ({runs} runs)"}
    for case in RATIOS:
        if case not in cvs:
            out[case] = "-"
            continue
        low, high = cv_interval(cvs[case], runs)
        out[case] = f"{cvs[case]:.2%} ({low:.2%}-{high:.2%})"
    return out


def _cv_and_runs(folder: Path) -> tuple[dict[str, float], int]:
    table = pd.read_csv(folder / "spread.csv", index_col=0)
    runs = sum(c.startswith("run ") for c in table.columns)
    return {case: float(table.loc[f"{case} ratio", "cv"]) for case in RATIOS if f"{case} ratio" in table.index}, runs


def f_row(label: str, folder: Path, first: tuple[dict[str, float], int]) -> dict[str, str]:
    """Relative variance of ``folder``'s study over the first study's (its :func:`_cv_and_runs`) per
    ratio, with the two-sided F-test's p."""
    (cvs, runs), (base, base_runs) = _cv_and_runs(folder), first
    out = {"study": f"{label} ({runs} runs)"}
    for case in RATIOS:
        if case not in cvs or case not in base or not base[case] > 0:
            out[case] = "-"
            continue
        f = (cvs[case] / base[case]) ** 2
        tail = stats.f.sf(f, runs - 1, base_runs - 1) if f >= 1 else stats.f.cdf(f, runs - 1, base_runs - 1)
        out[case] = f"F = {f:.2f}, p = {min(1.0, 2 * tail):.3f}"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("studies", nargs="+", metavar="LABEL=DIR")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here (markdown)")
    args = parser.parse_args(argv)
    rows = []
    for text in args.studies:
        label, sep, folder = text.partition("=")
        if not sep or not (Path(folder) / "spread.csv").is_file():
            print(f"cv_compare: {text!r}: expected LABEL=DIR with DIR/spread.csv", file=sys.stderr)
            return 2
        rows.append(row(label, Path(folder)))
    text = ("A/A coefficient of variation of each ratio to the ruler (95% chi-square interval)\n\n"
            + pd.DataFrame(rows).to_markdown(index=False) + "\n")
    studies = [text_.partition("=") for text_ in args.studies]
    if len(studies) > 1:
        first = _cv_and_runs(Path(studies[0][2]))
        tests = [f_row(label, Path(folder), first) for label, _, folder in studies[1:]]
        text += (f"\nRelative variance against {studies[0][0]} (F = (cv / cv_first)^2, two-sided F-test)\n\n"
                 + pd.DataFrame(tests).to_markdown(index=False) + "\n")
    print(text)
    if args.out:
        args.out.write_text(f"`python bench/studies/commit_cost/cv_compare.py {shlex.join(args.studies)}`\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
