"""Reports from records: the comparison table (markdown, CSV, HTML via pandas), plots, the dashboard.

The table is one line per row: latency (the number ``n`` of timed calls, median, IQR, the 90th and
99th percentiles, ratio to torchvision eager; none of them from fewer than ``MIN_SAMPLES`` calls,
and a percentile only from enough calls to reach it: :data:`TAIL_MIN_SAMPLES`), time to first
result, one cold pass over the run's images (:func:`first_pass`) and compile time, compile counts
and graph breaks, training throughput, GFLOP/s as a
fraction of the machine's peak, peak memory, parity with torchvision, and the project's speed goal for
that row with its verdict; :data:`COLUMNS` explains each column, under the table. Under it, a summary
by backend and compiler: the geometric mean of the rows' ratios to torchvision eager
(:func:`geomean_frame`), as TorchInductor's dashboard summarises. The HTML page shows the table with
short headers (:data:`COLUMNS`), so that every column fits a 1400 px window.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import gmean

from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.gates.goals import target_verdict
from mrcnn_bench.gates.row_stats import interval_text, median, paired_ratio, useful_fraction
from mrcnn_bench.gates.stats import MIN_SAMPLES
from mrcnn_bench.reports.run_notes import images_text, notes
from mrcnn_bench.running.cases import REFERENCE, TRAIN_REFERENCE
from mrcnn_bench.running.records import Record, RunDocument, as_number
from mrcnn_bench.running.stages import STAGE_KEYS

# Every column of the table: (the HTML page's short header, what it means). The notes list them all.
COLUMNS: dict[str, tuple[str, str]] = {
    "row": ("row", "the case: implementation/backend-compiler-precision (train: a training step), and its variant"),
    "status": ("status", "ok; skipped (backend absent here); timeout (a bounded row past its time limit: "
                         "'> limit' with the counts it reached); error"),
    "n": ("n", "timed calls (one per round) behind the statistics; fewer than 3: no median"),
    "median_s": ("median s", "steady state: median seconds per call over the rounds, after the warm-up (inference: "
                             "images in, detections out, resize and mask paste included; training: one SGD step)"),
    "iqr_s": ("IQR s", "interquartile range of those calls"),
    "p90_s": ("p90 s", "90th percentile of those calls, from 10 calls or more"),
    "p99_s": ("p99 s", "99th percentile, from 100 calls or more"),
    "ratio_vs_tv": ("x tv", "median per-round ratio to torchvision eager in this run (training: to its step; rows "
                            "without paired rounds: ratio of the medians); lower is faster"),
    "ratio_ci95": ("95% CI", "95% bootstrap interval of the per-round ratio to torchvision"),
    "images_per_s": ("img/s", "images per call over the median"),
    "first_result_s": ("first call s", "the first call, compilation included"),
    "first_pass_s": ("cold pass s", "one cold pass over the run's distinct images (the warm-up before round 1: "
                                    "every image of a stream once), compilation for each new shape included; "
                                    "training: the first step; blank in run files from before it was recorded"),
    "compile_s": ("compile s", "compile time the backend's own counters report during the warm-up"),
    "compiles": ("compiles", "XLA compilations and fallback ops; dynamo graphs, graph breaks and recompiles; "
                             "'+n in rounds': what compiled after the warm-up (0 for a static graph)"),
    "gflops_s": ("GFLOP/s", "FLOPs of one eager call over the median"),
    "frac_peak": ("of peak", "GFLOP/s as a fraction of the machine's ceiling (below)"),
    "useful_peak": ("useful", "the same on useful work: torchvision eager's FLOPs for the same images (its "
                              "training step's, for training rows) over this row's median, so that the static "
                              "graph's padding and empty slots count as waste"),
    "peak_mem_gb": ("mem GB", "peak memory during the row's calls (CPU: resident set; CUDA: allocated)"),
    "box_ap": ("box AP", "COCO box AP with --eval (pycocotools)"),
    "mask_ap": ("mask AP", "COCO mask AP with --eval"),
    "parity": ("parity", "detections matched with torchvision eager's on the same images, both ways, and the mean "
                         "mask IoU"),
    "target": ("target", "the project's speed goal for the row and whether this run met it (below)"),
}
TABLE_COLUMNS = list(COLUMNS)
# HTML: text columns that wrap within a width, so that the table fits 1400 px.
_WRAPPED = {"status": "7em", "median_s": "4em", "ratio_ci95": "5em", "compiles": "8em",
            "parity": "7em", "target": "9.5em"}


# A q-quantile is reported only from at least 1 / (1 - q) timed calls: with fewer, no sample lies
# above it and the "percentile" is an interpolation towards the maximum.
TAIL_MIN_SAMPLES = {0.90: 10, 0.99: 100}


def tail(rec: Record, q: float) -> float:
    """The ``q`` quantile of the record's timed calls (linear interpolation); NaN from too few calls."""
    if len(rec.times_s) < TAIL_MIN_SAMPLES[q]:
        return math.nan
    return float(np.quantile(rec.times_s, q))


