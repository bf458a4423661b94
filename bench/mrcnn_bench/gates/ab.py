"""``mrcnn-bench compare A B``: B against A, slowdowns beyond a threshold flagged (Holm-corrected).

A and B are either two pieces of code run live: git refs (checked out into temporary worktrees),
checkout directories, or ``.`` for the working tree (what the latency gate uses); or two stored run
files. Live, they run as K pairs of fresh processes (:mod:`mrcnn_bench.gates.pairs`), each pair
timing A and B interleaved (A B, B A, ...), and the pair is the unit of the test
(:func:`mrcnn_bench.gates.stats.compare_pairs`); with one pair (``--pairs 1``) the rounds of that
one pair are the unit (:func:`mrcnn_bench.gates.stats.compare_latency`), blind to process levels.
Two run files are compared only when their settings match (:func:`check_comparable`; else
UsageError, exit 2), and through each row's per-round ratio to its own run's reference row
(torchvision eager, timed interleaved with it), which cancels drift between the runs; a run without
the reference row cannot be compared.

Latency: each case's p-value Holm-corrected across the cases of the comparison; every ratio comes
with its 95% interval and what it rests on (pairs, rounds), and a case with fewer than
:data:`~mrcnn_bench.gates.stats.MIN_SAMPLES` samples gets no ratio.
Deterministic metrics (compile counts, graph breaks, FLOPs) are compared exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from mrcnn_bench.base import defaults, timing, vcs
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.base.text import finite_or_none
from mrcnn_bench.gates import pairs as process_pairs
from mrcnn_bench.gates import stats
from mrcnn_bench.running import runner, store
from mrcnn_bench.running.cases import REFERENCE, Case, Variant
from mrcnn_bench.running.records import Record, RunDocument, as_number

EXACT_METRICS = ("uncached_compile", "fallback_ops", "unique_graphs", "graph_breaks", "recompiles", "flops")
MAX_PAIRS = 1000
# Must match across run files.
COMPARABLE = ("preset", "image_size", "batch_size", "overrides", "threads", "cpu", "subnormals")


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
    slowdown_a: float = 0.0  # extra inference work of A only (live; see mrcnn_bench.running.slowdown)
    slowdown_b: float = 0.0
    pairs: int = defaults.COMPARE_PAIRS  # live: process pairs (1: one process per side, per-round test)
    threshold: float | None = None  # relative slowdown that counts (None: the default of the test used)
    alpha: float = defaults.ALPHA  # family-wise error rate over the cases (Holm)
    between_run_sd: float = defaults.BETWEEN_RUN_SD  # run files only: the spread of levels between runs
    out: str | None = None  # write the comparison as JSON here

    def __post_init__(self) -> None:
        for label, slowdown in (("A", self.slowdown_a), ("B", self.slowdown_b)):
            if not 0.0 <= slowdown < 1.0:
                raise UsageError(f"the slowdown of {label} must be in [0, 1), got {slowdown}")
        if not 0.0 < self.alpha < 1.0:
            raise UsageError(f"alpha must be in (0, 1), got {self.alpha}")
        if not self.between_run_sd >= 0.0:
            raise UsageError(f"the between-run sd must be >= 0, got {self.between_run_sd}")
        if not 1 <= self.pairs <= MAX_PAIRS:
            raise UsageError(f"--pairs must be in [1, {MAX_PAIRS}], got {self.pairs}")


def are_run_files(a: str, b: str) -> bool:
    """True for two run files (.json), False for two pieces of code; ValueError for one of each."""
    files = [Path(x).suffix == ".json" for x in (a, b)]
    if any(files) and not all(files):
        raise UsageError("compare two run files, or two pieces of code (git refs / directories), not one of each")
    return all(files)


# ------------------------------------------------------------------------------------------------
# Two stored runs: comparable settings, and times relative to each run's reference row


def _one(values: set[str]) -> str:
    return next(iter(values)) if len(values) == 1 else " | ".join(sorted(values))


def settings(doc: RunDocument) -> dict[str, str]:
    """The settings of a run that must match for its timings to be compared with another's (:data:`COMPARABLE`)."""
    recs, run = doc.records, doc.run
    run_overrides = run.options.get("overrides") or {}  # a row's config: the run's, then its variant's
    overrides = {json.dumps({**run_overrides, **(r.variant_overrides or {})}, sort_keys=True, default=str)
                 for r in recs} or {json.dumps(run_overrides, sort_keys=True, default=str)}
    return {
        "preset": _one({r.preset for r in recs} | {run.workload.preset}),
        "image_size": _one({r.image_size for r in recs}),
        "batch_size": str(run.workload.batch_size),
        "overrides": _one(overrides),
        "threads": _one({str(r.env.get("threads")) for r in recs} | {str(run.threads)}),
        "cpu": _one({str(r.env.get("cpu")) for r in recs}),
        # Whether training steps flushed subnormal floats: it can change a step's time several-fold.
        "subnormals": (str(run.options.get("subnormals", "kept")) if any(r.phase == "training" for r in recs)
                       else "no training rows"),
    }


