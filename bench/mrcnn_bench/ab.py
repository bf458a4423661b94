"""``mrcnn-bench compare A B``: B against A, with a significance test, regressions flagged.

A and B are either two run files (compared as recorded; separate runs drift, so treat their
latency verdicts as indicative) or two pieces of code run live and interleaved in one run
(A B A B ..., order alternating): git refs (checked out into temporary worktrees), checkout
directories, or ``.`` for the working tree. Live is what the latency gate uses.

Latency: the ratio of medians B/A and :func:`mrcnn_bench.stats.compare_latency`'s verdict.
Deterministic metrics (compile counts, graph breaks, FLOPs) are compared exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from mrcnn_bench import stats, store
from mrcnn_bench.report import as_number

EXACT_METRICS = ("uncached_compile", "fallback_ops", "unique_graphs", "graph_breaks", "recompiles", "flops")
DEFAULT_COMPARE_CASES = "static/eager"
DEFAULT_COMPARE_ROUNDS = 25  # measured: see results/latency_gate (power against a 10% slowdown)


def compare_records(a: list[dict[str, Any]], b: list[dict[str, Any]], threshold: float | None = None,
                    paired: bool = True):
    """One line per case present in both: medians, ratio, p-value, verdict, and exact-metric changes.

    ``paired``: the timings come from one interleaved run (round i of A next to round i of B), so
    the paired rule applies; records of separate runs use the unpaired rule on equal-length samples.
    """
    kwargs: dict[str, Any] = {"rule": "paired" if paired else "unpaired"}
    if threshold is not None:
        kwargs["threshold"] = threshold
    by_case = {r["case"]: r for r in a if r["status"] == "ok"}
    lines = []
    for rb in b:
        ra = by_case.get(rb["case"])
        if ra is None or rb["status"] != "ok":
            continue
        n = min(len(ra["times_s"]), len(rb["times_s"]))
        verdict = stats.compare_latency(ra["times_s"][:n], rb["times_s"][:n], **kwargs)
        changed = []
        for m in EXACT_METRICS:
            va, vb = as_number(ra.get(m)), as_number(rb.get(m))
            if not (math.isnan(va) and math.isnan(vb)) and va != vb:
                changed.append(f"{m} {va:g} -> {vb:g}")
        lines.append({
            "case": rb["case"],
            "median_a_s": as_number(ra["median_s"]),
            "median_b_s": as_number(rb["median_s"]),
            "ratio_b_over_a": verdict.estimate,
            "ci95": f"{verdict.ci_low:.3f}-{verdict.ci_high:.3f}",
            "p_value": verdict.p_wilcoxon if paired else verdict.p_mannwhitney,
            "regression": verdict.regression,
            "verdict": describe(verdict),
            "exact_changes": "; ".join(changed),
        })
    return pd.DataFrame.from_records(lines)


def describe(v: stats.LatencyVerdict) -> str:
    """'B is 9.8% slower (ratio 1.098, 95% CI 1.07-1.12, Wilcoxon p=2e-06): REGRESSION beyond 5%'."""
    change = f"{abs(v.estimate - 1):.1%} {'slower' if v.estimate > 1 else 'faster'}"
    test = f"Wilcoxon p={v.p_wilcoxon:.2g}" if v.rule == "paired" else f"Mann-Whitney p={v.p_mannwhitney:.2g}"
    head = f"B is {change} (ratio {v.estimate:.3f}, 95% CI {v.ci_low:.3f}-{v.ci_high:.3f}, {test}, {v.rounds} rounds)"
    if v.regression:
        return f"{head}: REGRESSION beyond {v.threshold:.0%} at alpha {v.alpha:g}"
    return f"{head}: no regression beyond {v.threshold:.0%} at alpha {v.alpha:g}"


@contextlib.contextmanager
def checkout(spec: str) -> Iterator[str]:
    """A directory holding the code ``spec`` names: itself if a directory, else a git worktree of a ref."""
    path = Path(spec)
    if path.is_dir():
        if not (path / "mrcnn").is_dir():
            raise ValueError(f"{spec}: directory without an mrcnn/ package")
        yield str(path.resolve())
        return
    sha = store.git("rev-parse", "--verify", f"{spec}^{{commit}}")
    if sha is None:
        raise ValueError(f"{spec!r} is neither a run file, a checkout directory nor a git ref of {store.REPO}")
    with tempfile.TemporaryDirectory(prefix=f"mrcnn-ab-{sha[:8]}-") as tmp:
        subprocess.run(["git", "worktree", "add", "--detach", tmp, sha], cwd=store.REPO, check=True,
                       capture_output=True)
        try:
            yield tmp
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", tmp], cwd=store.REPO, capture_output=True)


def run_live(args: argparse.Namespace) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """Run A and B interleaved in one run (each in a worker importing its own code)."""
    from mrcnn_bench import runner
    from mrcnn_bench.cases import parse_cases
    from mrcnn_bench.cli import run_options

    cases = parse_cases(args.cases or DEFAULT_COMPARE_CASES)
    if args.rounds is None:
        args.rounds = DEFAULT_COMPARE_ROUNDS
    with checkout(args.a) as code_a, checkout(args.b) as code_b:
        va = runner.Variant("A", code_a, tuple(args.set_a))
        vb = runner.Variant("B", code_b, tuple(args.set_b))
        rows = [runner.Row(c, v) for c in cases for v in (va, vb)]
        opts = run_options(args, rows=rows)
        raw = runner.run(opts)
    env = store.environment(raw["threads"], opts.seed)
    doc = store.to_document(raw, "compare", env)
    recs = doc["records"]
    return [r for r in recs if r["variant"] == "A"], [r for r in recs if r["variant"] == "B"], doc


def main(args: argparse.Namespace) -> int:
    """Print the comparison; exit 1 when a regression is flagged."""
    files = [Path(x).suffix == ".json" for x in (args.a, args.b)]
    if all(files):
        recs_a, recs_b = store.load(args.a)["records"], store.load(args.b)["records"]
        doc = None
        print("A and B are separate runs: drift between runs is not cancelled (unpaired test); "
              "compare code live for a latency verdict.")
    elif any(files):
        raise ValueError("compare two run files, or two pieces of code (git refs / directories), not one of each")
    else:
        recs_a, recs_b, doc = run_live(args)
    table = compare_records(recs_a, recs_b, args.threshold, paired=doc is not None)
    if table.empty:
        raise ValueError("no case ran successfully in both A and B")
    print(table.to_markdown(index=False, floatfmt=".4g"))
    flagged = table[table["regression"]]
    for _, line in flagged.iterrows():
        print(f"REGRESSION {line['case']}: {line['verdict']}")
    if args.out:
        out = {"a": args.a, "b": args.b, "comparison": json.loads(table.to_json(orient="records")), "run": doc}
        Path(args.out).write_text(json.dumps(store._nan_to_none(out), indent=1, default=str) + "\n")
    return 1 if len(flagged) else 0
