"""The A/A coefficient of variation of each held ratio, side by side for several A/A studies, with
95% intervals: is one way of measuring a commit noisier than another?

    python bench/studies/commit_cost/cv_compare.py LABEL=DIR [LABEL=DIR ...] [--out FILE.md]

Each DIR is an A/A study's folder (``spread.csv`` of ``mrcnn-bench asv spread``). The
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
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class StudyArgs:
    """The ``LABEL=DIR ... [--out FILE.md]`` arguments of a table over A/A studies."""

    studies: list[tuple[str, Path]]  # (label, folder), in the order given
    out: Path | None
    texts: list[str]  # the LABEL=DIR arguments as given, for the command line in the output

    def command(self, script: str) -> str:
        """The command that made the table, as run from the repository's root."""
        return f"python bench/studies/commit_cost/{script} {shlex.join(self.texts)}"


def study_args(prog: str, description: str, argv: list[str] | None, holds: str,
               present: Callable[[Path], bool]) -> StudyArgs | None:
    """Parse ``LABEL=DIR ... [--out FILE.md]``; None, after a one-line error naming ``holds`` (what
    each DIR must hold), where an argument is not LABEL=DIR or its folder fails ``present``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("studies", nargs="+", metavar="LABEL=DIR")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here (markdown)")
    args = parser.parse_args(argv)
    studies = []
    for text in args.studies:
        label, sep, folder = text.partition("=")
        if not sep or not present(Path(folder)):
            print(f"{prog}: {text!r}: expected LABEL=DIR with {holds}", file=sys.stderr)
            return None
        studies.append((label, Path(folder)))
    return StudyArgs(studies, args.out, list(args.studies))


def main(argv: list[str] | None = None) -> int:
    parsed = study_args("cv_compare", __doc__.split("\n")[0], argv, "DIR/spread.csv",
                        lambda folder: (folder / "spread.csv").is_file())
    if parsed is None:
        return 2
    studies = parsed.studies
    rows = [row(label, folder) for label, folder in studies]
    text = ("A/A coefficient of variation of each ratio to the ruler (95% chi-square interval)\n\n"
            + pd.DataFrame(rows).to_markdown(index=False) + "\n")
    if len(studies) > 1:
        first = _cv_and_runs(studies[0][1])
        tests = [f_row(label, folder, first) for label, folder in studies[1:]]
        text += (f"\nRelative variance against {studies[0][0]} (F = (cv / cv_first)^2, two-sided F-test)\n\n"
                 + pd.DataFrame(tests).to_markdown(index=False) + "\n")
    print(text)
    if parsed.out:
        parsed.out.write_text(f"`{parsed.command('cv_compare.py')}`\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