def check_comparable(doc_a: RunDocument, doc_b: RunDocument) -> None:
    """ValueError naming every setting (:data:`COMPARABLE`) in which the two runs differ."""
    sa, sb = settings(doc_a), settings(doc_b)
    diff = [f"{k} (A: {_differing(sa[k], sb[k])}; B: {_differing(sb[k], sa[k])})" for k in COMPARABLE if sa[k] != sb[k]]
    if diff:
        raise UsageError("the runs cannot be compared, their settings differ: " + ", ".join(diff))


def _differing(mine: str, other: str) -> str:
    """``mine``, or, for two JSON objects, only its entries that ``other`` lacks or sets otherwise."""
    try:
        a, b = json.loads(mine), json.loads(other)
    except ValueError:
        return mine
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return mine
    return json.dumps({k: v for k, v in a.items() if k not in b or b[k] != v}, sort_keys=True)


def relative_times(recs: list[Record], label: str) -> dict[str, list[float]]:
    """Per case, each round's time over the same round's time of the run's reference row.

    Training rows are divided by the same reference (torchvision eager inference): it is only the
    measure of the machine's speed in that round. ValueError when the run has no reference row.
    """
    ref = next((r for r in recs if r.case == REFERENCE and r.status == "ok" and r.times_s), None)
    if ref is None:
        raise UsageError(f"run {label} has no {REFERENCE} row with timings: two runs are compared through it")
    return {r.case: [t / t_ref for t, t_ref in zip(r.times_s, ref.times_s, strict=False)] for r in recs}


# ------------------------------------------------------------------------------------------------
# The table


def compare_records(a: list[Record], b: list[Record], threshold: float | None = None,
                    relative: bool = False, alpha: float = defaults.ALPHA,
                    between_run_sd: float = defaults.BETWEEN_RUN_SD) -> pd.DataFrame:
    """One line per case present in both: n, medians, ratio with its interval, Holm p, verdict, exact changes.

    ``relative=False``: A and B were timed interleaved in one run (round i of A next to round i of
    B; :func:`mrcnn_bench.gates.stats.compare_latency`). ``relative=True``: two stored runs, each row
    through its run's reference row (:func:`relative_times`), judged by
    :func:`mrcnn_bench.gates.stats.compare_stored` with ``between_run_sd``. ``p_value`` is Holm-adjusted
    over the cases that were tested.
    """
    threshold = defaults.THRESHOLD if threshold is None else threshold
    samples_a = relative_times(a, "A") if relative else {r.case: r.times_s for r in a}
    samples_b = relative_times(b, "B") if relative else {r.case: r.times_s for r in b}
    by_case = {r.case: r for r in a if r.status != "skipped"}
    lines, verdicts = [], []
    for rb in b:
        ra = by_case.get(rb.case)
        if ra is None or rb.status == "skipped":
            continue
        line, verdict = _line(ra, rb, samples_a[rb.case], samples_b[rb.case], threshold, alpha,
                              reference=relative and rb.case == REFERENCE,
                              between_run_sd=between_run_sd if relative else None)
        lines.append(line)
        verdicts.append(verdict)
    tested = [i for i, v in enumerate(verdicts) if v is not None]
    adjusted = stats.holm([verdicts[i].p_value for i in tested])
    for i, p in zip(tested, adjusted, strict=True):
        v = verdicts[i]
        lines[i].update(p_value=p, regression=bool(p < alpha), verdict=describe(v, p))
    return pd.DataFrame.from_records(lines)


