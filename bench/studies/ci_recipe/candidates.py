"""Which cheaper accuracy-gate recipe keeps the gate's teeth? Candidate schedules and image sizes, seed by seed.

    python bench/studies/ci_recipe/candidates.py run 160_800 160_800@box_coder [--seeds 0-9] [--parallel 2]
    python bench/studies/ci_recipe/candidates.py summary [--out out/ci_recipe] [--results FILE.md]

Every candidate is the ``ci`` recipe (``mrcnn train --recipe ci``) with its image size and schedule
set by flags (:data:`CANDIDATES`): the same 48 synthetic images, model, optimiser and seed handling, one thread,
an evaluation of the training images every 100 steps. ``NAME@FAULT`` trains it under one of the
accuracy gate's deliberate bugs (:mod:`mrcnn_bench.gates.faults`), as ``accuracy-gate
--inject-fault`` does for the recipe itself. ``run`` trains each named run whose folder
(``OUT/NAME[@FAULT]-s<seed>``) has no evaluation at its last step yet, ``--parallel`` at a time
(rerun it after a stop: a run cut short starts over); ``--seeds`` trains each run once per seed, and
each run's folder records its host (``host.json``, which the accuracy baseline reads). ``summary``
writes one table: per run the box and mask AP at every evaluation, the final pair, and the seconds
per step (with ``--parallel 2`` two runs shared the machine, so a step alone is faster: the ratios
between candidates hold).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the studies' shared modules (studies.*)

from studies.training_runs import Job, parse_seeds, run_jobs

from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.gates.accuracy_baseline import (
    final_metrics,
    host_kind,
    host_record,
    read_host,
    run_name_seed,
    write_host,
)
from mrcnn_bench.gates.faults import FAULTS, inject_fault

# Each candidate spells out its image size and schedule, so that it stays what its name says
# whatever the ci recipe is now (160_800 is the recipe since it was chosen; 224_1200 was before).
_224 = ("--set", "min_size=224", "--set", "max_size=352",
        "--set", "canvases=((224,224),(224,320),(224,352),(320,224),(352,224))")
# Short side 160 (long side at most 256): about half the pixels of 224 (352).
_160 = ("--set", "min_size=160", "--set", "max_size=256",
        "--set", "canvases=((160,160),(160,224),(160,256),(224,160),(256,160))")
_1200 = ("--steps", "1200", "--lr-steps", "1000")
CANDIDATES: dict[str, tuple[str, ...]] = {
    "224_1200": (*_224, *_1200),
    "224_600_lr3e-3": (*_224, "--steps", "600", "--lr-steps", "500", "--lr", "3e-3"),
    "224_600_lr2e-3_zero_residual": (*_224, "--steps", "600", "--lr-steps", "500", "--lr", "2e-3",
                                     "--init", "zero_residual"),
    "224_1200_batch2": (*_224, *_1200, "--batch-size", "2"),
    "160_1200": (*_160, *_1200),
    "160_1000": (*_160, "--steps", "1000", "--lr-steps", "800"),
    "160_800": (*_160, "--steps", "800", "--lr-steps", "650"),
}
EVAL_EVERY = 100


def parse_run(text: str) -> tuple[str, str | None]:
    """``NAME`` or ``NAME@FAULT`` -> (candidate, fault or None), both checked."""
    name, _, fault = text.partition("@")
    if name not in CANDIDATES:
        raise argparse.ArgumentTypeError(f"unknown candidate {name!r}; choose from {sorted(CANDIDATES)}")
    if fault and fault not in FAULTS:
        raise argparse.ArgumentTypeError(f"unknown fault {fault!r}; choose from {sorted(FAULTS)}")
    return name, fault or None


def train_argv(name: str, seed: int, out: Path) -> list[str]:
    """``mrcnn train`` arguments of candidate ``name`` (one thread, evaluations every 100 steps)."""
    return ["train", "--recipe", "ci", "--seed", str(seed), "--threads", "1", "--no-progress",
            "--eval-every", str(EVAL_EVERY), "--out", str(out), *CANDIDATES[name]]


def last_step(name: str) -> int:
    """The candidate's last step (its ``--steps``)."""
    flags = CANDIDATES[name]
    return int(flags[flags.index("--steps") + 1])