def too_few(rec: Record) -> str:
    """'n=1: too few samples' for a row timed fewer than :data:`MIN_SAMPLES` times but at least once, else ''."""
    n = len(rec.times_s)
    return f"n={n}: too few samples" if 0 < n < MIN_SAMPLES else ""


def first_pass(rec: Record) -> float:
    """Seconds of one cold pass over the run's distinct inputs, compilation included
    (:func:`mrcnn_bench.running.records.first_pass_seconds`); NaN for run files from before it was recorded."""
    return as_number(getattr(rec, "first_pass_s", math.nan))


def compiles_text(rec: Record) -> str:
    """'graphs=1 breaks=0 recompiles=0' (dynamo) or 'compiles=1 fallbacks=0' (XLA), plus what the rounds added."""
    if rec.backend == "xla" and not math.isnan(as_number(rec.uncached_compile)):
        extra = as_number(rec.uncached_compile_rounds)
        return (f"compiles={rec.uncached_compile:.0f} (+{0 if math.isnan(extra) else extra:.0f} in rounds), "
                f"fallbacks={as_number(rec.fallback_ops):.0f}")
    if rec.compiler == "inductor" and not math.isnan(as_number(rec.unique_graphs)):
        extra = as_number(rec.unique_graphs_rounds)
        return (f"graphs={rec.unique_graphs:.0f} breaks={rec.graph_breaks:.0f} "
                f"recompiles={as_number(rec.recompiles):.0f} "
                f"(+{0 if math.isnan(extra) else extra:.0f} graphs in rounds)")
    return ""


def table_frame(records: list[Record], overrides: dict[str, Any] | None = None) -> pd.DataFrame:
    """The comparison table of one run (one variant), numbers unformatted, in :data:`TABLE_COLUMNS`;
    ``overrides``: the run's config overrides, which choose the goals of its workload."""
    medians = {r.case: median(r) for r in records}
    by_case = {r.case: r for r in records}
    rows = []
    for r in records:
        ref = TRAIN_REFERENCE if r.phase == "training" else REFERENCE
        ref_med, med = medians.get(ref, math.nan), median(r)
        measured = 1.0 if med == med else math.nan  # NaN: hides what a median of too few calls gave
        parity = ""
        if not math.isnan(as_number(r.parity_matched_ref)):
            parity = (f"{r.parity_matched_ref:.1%} / {r.parity_matched_other:.1%}, "
                      f"mask IoU {as_number(r.mask_iou_mean):.3f}")
        paired = paired_ratio(r, by_case.get(ref))
        rows.append({
            "row": r.row,
            "status": r.status + (f": {r.detail}" if r.detail else ""),
            "n": len(r.times_s),
            "median_s": med,
            "iqr_s": as_number(r.iqr_s) * measured,
            "p90_s": tail(r, 0.90),
            "p99_s": tail(r, 0.99),
            "ratio_vs_tv": paired[0] if paired else med / ref_med,
            "ratio_ci95": interval_text(paired[1:] if paired else None),
            "images_per_s": as_number(r.images_per_s) * measured,
            "first_result_s": as_number(r.first_result_s),
            "first_pass_s": first_pass(r),
            "compile_s": as_number(r.compile_s),
            "compiles": compiles_text(r),
            "gflops_s": as_number(r.gflops_s) * measured,
            "frac_peak": as_number(r.frac_peak) * measured,
            "useful_peak": useful_fraction(r, by_case.get(ref)),
            "peak_mem_gb": as_number(r.peak_mem_gb),
            "box_ap": as_number(r.box_ap),
            "mask_ap": as_number(r.mask_ap),
            "parity": parity,
            "target": target_verdict(r, by_case, overrides),
        })
    return pd.DataFrame.from_records(rows, columns=TABLE_COLUMNS)