def _line(ra: Record, rb: Record, ta: list[float], tb: list[float], threshold: float, alpha: float,
          reference: bool, between_run_sd: float | None) -> tuple[dict[str, Any], stats.LatencyVerdict | None]:
    """A case's line (verdict filled in later, once p is Holm-adjusted) and its verdict if it was tested.
    ``between_run_sd``: None for interleaved samples, else stored runs'
    (:func:`mrcnn_bench.gates.stats.compare_stored`)."""
    n = min(len(ta), len(tb))
    enough = n >= stats.MIN_SAMPLES
    line: dict[str, Any] = {
        "case": rb.case, "n": n,
        "median_a_s": as_number(ra.median_s) if enough else math.nan,
        "median_b_s": as_number(rb.median_s) if enough else math.nan,
        "ratio_b_over_a": math.nan, "ci95": "", "p_value": math.nan, "regression": False,
        "verdict": "", "exact_changes": exact_changes(ra, rb),
    }
    verdict = None
    if reference:
        line["verdict"] = "reference row: the two runs are compared through it"
    elif not enough:
        line["verdict"] = f"n={n}: too few samples"
    elif between_run_sd is not None:  # two stored runs: unpaired rounds, a level per process
        verdict = stats.compare_stored(ta, tb, between_run_sd, threshold=threshold, alpha=alpha)
        line.update(ratio_b_over_a=verdict.estimate, ci95=f"{verdict.ci_low:.3f}-{verdict.ci_high:.3f}")
    elif stats.min_p_value("paired", n) >= alpha:
        ratio, low, high = stats.paired_ratio_ci(ta[:n], tb[:n])
        line.update(ratio_b_over_a=ratio, ci95=f"{low:.3f}-{high:.3f}",
                    verdict=f"n={n}: too few rounds for a test at alpha {alpha:g}")
    else:
        verdict = stats.compare_latency(ta[:n], tb[:n], threshold=threshold, alpha=alpha)
        line.update(ratio_b_over_a=verdict.estimate, ci95=f"{verdict.ci_low:.3f}-{verdict.ci_high:.3f}")
    if rb.status != "ok" or ra.status != "ok":
        line["verdict"] = f"A {ra.status}, B {rb.status}" + (f"; {line['verdict']}" if line["verdict"] else "")
    return line, verdict


def exact_changes(ra: Record, rb: Record) -> str:
    """'unique_graphs 1 -> 2; ...': the deterministic metrics that differ."""
    changed = []
    for m in EXACT_METRICS:
        va, vb = as_number(getattr(ra, m)), as_number(getattr(rb, m))
        if not (math.isnan(va) and math.isnan(vb)) and va != vb:
            changed.append(f"{m} {va:g} -> {vb:g}")
    return "; ".join(changed)


def describe(v: stats.LatencyVerdict, p_holm: float) -> str:
    """'B is 9.8% slower (ratio 1.098, 95% CI 1.07-1.12, n=25, Holm p=2e-06): REGRESSION beyond 5%'."""
    change = f"{abs(v.estimate - 1):.1%} {'slower' if v.estimate > 1 else 'faster'}"
    beyond = f"{v.threshold:.1%}".replace(".0%", "%")
    if v.rule == "stored":
        test, n = f"z-test against {beyond} slower, between-run sd {v.between_run_sd:.3f}", f"n={v.rounds}"
    elif v.rule == "pairs":
        test = (f"t-test across pairs against {beyond} slower; between-process sd {v.process_sd:.3f}, "
                f"round sd {v.round_sd:.3f}")
        n = f"{v.pairs} process pairs x {v.rounds} rounds"
    else:
        test, n = f"Wilcoxon against {beyond} slower, one process per side", f"n={v.rounds}"
    head = (f"B is {change} (ratio {v.estimate:.3f}, 95% CI {v.ci_low:.3f}-{v.ci_high:.3f}, {n}, "
            f"p={p_holm:.2g} Holm-adjusted, {test})")
    if p_holm < v.alpha:
        return f"{head}: REGRESSION beyond {beyond} at alpha {v.alpha:g}"
    return f"{head}: no regression beyond {beyond} shown at alpha {v.alpha:g}"


# ------------------------------------------------------------------------------------------------
# Live: two pieces of code, in process pairs (each pair one interleaved run)


