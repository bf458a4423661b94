"""Where the unit tests' time goes, and what a change saved: two pytest JUnit XML files side by side.

    python bench/studies/ci_time/suite_durations.py BEFORE.xml AFTER.xml [--top 25] [--out FILE.md]

Each file is one whole ``pytest --junitxml`` run (tests/), on the same host. The table gives the
suite's wall time (pytest's own), then the seconds per module and the slowest tests of BEFORE,
each with AFTER's seconds (setup and teardown included: a module fixture's cost is its first
test's). A test absent from one run shows blank there.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd


def read_junit(path: Path) -> tuple[float, pd.DataFrame]:
    """(the suite's seconds, a frame of module, test, seconds, outcome) from a pytest JUnit XML file."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise SystemExit(f"suite_durations: cannot read {path}: {e}") from None
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise SystemExit(f"suite_durations: {path} has no <testsuite>: not a pytest JUnit XML file")
    rows = []
    for case in suite.iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        rows.append({"module": case.get("classname", ""), "test": case.get("name", ""),
                     "seconds": float(case.get("time", "nan")), "outcome": outcome})
    return float(suite.get("time", "nan")), pd.DataFrame(rows)


def table(before: Path, after: Path, top: int) -> str:
    wall_b, b = read_junit(before)
    wall_a, a = read_junit(after)
    out = [f"| | {before.name} | {after.name} |", "| --- | --- | --- |",
           f"| suite's wall time (s) | {wall_b:.0f} | {wall_a:.0f} |",
           f"| tests | {len(b)} | {len(a)} |"]
    for outcome in ("failure", "error", "skipped"):
        out.append(f"| {outcome} | {int((b.outcome == outcome).sum())} | {int((a.outcome == outcome).sum())} |")
    modules = pd.concat({"before": b.groupby("module").seconds.sum(), "after": a.groupby("module").seconds.sum()},
                        axis=1).sort_values("before", ascending=False)
    out += ["", f"Seconds per module, the {top} slowest of {before.name}:", "",
            f"| module | {before.name} | {after.name} |", "| --- | --- | --- |"]
    out += [f"| {m} | {r.before:.1f} | {'' if pd.isna(r.after) else f'{r.after:.1f}'} |"
            for m, r in modules.head(top).iterrows()]
    tests = b.merge(a, on=["module", "test"], how="left", suffixes=("_b", "_a")).nlargest(top, "seconds_b")
    out += ["", f"The {top} slowest tests of {before.name}:", "",
            f"| test | {before.name} | {after.name} |", "| --- | --- | --- |"]
    out += [f"| {r.module}::{r.test} | {r.seconds_b:.1f} | {'' if pd.isna(r.seconds_a) else f'{r.seconds_a:.1f}'} |"
            for r in tests.itertuples()]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", type=Path, help="write the table here too")
    args = p.parse_args(argv)
    text = table(args.before, args.after, args.top)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