GEOMEAN_KEYS = ["phase", "backend", "compiler", "precision"]


def geomean_frame(groups: list[list[Record]]) -> pd.DataFrame:
    """Per phase, backend, compiler and precision: the geometric mean of the rows' ratios to torchvision
    (eager; its training step for training rows) over every row measured, with how many rows it rests on.

    ``groups``: records that share a reference (one run, or one variant of a comparison); each row's
    ratio is taken within its group. The reference rows (ratio 1 by definition) are left out.
    """
    lines = []
    for group in groups:
        table = table_frame(group).set_index("row")
        for rec in group:
            ratio = as_number(table.loc[rec.row, "ratio_vs_tv"])
            if rec.case in (REFERENCE, TRAIN_REFERENCE) or not ratio > 0:
                continue
            lines.append({"phase": rec.phase, "backend": rec.backend, "compiler": rec.compiler,
                          "precision": rec.precision, "row": rec.row, "ratio": ratio})
    if not lines:
        return pd.DataFrame(columns=[*GEOMEAN_KEYS, "geomean_ratio_vs_tv", "rows", "of"])
    df = pd.DataFrame.from_records(lines)
    summary = df.groupby(GEOMEAN_KEYS, sort=False).agg(
        geomean_ratio_vs_tv=("ratio", gmean), rows=("ratio", "size"), of=("row", lambda r: ", ".join(dict.fromkeys(r))))
    return summary.reset_index()


GEOMEAN_TITLE = ("By backend and compiler: geometric mean of the rows' ratios to torchvision (lower is faster; "
                 "``rows``: how many it rests on)")


def _fmt(x: Any, digits: int = 3) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return ""
        return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:.0f}"
    return str(x)


def shown_frame(doc: RunDocument) -> pd.DataFrame:
    """:func:`table_frame` formatted for people: "> limit s" for rows stopped at the time limit."""
    df = table_frame(doc.records, doc.run.overrides).astype(object)
    for col in ("median_s", "iqr_s", "p90_s", "p99_s", "ratio_vs_tv", "images_per_s", "first_result_s", "first_pass_s",
                "compile_s", "gflops_s", "frac_peak", "useful_peak", "peak_mem_gb", "box_ap", "mask_ap"):
        df[col] = [_fmt(v) for v in df[col]]
    limit = doc.run.limit_s
    for i, r in enumerate(doc.records):
        if r.status == "timeout" and not r.times_s:
            df.loc[i, "median_s"] = f"> {limit:g} s"
        elif too_few(r):
            df.loc[i, "median_s"] = too_few(r)
    return df


def column_notes() -> list[str]:
    """One line per column of the table: its name (the HTML page's header) and what it means."""
    return [f"{name}" + (f" ({short})" if short != name else "") + f": {meaning}"
            for name, (short, meaning) in COLUMNS.items()]


def stage_frame(doc: RunDocument) -> pd.DataFrame | None:
    """``--profile``'s stages: seconds per implementation, the static model's share, and where the run
    counted them, GFLOP per call and the fraction of the fp32 ceiling each stage runs at, and the
    aten operators it dispatches and the MB they write (:mod:`mrcnn_bench.running.work_counters`)."""
    stages = doc.run.stages
    if not stages:
        return None
    df = pd.DataFrame({f"{impl}_s": times for impl, times in stages.items()})
    df.index.name = "stage (eager fp32, CPU, median of 3, interleaved)"
    if "static_s" in df:
        df["static_share"] = df["static_s"] / df["static_s"].iloc[-1]
    ceiling = None if doc.run.ceiling.get("unreliable") else doc.run.ceiling.get("fp32_gflops")
    for impl, flops in doc.run.stage_flops.items():
        gflop = pd.Series(flops) / 1e9
        df[f"{impl}_gflop"] = gflop
        if ceiling and f"{impl}_s" in df:
            df[f"{impl}_frac_ceiling"] = gflop / df[f"{impl}_s"] / ceiling
    for impl, work in doc.run.stage_work.items():
        keys = [STAGE_KEYS.get(label) for label in df.index]
        df[f"{impl}_ops"] = pd.Series([_work_count(work, key, "ops") for key in keys], index=df.index)
        df[f"{impl}_mb_written"] = pd.Series([_work_count(work, key, "bytes") / 1e6 for key in keys], index=df.index)
    return df.reset_index()