@contextlib.contextmanager
def checkout(spec: str) -> Iterator[str]:
    """A directory holding the code ``spec`` names: itself if a directory, else a git worktree of a ref."""
    path = Path(spec)
    if path.is_dir():
        if not (path / "mrcnn").is_dir():
            raise UsageError(f"{spec}: directory without an mrcnn/ package")
        yield str(path.resolve())
        return
    sha = vcs.commit_of(store.REPO, spec)
    if sha is None:
        raise UsageError(f"{spec!r} is neither a run file, a checkout directory nor a git ref of {store.REPO}")
    with tempfile.TemporaryDirectory(prefix=f"mrcnn-ab-{sha[:8]}-") as tmp:
        vcs.run(store.REPO, "worktree", "add", "--detach", tmp, sha)
        try:
            yield tmp
        finally:
            vcs.run(store.REPO, "worktree", "remove", "--force", tmp, check=False)


def run_live(opts: CompareOptions) -> list[process_pairs.Pair]:
    """Run A and B as ``opts.pairs`` pairs of processes (each worker importing its own code)."""
    if opts.run is None:
        raise ValueError("a live comparison needs run options")
    if opts.pairs > 1 and opts.run.rounds % 2:
        raise UsageError(f"--rounds must be even with --pairs above 1 (each side first in half), got {opts.run.rounds}")
    with checkout(opts.a) as code_a, checkout(opts.b) as code_b:
        va = Variant("A", code_a, opts.overrides_a, opts.slowdown_a)
        vb = Variant("B", code_b, opts.overrides_b, opts.slowdown_b)
        return process_pairs.run_pairs(opts.run, opts.cases, (va, vb), opts.pairs)


def live_table(pairs: list[process_pairs.Pair], threshold: float | None, alpha: float) -> pd.DataFrame:
    """The table of a live comparison: across pairs, or, for one pair, across its rounds."""
    if len(pairs) == 1:
        return compare_records(pairs[0].a, pairs[0].b, threshold, alpha=alpha)
    return pairs_table(pairs, defaults.PAIR_THRESHOLD if threshold is None else threshold, alpha)


def pairs_table(pairs: list[process_pairs.Pair], threshold: float, alpha: float) -> pd.DataFrame:
    """One line per case: :func:`mrcnn_bench.gates.stats.compare_pairs`'s verdict, Holm-adjusted over
    the cases, with the noise this comparison measured (``process_sd``, ``round_sd``). A case that
    failed on either side in any pair is not tested, and its line names the pairs."""
    lines, verdicts = [], []
    for case in dict.fromkeys(r.case for r in pairs[0].b if r.status != "skipped"):
        sides = [(_record(p.a, case), _record(p.b, case)) for p in pairs]
        ra, rb = sides[0]
        line: dict[str, Any] = {
            "case": case, "pairs": len(pairs), "n": min(min(len(a.times_s), len(b.times_s)) for a, b in sides),
            "median_a_s": as_number(ra.median_s), "median_b_s": as_number(rb.median_s),
            "ratio_b_over_a": math.nan, "ci95": "", "p_value": math.nan, "regression": False, "verdict": "",
            "process_sd": math.nan, "round_sd": math.nan, "exact_changes": exact_changes(ra, rb),
        }
        failed = [f"pair {k + 1}: A {a.status}, B {b.status}" for k, (a, b) in enumerate(sides)
                  if a.status != "ok" or b.status != "ok"]
        verdict = None
        if failed:
            line["verdict"] = "; ".join(failed)
        elif line["n"] < 2 or len(pairs) < stats.MIN_PAIRS:
            line["verdict"] = (f"{len(pairs)} pairs of {line['n']} rounds: too few for a test across pairs "
                               f"(at least {stats.MIN_PAIRS} pairs of 2 rounds)")
        else:
            verdict = stats.compare_pairs([a.times_s for a, _ in sides], [b.times_s for _, b in sides],
                                          [p.a_first for p in pairs], threshold=threshold, alpha=alpha)
            # Medians over every pair's rounds: one pair's would carry its two processes' levels.
            line.update(ratio_b_over_a=verdict.estimate, ci95=f"{verdict.ci_low:.3f}-{verdict.ci_high:.3f}",
                        process_sd=verdict.process_sd, round_sd=verdict.round_sd, median_a_s=verdict.median_a,
                        median_b_s=verdict.median_b)
        lines.append(line)
        verdicts.append(verdict)
    tested = [i for i, v in enumerate(verdicts) if v is not None]
    for i, p in zip(tested, stats.holm([verdicts[i].p_value for i in tested]), strict=True):
        lines[i].update(p_value=p, regression=bool(p < alpha), verdict=describe(verdicts[i], p))
    return pd.DataFrame.from_records(lines)