def evaluations(folder: Path) -> list[dict]:
    """The lines of the run's ``metrics.jsonl`` (steps and evaluations); none before it starts."""
    path = folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def finished(folder: Path, name: str) -> bool:
    """Whether the run evaluated at its last step (the gate's own reader of a run's final metrics)."""
    try:
        return final_metrics(folder)["step"] == last_step(name)
    except (FileNotFoundError, ValueError):
        return False


def folder_of(out: Path, name: str, fault: str | None, seed: int) -> Path:
    return out / f"{name}{'@' + fault if fault else ''}-s{seed}"


def cmd_run(args: argparse.Namespace) -> int:
    jobs = []
    for seed in args.seeds:
        for name, fault in args.runs:
            folder = folder_of(args.out, name, fault, seed)
            if finished(folder, name):
                continue
            shutil.rmtree(folder, ignore_errors=True)  # a run cut short starts over
            write_host(folder, host_record(threads=1))  # where it ran: the accuracy baseline reads it
            argv = (sys.executable, __file__, "one", "--fault", fault or "", "--", *train_argv(name, seed, folder))
            jobs.append(Job(folder.name, argv, folder.with_suffix(".log")))

    def ended(job: Job, code: int) -> bool:
        print(f"{job.label}: exit {code}", flush=True)
        return code == 0

    return run_jobs(jobs, args.parallel, ended)


def cmd_one(fault: str, argv: list[str]) -> int:
    """One ``mrcnn train`` in this process, under ``fault`` when one is named."""
    from mrcnn.cli import main

    if not fault:
        return main(argv)
    with inject_fault(fault):
        return main(argv)


def cmd_summary(args: argparse.Namespace) -> int:
    lines = ["# Cheaper accuracy-gate recipes: AP along the way, and the cost of a step", "",
             "`python bench/studies/ci_recipe/candidates.py run ...`, then `summary`; each run is "
             "`mrcnn train --recipe ci --threads 1` with the candidate's flags (`CANDIDATES` in the script), "
             f"evaluated on its 48 training images every {EVAL_EVERY} steps. Box AP / mask AP.", "",
             "| run | seed | host kind | s/step | box / mask AP along the way (step: box/mask) | final box AP "
             "| final mask AP |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for folder in sorted(p for p in args.out.iterdir() if p.is_dir()):
        rows = evaluations(folder)
        steps = [r for r in rows if "step_time" in r]
        evals = [r for r in rows if "bbox/AP" in r]
        if not evals:
            continue
        name, seed = run_name_seed(folder) or (folder.name, "?")
        host = read_host(folder)
        kind = host_kind(host) if host else "not recorded"
        per_step = statistics.fmean(r["step_time"] + r["data_time"] for r in steps)
        curve = " ".join(f"{r['step']}: {r['bbox/AP']:.3f}/{r['segm/AP']:.3f}" for r in evals[:-1])
        last = evals[-1]
        lines.append(f"| {name} | {seed} | {kind} | {per_step:.3f} | {curve} "
                     f"| {last['bbox/AP']:.4f} (step {last['step']}) | {last['segm/AP']:.4f} |")
    text = "\n".join(lines) + "\n"
    if args.results:
        atomic_write(args.results, text)
    print(text)
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "one":  # the worker: one run, its fault applied in-process
        fault = sys.argv[sys.argv.index("--fault") + 1]
        return cmd_one(fault, sys.argv[sys.argv.index("--") + 1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("run", "summary"))
    parser.add_argument("runs", nargs="*", type=parse_run, help="NAME or NAME@FAULT (run)")
    parser.add_argument("--seeds", type=parse_seeds, default=[0], help="N, N-M or a comma list (default 0)")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("out/ci_recipe"))
    parser.add_argument("--results", type=Path, default=None, help="summary: also write the table here")
    args = parser.parse_args()
    return cmd_run(args) if args.what == "run" else cmd_summary(args)


if __name__ == "__main__":
    sys.exit(main())