def _work_count(work: Any, key: str | None, counter: str) -> float:
    """One count of a run file's ``stage_work`` (impl's part): NaN where it has none."""
    stage = work.get(key) if isinstance(work, dict) and key is not None else None
    value = stage.get(counter) if isinstance(stage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else as_number(value)


def markdown(doc: RunDocument) -> str:
    """The table, the notes under it, the stage timings and dynamo's reasons, as markdown."""
    parts = [f"Workload: {doc.run.workload.label}.", "", shown_frame(doc).to_markdown(index=False), "", *notes(doc),
             "", "Columns:", "", *(f"- {line}" for line in column_notes())]
    summary = geomean_frame([doc.records])
    if len(summary):
        parts += ["", GEOMEAN_TITLE.replace("``", "`") + ":", "", summary.to_markdown(index=False, floatfmt=".3f")]
    stages = stage_frame(doc)
    if stages is not None:
        parts += ["", stages.to_markdown(index=False, floatfmt=".3f")]
    reasons = _reasons_md(doc)
    if reasons:
        parts += ["", "Graph breaks and recompiles (dynamo's reasons):", "", reasons]
    return "\n".join(parts)


def _reasons_md(doc: RunDocument, limit: int = 12) -> str:
    """Dynamo's graph-break and recompile reasons per row, as it recorded them (``limit`` per kind)."""
    lines = []
    for r in doc.records:
        reasons = r.reasons or {}
        for kind in ("graph_breaks", "recompiles"):
            texts = reasons.get(kind, [])
            lines += [f"- {r.row}: {kind.replace('_', ' ')[:-1]}: {' '.join(t.split())}" for t in texts[:limit]]
            if len(texts) > limit:
                lines.append(f"- {r.row}: ... {len(texts) - limit} more {kind.replace('_', ' ')}")
    return "\n".join(lines)


def html_page(doc: RunDocument, plots: list[Path] | None = None) -> str:
    """A self-contained HTML report: styled table, notes, plots, graph-break/recompile reasons."""
    df = shown_frame(doc)

    def colour(v: str) -> str:
        if isinstance(v, str) and (v.startswith(("timeout", "error")) or "missed" in v or "FAILED" in v):
            return "background-color: #fde2e1"
        if isinstance(v, str) and (v.startswith("skipped")):
            return "color: #888"
        if isinstance(v, str) and ": met" in v:
            return "background-color: #e3f6e3"
        return ""

    df = df.rename(columns={name: short for name, (short, _) in COLUMNS.items()})
    # Every cell escaped: row names, error texts and notes come from run files, which may come from anyone.
    styled = df.style.format(escape="html").map(colour, subset=["status", "target"]).hide(axis="index")
    wrap = "white-space:normal;overflow-wrap:anywhere"
    wrapped = {COLUMNS[c][0]: [{"selector": "td", "props": f"min-width:{width};{wrap}"}]
               for c, width in _WRAPPED.items()}
    styled = styled.set_table_styles(wrapped, overwrite=False)
    table = styled.set_table_attributes('class="results"').to_html()
    legend = "".join(f"<dt>{html.escape(short)}</dt><dd>{html.escape(meaning)}"
                     + (f" (<code>{name}</code> in the CSV)" if short != name else "") + "</dd>"
                     for name, (short, meaning) in COLUMNS.items())
    imgs = "".join(f'<figure><img src="{html.escape(p.name)}" alt="{html.escape(p.stem)}"></figure>'
                   for p in plots or [])
    reasons = _reasons_md(doc)
    reasons_html = f"<h2>Graph breaks and recompiles</h2><pre>{html.escape(reasons)}</pre>" if reasons else ""
    notes_html = "".join(f"<p>{html.escape(n)}</p>" for n in notes(doc))
    summary = geomean_frame([doc.records])
    if len(summary):
        notes_html += (f"<h2>{html.escape(GEOMEAN_TITLE.replace('``', ''))}</h2>"
                       + summary.to_html(index=False, float_format="%.3f"))
    stages = stage_frame(doc)
    if stages is not None:
        notes_html += "<h2>Where the time goes</h2>" + stages.to_html(index=False, float_format="%.3f")
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(doc.name)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:1.5em;max-width:1600px}}
table.results{{border-collapse:collapse;font-size:12px}} table.results td,table.results th{{border:1px solid #ccc;
padding:2px 3px;vertical-align:top}} table.results td{{white-space:nowrap}}
table.results td:first-child{{white-space:normal;min-width:9em}} pre{{white-space:pre-wrap}} th{{background:#f0f0f0}}
.scroll{{overflow-x:auto;max-width:100%}} p.workload{{font-size:15px}}
table.results td:first-child,table.results th:first-child{{position:sticky;left:0;background:#fff;z-index:1}}
dl.columns{{display:grid;grid-template-columns:max-content auto;gap:2px 1em;font-size:13px}}
dl.columns dt{{font-weight:bold}} dl.columns dd{{margin:0}}
figure{{display:inline-block;margin:0 1em 0 0;max-width:calc(50% - 1em)}} img{{max-width:100%}}</style>
</head><body><h1>{html.escape(doc.name)}: static Mask R-CNN against torchvision</h1>
<p class="workload"><b>Workload:</b> {html.escape(doc.run.workload.preset)}, {html.escape(images_text(doc.run))}</p>
<div class="scroll">{table}</div>{notes_html}
<h2>Columns</h2><dl class="columns">{legend}</dl>
{imgs}{reasons_html}</body></html>
"""


def plots(doc: RunDocument, out_dir: Path, stem: str) -> list[Path]:
    """PNGs: the distribution of each inference row's timed calls (a box per row over the rounds, on a
    linear axis, which shows differences at their true size) and training throughput."""
    # Imported here: matplotlib is slow to import and only the written reports need it.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in doc.records if r.status == "ok" and median(r) > 0]
    paths = []
    for phase in ("inference", "training"):
        rows = [r for r in recs if r.phase == phase]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
        names = [f"{r.row} (n={len(r.times_s)})" for r in rows]
        colours = ["#4c72b0" if r.impl == "static" else "#dd8452" for r in rows]
        if phase == "inference":
            box = ax.boxplot([r.times_s for r in rows], orientation="horizontal", tick_labels=names, patch_artist=True,
                             medianprops={"color": "black"}, flierprops={"markersize": 3})
            for patch, colour in zip(box["boxes"], colours, strict=True):
                patch.set_facecolor(colour)
            # A call far out (a compilation in a round) would squash every box: the axis ends a little past
            # the longest whisker, and the calls beyond it are named at its right edge.
            right = 1.3 * max(max(w.get_xdata()) for w in box["whiskers"])
            for y, r in enumerate(rows, start=1):
                beyond = [t for t in r.times_s if t > right]
                if beyond:
                    ax.annotate(f"{len(beyond)} beyond: max {max(beyond):.3g} s \u2192", (right, y), ha="right",
                                va="center", fontsize=8, xytext=(-2, 0), textcoords="offset points")
            ax.set_xlim(0, right)
            ax.set_xlabel("seconds per call over the rounds (box: IQR, line: median, whiskers: 1.5 IQR)")
        else:
            ax.barh(names, [r.images_per_s for r in rows], color=colours)
            ax.set_xlabel("training images/s (higher is better)")
        ax.invert_yaxis()
        ax.set_title(f"{doc.name} ({phase}; blue: static, orange: torchvision)")
        fig.tight_layout()
        path = out_dir / f"{stem}_{phase}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def write(doc: RunDocument, out_dir: Path, with_plots: bool = True) -> list[Path]:
    """DIR/<name>.md, .csv (the table) and .html (with plots). The JSON is written by the store."""
    out_dir.mkdir(parents=True, exist_ok=True)
    name = doc.name
    # Each written whole or not at all (a temporary file, then a rename): a crash leaves the last good one.
    md = out_dir / f"{name}.md"
    atomic_write(md, f"# {name}\n\n{markdown(doc)}\n")
    csv = out_dir / f"{name}.csv"
    atomic_write(csv, table_frame(doc.records, doc.run.overrides).to_csv(index=False))
    pngs = plots(doc, out_dir, name) if with_plots else []
    page = out_dir / f"{name}.html"
    atomic_write(page, html_page(doc, pngs))
    return [md, csv, page, *pngs]
