"""``mrcnn-bench compare A B``: B against A, with a significance test, regressions flagged.

A and B are either two run files (compared as recorded; separate runs drift, so treat their
latency verdicts as indicative) or two pieces of code run live and interleaved in one run
(A B A B ..., order alternating): git refs (checked out into temporary worktrees), checkout
directories, or ``.`` for the working tree. Live is what the latency gate uses.

Latency: the ratio of medians B/A and :func:`mrcnn_bench.stats.compare_latency`'s verdict.
Deterministic metrics (compile counts, graph breaks, FLOPs) are compared exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from mrcnn_bench import runner, stats, store
from mrcnn_bench.cases import Case, Row, Variant
from mrcnn_bench.records import Record, RunDocument, to_document
from mrcnn_bench.report import as_number

EXACT_METRICS = ("uncached_compile", "fallback_ops", "unique_graphs", "graph_breaks", "recompiles", "flops")
DEFAULT_COMPARE_CASES = "static/eager"
DEFAULT_COMPARE_ROUNDS = 25  # measured: see results/latency_gate (power against a 10% slowdown)


@dataclass
class CompareOptions:
    """``compare A B``: two run files, or two pieces of code (git refs, checkout directories) run live.

    ``run`` is what a live comparison runs (its ``rows`` are replaced by ``cases`` x (A, B)); it is
    unused, and may be None, for run files.
    """

    a: str
    b: str
    cases: list[Case] = dataclasses.field(default_factory=list)
    run: runner.RunOptions | None = None
    overrides_a: tuple[tuple[str, Any], ...] = ()  # config overrides of A only (live)
    overrides_b: tuple[tuple[str, Any], ...] = ()
    slowdown_a: float = 0.0  # extra inference work of A only (live; see mrcnn_bench.slowdown)
    slowdown_b: float = 0.0
    threshold: float | None = None  # relative slowdown that counts (None: the stats module's default)
    out: str | None = None  # write the comparison as JSON here

    def __post_init__(self) -> None:
        for label, slowdown in (("A", self.slowdown_a), ("B", self.slowdown_b)):
            if not 0.0 <= slowdown < 1.0:
                raise ValueError(f"the slowdown of {label} must be in [0, 1), got {slowdown}")


def are_run_files(a: str, b: str) -> bool:
    """True for two run files (.json), False for two pieces of code; ValueError for one of each."""
    files = [Path(x).suffix == ".json" for x in (a, b)]
    if any(files) and not all(files):
        raise ValueError("compare two run files, or two pieces of code (git refs / directories), not one of each")
    return all(files)


def compare_records(a: list[Record], b: list[Record], threshold: float | None = None,
                    paired: bool = True) -> pd.DataFrame:
    """One line per case present in both: medians, ratio, p-value, verdict, and exact-metric changes.

    ``paired``: the timings come from one interleaved run (round i of A next to round i of B), so
    the paired rule applies; records of separate runs use the unpaired rule on equal-length samples.
    """
    kwargs: dict[str, Any] = {"rule": "paired" if paired else "unpaired"}
    if threshold is not None:
        kwargs["threshold"] = threshold
    by_case = {r.case: r for r in a if r.status == "ok"}
    lines = []
    for rb in b:
        ra = by_case.get(rb.case)
        if ra is None or rb.status != "ok":
            continue
        n = min(len(ra.times_s), len(rb.times_s))
        verdict = stats.compare_latency(ra.times_s[:n], rb.times_s[:n], **kwargs)
        changed = []
        for m in EXACT_METRICS:
            va, vb = as_number(getattr(ra, m)), as_number(getattr(rb, m))
            if not (math.isnan(va) and math.isnan(vb)) and va != vb:
                changed.append(f"{m} {va:g} -> {vb:g}")
        lines.append({
            "case": rb.case,
            "median_a_s": as_number(ra.median_s),
            "median_b_s": as_number(rb.median_s),
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


def run_live(opts: CompareOptions) -> tuple[list[Record], list[Record], RunDocument]:
    """Run A and B interleaved in one run (each in a worker importing its own code)."""
    if opts.run is None:
        raise ValueError("a live comparison needs run options")
    with checkout(opts.a) as code_a, checkout(opts.b) as code_b:
        va = Variant("A", code_a, opts.overrides_a, opts.slowdown_a)
        vb = Variant("B", code_b, opts.overrides_b, opts.slowdown_b)
        rows = [Row(c, v) for c in opts.cases for v in (va, vb)]
        out = runner.run(dataclasses.replace(opts.run, rows=rows))
    doc = to_document(out.rows, out.info, "compare", store.environment(out.info.threads, opts.run.seed))
    recs = doc.records
    return [r for r in recs if r.variant == "A"], [r for r in recs if r.variant == "B"], doc


def compare(opts: CompareOptions) -> int:
    """Print the comparison; exit 1 when a regression is flagged."""
    doc: RunDocument | None = None
    if are_run_files(opts.a, opts.b):
        recs_a, recs_b = store.load(opts.a).records, store.load(opts.b).records
        print("A and B are separate runs: drift between runs is not cancelled (unpaired test); "
              "compare code live for a latency verdict.")
    else:
        recs_a, recs_b, doc = run_live(opts)
    table = compare_records(recs_a, recs_b, opts.threshold, paired=doc is not None)
    if table.empty:
        raise ValueError("no case ran successfully in both A and B")
    print(table.to_markdown(index=False, floatfmt=".4g"))
    flagged = table[table["regression"]]
    for _, line in flagged.iterrows():
        print(f"REGRESSION {line['case']}: {line['verdict']}")
    if opts.out:
        out = {"a": opts.a, "b": opts.b, "comparison": json.loads(table.to_json(orient="records")),
               "run": doc.to_dict() if doc is not None else None}
        Path(opts.out).write_text(json.dumps(store.nan_to_none(out), indent=1, default=str) + "\n")
    return 1 if len(flagged) else 0
