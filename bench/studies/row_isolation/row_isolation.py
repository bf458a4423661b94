"""Does a row's ratio (and do its compile counts) depend on which rows run beside it?

    python bench/studies/row_isolation/row_isolation.py run [--rounds 20] [--repeats 1] [--out results/isolation]
    python bench/studies/row_isolation/row_isolation.py summary [--out results/isolation]

``run`` times the same rows in two compositions: the three rows of ``run_tiny_k100``
(torchvision/eager, static/eager, static/inductor) alone, and inside the full inference table
(every inference case present here), each composition both ways: rows sharing one process
(``--in-process``, the old behaviour) and every row in a process of its own, stopped while the
others run (the default). Each run is ``mrcnn-bench run`` on the tiny preset, three 240x320 images
(the workload of the issue's figures), written to ``OUT/<mode>_<composition>_<repeat>/run.json``;
a run whose file exists is skipped, so an interrupted study resumes. The runs are ordered so that
the two modes alternate (drift over the study hits both alike).

``summary`` writes ``OUT/summary.md``: for each run, the median per-round ratio of each of the
three rows to torchvision/eager with its 95% bootstrap interval, the row's compile counts, and the
load from other processes; then, per mode, how far the composition moved each row's ratio.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

from mrcnn_bench.gates.stats import paired_ratio_ci
from mrcnn_bench.reports.run_notes import other_load
from mrcnn_bench.running import store

CORE = ("torchvision/eager", "static/eager", "static/inductor")
COMPOSITIONS = {"three": "torchvision/eager,static/eager,static/inductor", "all": "inference"}
MODES = {"isolated": [], "shared": ["--in-process"]}
WORKLOAD = ["--preset", "tiny", "--image-size", "240x320", "--images", "3"]


def run_dirs(out: Path, repeats: int) -> list[tuple[str, str, int, Path]]:
    """(mode, composition, repeat, folder) in the order they run: modes alternate."""
    order = []
    for rep in range(repeats):
        for comp in COMPOSITIONS:
            for mode in MODES:
                order.append((mode, comp, rep, out / f"{mode}_{comp}_{rep}"))
    return order


def cmd_run(args: argparse.Namespace) -> int:
    for mode, comp, _rep, folder in run_dirs(args.out, args.repeats):
        if (folder / "run.json").is_file():
            print(f"{folder}: done, skipped", flush=True)
            continue
        cmd = [sys.executable, "-m", "mrcnn_bench", "run", *WORKLOAD, "--cases", COMPOSITIONS[comp],
               "--rounds", str(args.rounds), "--no-progress", "--no-plots", "--out", str(folder), "--name", "run",
               "--start-over", *MODES[mode]]  # an unfinished run left by an interrupted study is measured again whole
        print(" ".join(cmd[1:]), flush=True)
        code = subprocess.call(cmd)
        if code not in (0, 1):  # 1: a row errored or timed out (reported in the table), still a run
            print(f"{folder}: exit {code}", flush=True)
            return code
    return 0


def row_ratios(doc: store.RunDocument) -> dict[str, tuple[float, float, float, int]]:
    """Each core row's median per-round ratio to torchvision/eager: (ratio, low, high, rounds)."""
    recs = {r.row: r for r in doc.records}
    ref = recs["torchvision/eager"].times_s
    out = {}
    for name in CORE[1:]:
        rec = recs.get(name)
        if rec is None or rec.status != "ok" or len(rec.times_s) != len(ref):
            continue
        out[name] = (*paired_ratio_ci(ref, rec.times_s), len(ref))
    return out


def cmd_summary(args: argparse.Namespace) -> int:
    lines = ["# Row ratios by composition and mode", "",
             "Median per-round ratio to torchvision/eager (95% bootstrap interval, rounds); the row's",
             "dynamo graphs / recompiles; the cores other processes kept busy (median over rounds).", "",
             "| run | rows | torchvision/eager median s | static/eager | static/inductor "
             "| inductor graphs / recompiles | other cores busy |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    by_key: dict[tuple[str, str], list[dict]] = {}
    for mode, comp, _rep, folder in run_dirs(args.out, args.repeats):
        path = folder / "run.json"
        if not path.is_file():
            continue
        doc = store.load(path)
        ratios = row_ratios(doc)
        by_key.setdefault((mode, comp), []).append(ratios)
        recs = {r.row: r for r in doc.records}
        ind = recs.get("static/inductor")
        cells = [f"{ratios[n][0]:.3f} [{ratios[n][1]:.3f}-{ratios[n][2]:.3f}], n={ratios[n][3]}" if n in ratios
                 else "-" for n in CORE[1:]]
        load = other_load(doc.run.machine_per_round).get("other_cores", float("nan"))
        lines.append(f"| {folder.name} | {len(doc.records)} | {np.median(recs['torchvision/eager'].times_s):.3f} | "
                     f"{cells[0]} | {cells[1]} | {ind.unique_graphs:g} / {ind.recompiles:g} | {load:.2f} |")
    lines += ["", "## Composition effect: ratio with all rows / ratio with three rows", "",
              "| mode | static/eager | static/inductor |", "| --- | --- | --- |"]
    for mode in MODES:
        three, full = by_key.get((mode, "three"), []), by_key.get((mode, "all"), [])
        if not three or not full:
            continue
        cells = []
        for name in CORE[1:]:
            a = [r[name][0] for r in three if name in r]
            b = [r[name][0] for r in full if name in r]
            cells.append(f"{np.median(b) / np.median(a):.3f}" if a and b else "-")
        lines.append(f"| {mode} | {cells[0]} | {cells[1]} |")
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("run", "summary"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/isolation"))
    args = parser.parse_args()
    return cmd_run(args) if args.what == "run" else cmd_summary(args)


if __name__ == "__main__":
    sys.exit(main())
