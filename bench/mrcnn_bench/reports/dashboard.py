"""``mrcnn-bench report``: one HTML dashboard over many run files (machines, commits, presets).

Writes, into the output folder: each run's own report (table, plots), ``all_records.csv`` (every
record of every run, environment included), and ``index.html`` with the merged table: one line
per (preset, case), one column per run, cells = median seconds per call (ratio to torchvision
eager), so records from a GPU box, a TPU VM and this CPU read side by side; each run's column says
its workload (a stream of varied sizes, or one fixed size); then the same grid for one cold pass
over each run's images, compilation included; under them, the geometric mean of the ratios by
backend and compiler over every run.
"""

from __future__ import annotations

import dataclasses
import html
import sys
from pathlib import Path

import pandas as pd

from mrcnn_bench.base.text import finite_or_none
from mrcnn_bench.reports import report, run_notes
from mrcnn_bench.running import store
from mrcnn_bench.running.records import Record, RunDocument


def run_label(doc: RunDocument, rec: Record) -> str:
    """A run's column header: its name, its workload's kind (stream or fixed size), host and commit."""
    return (f"{doc.name}: {run_notes.workload_kind(doc.run)} [{rec.env.get('host', '?')}, "
            f"{str(rec.env.get('commit') or '')[:8]}]")


def merged_frame(runs: list[RunDocument], value: str = "median") -> pd.DataFrame:
    """(preset, phase, case) x run: 'median s (ratio to its run's torchvision)', or the status;
    ``value="first_pass"``: one cold pass over the run's images in seconds (:func:`report.first_pass`).

    A row timed fewer than ``MIN_SAMPLES`` times shows its status and 'n=1: too few samples' instead.
    """
    groups: dict[tuple[str, str], list[Record]] = {}  # (run name, preset) -> records, in order of appearance
    docs: dict[str, RunDocument] = {}
    for doc in runs:
        docs[doc.name] = doc
        for rec in doc.records:
            groups.setdefault((doc.name, rec.preset), []).append(rec)
    cells = []
    for (run, preset), group in groups.items():
        table = report.table_frame(group).set_index("row")
        for rec in group:
            line = table.loc[rec.row]
            if value == "first_pass":
                seconds = line["first_pass_s"]
                text = f"{seconds:.3g} s" if seconds == seconds else ("" if rec.status == "ok" else rec.status)
            elif report.too_few(rec):
                text = f"{rec.status}, {report.too_few(rec)}"
            elif rec.status == "ok":
                ratio = line["ratio_vs_tv"]
                text = f"{line['median_s']:.3g} s" + (f" ({ratio:.2f}x)" if ratio == ratio else "")
            else:
                text = rec.status
            cells.append({"preset": preset, "phase": rec.phase, "case": rec.row, "run": run_label(docs[run], rec),
                          "cell": text})
    df = pd.DataFrame.from_records(cells)
    return df.pivot_table(index=["preset", "phase", "case"], columns="run", values="cell", aggfunc="first",
                          sort=False).fillna("")


def records_frame(runs: list[tuple[Path, RunDocument]]) -> pd.DataFrame:
    """Every record of every run, one line each, with its run's name and file (JSON values: null, not NaN)."""
    frames = []
    for file, doc in runs:
        df = pd.DataFrame.from_records([finite_or_none(r.to_dict()) for r in doc.records])
        df["run"] = doc.name
        df["file"] = str(file)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def unique_names(runs: list[tuple[Path, RunDocument]]) -> list[tuple[Path, RunDocument]]:
    """Runs whose names repeat (two machines' default ``run_tiny``) renamed ``NAME-2``, ``NAME-3``...
    in the order given, so that each gets its own page and column; says so on stderr."""
    seen: set[str] = {doc.name for _, doc in runs}
    counts: dict[str, int] = {}
    out = []
    for file, doc in runs:
        counts[doc.name] = counts.get(doc.name, 0) + 1
        if counts[doc.name] > 1:
            k = counts[doc.name]
            while f"{doc.name}-{k}" in seen:
                k += 1
            seen.add(new := f"{doc.name}-{k}")
            print(f"mrcnn-bench report: {file} is also named {doc.name!r}: shown as {new!r}", file=sys.stderr)
            doc = dataclasses.replace(doc, name=new)
        out.append((file, doc))
    return out


def build(paths: list[str], out_dir: Path) -> list[Path]:
    """Reports of every run file in ``paths`` plus the merged index; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = unique_names(list({str(file): (file, doc) for file, doc in store.load_runs(paths)}.values()))
    written: list[Path] = []
    links = []
    for _, doc in runs:  # a file given twice is reported once
        written += report.write(doc, out_dir)
        env = doc.environment
        links.append(f'<li><a href="{html.escape(doc.name)}.html">{html.escape(doc.name)}</a>: '
                     f'{html.escape(doc.run.workload.preset)}, {html.escape(run_notes.images_text(doc.run))}; '
                     f'{html.escape(str(env.get("cpu")))}, GPU {html.escape(str(env.get("gpu")))}, '
                     f'commit {html.escape(str(env.get("commit"))[:10])}, {html.escape(str(env.get("date")))}</li>')
    records = records_frame(runs)
    csv = out_dir / "all_records.csv"
    records.drop(columns=["times_s", "reasons", "counters_end"], errors="ignore").to_csv(csv, index=False)
    merged = merged_frame([doc for _, doc in runs])
    cold = merged_frame([doc for _, doc in runs], value="first_pass")
    recorded = any(report.first_pass(r) == report.first_pass(r) for _, doc in runs for r in doc.records)
    cold_html = cold.to_html() if recorded else "<p>None of these run files recorded it (they predate it).</p>"
    summary = report.geomean_frame([doc.records for _, doc in runs])
    index = out_dir / "index.html"
    index.write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>mrcnn-bench dashboard</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px}} th{{background:#f0f0f0}}</style></head><body>
<h1>Static Mask R-CNN against torchvision: all runs</h1>
<p>Each run's column names its workload: a <b>stream</b> of images of varied sizes, aspect ratios and object
counts (as real streams are: a model that compiles for each new shape pays for it on every new size), or one
<b>fixed</b> size (one compilation, then steady state). The runs are listed below with their images.</p>
<h2>Steady state</h2>
<p>Median seconds per call after the warm-up (ratio to the same run's torchvision eager; for training rows, to
torchvision's training step). Across commits over time, see the asv dashboard (<code>make asv-publish</code>
builds it in results/html of the repository, <code>make asv-serve</code> serves it).</p>
{merged.to_html()}
<h2>One cold pass over each run's images</h2>
<p>Seconds of the warm-up, which goes once over every distinct image before the timed rounds, compilation for
each new shape included (training rows: the first step; blank for run files from before it was recorded).</p>
{cold_html}
<h2>{html.escape(report.GEOMEAN_TITLE.replace("``", ""))}, over every run above</h2>
{summary.to_html(index=False, float_format="%.3f")}
<h2>Runs</h2><ul>{''.join(links)}</ul>
<p>Every record, with its environment: <a href="all_records.csv">all_records.csv</a>.</p></body></html>
""")
    return [*written, csv, index]