def _record(records: list[Record], case: str) -> Record:
    found = next((r for r in records if r.case == case), None)
    if found is None:  # every pair runs the same rows: a missing one is a bug, not an input
        raise ValueError(f"{case}: missing from a pair's records")
    return found


def design_line(opts: CompareOptions, pairs: int, seconds: float) -> str:
    """What the live verdict rests on: pairs, rounds, the test, and the noise model the defaults were sized on."""
    rounds = opts.run.rounds if opts.run else 0
    if pairs == 1:
        return (f"1 pair of processes x {rounds} rounds, {seconds:.0f} s: the rounds are the unit, so each side's "
                "process level is in the ratio but not in its interval (--pairs 2 or more to include it)")
    return (f"{pairs} pairs of processes x {rounds} rounds, {seconds:.0f} s; the pair is the unit "
            f"({defaults.PAIR_TEST}). The defaults ({defaults.COMPARE_PAIRS} pairs x {defaults.COMPARE_ROUNDS} "
            f"rounds, threshold {defaults.PAIR_THRESHOLD:.0%}) were sized on a between-process sd of "
            f"{defaults.PROCESS_SD} and a round sd of {defaults.ROUND_SD} (results/compare_pairs/design.md); "
            "this comparison's own are in its table.")


def pair_timings(pairs: list[process_pairs.Pair]) -> list[dict[str, Any]]:
    """Every pair's start order, seconds and per-row timings: what the verdict can be recomputed from."""
    return [{"a_first": p.a_first, "seconds": p.seconds,
             "rows": {r.row: {"status": r.status, "times_s": r.times_s} for r in p.doc.records}} for p in pairs]


def compare(opts: CompareOptions) -> int:
    """Print the comparison; -> 1 when a regression is flagged, else 2 when a case could not be
    tested (an error, too few samples), else 0 (ValueError: cannot be compared)."""
    doc: RunDocument | None = None
    pairs: list[process_pairs.Pair] = []
    if are_run_files(opts.a, opts.b):
        doc_a, doc_b = store.load(opts.a), store.load(opts.b)
        check_comparable(doc_a, doc_b)
        recs_a, recs_b = doc_a.records, doc_b.records
        print(f"A and B are separate runs: each row is compared through its per-round ratio to its own run's "
              f"{REFERENCE} (drift between the runs cancels), and the runs' mean log ratios by a z-test that "
              f"allows for a between-run sd of {opts.between_run_sd:g} (--between-run-sd): each process settles "
              "at a level of its own, so only a slowdown well beyond the threshold can be told from it. "
              "To gate, compare the two pieces of code live.")
        table = compare_records(recs_a, recs_b, opts.threshold, relative=True, alpha=opts.alpha,
                                between_run_sd=opts.between_run_sd)
    else:
        clock = timing.Stopwatch()
        pairs = run_live(opts)
        doc = pairs[0].doc
        table = live_table(pairs, opts.threshold, opts.alpha)
        print(design_line(opts, len(pairs), clock.elapsed()))
    if table.empty:
        raise UsageError("no case ran in both A and B")
    print(table.to_markdown(index=False, floatfmt=".4g"))
    flagged = table[table["regression"]]
    for _, line in flagged.iterrows():
        print(f"REGRESSION {line['case']}: {line['verdict']}")
    # A case that errored on either side, or ran too few rounds to test, decides nothing: exit 2.
    # (Two stored runs are compared through their reference row, which is never tested itself.)
    reference = table["case"].eq(REFERENCE) & (doc is None)
    untested = table[table["p_value"].isna() & ~reference]
    for _, line in untested.iterrows():
        print(f"NOT DECIDED {line['case']}: {line['verdict']}", file=sys.stderr)
    if opts.out:
        out = {"a": opts.a, "b": opts.b, "comparison": json.loads(table.to_json(orient="records")),
               "run": doc.to_dict() if doc is not None else None,
               # Every pair's timings, to recompute the verdict; "run" is the first pair's whole run.
               "pairs": pair_timings(pairs)}
        atomic_write(opts.out, json.dumps(finite_or_none(out), indent=1, default=str) + "\n")
    return 1 if len(flagged) else 2 if len(untested) else 0
