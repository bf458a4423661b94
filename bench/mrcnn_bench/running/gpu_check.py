"""``mrcnn-bench gpu-check``: everything that needs a CUDA GPU, in one go, its records in one folder.

    make gpu-check                                               # -> out/gpu-check/
    PYTHONPATH=$PWD:$PWD/bench python3 -m mrcnn_bench gpu-check --out DIR   # no install

GPU machines come with their own PyTorch build (often another version than the pinned one, and no
torch_xla), so the check runs the project from its source tree with whatever ``python`` has torch;
small missing packages (pycocotools) can be installed beside it. Steps, each a child process in its
own process group with its own time limit, its output in ``DIR/<step>.log``:

- ``tests``: the CUDA tests (``tests/mrcnn/test_cuda.py``, fp16 with GradScaler, the ``static/cuda``
  row of ``mrcnn-bench run``); a skipped test counts as not checked.
- ``rows``: the harness's CUDA rows at a few rounds on one image size, beside ``torchvision/eager`` on
  the CPU.
- ``aoti``: ``mrcnn export --device cuda`` (torch.export and AOTInductor) checked against eager, then
  ``mrcnn-bench export-time`` on the GPU.
- ``fp16-train``: ``mrcnn train`` on synthetic data in fp32 and in fp16 with GradScaler, each
  evaluated at its end; every logged loss must be finite.

``DIR/gpu_check.json`` records the machine (GPU, driver, torch, CUDA) and, per step, its commands,
exit codes, seconds and verdict; ``DIR/gpu_check.md`` is the same as a table. Exit 0 when every step
passed, 1 when a step failed, 2 when something could not be checked: no CUDA device (said at once,
nothing run), a skipped test, or a step the time budget left no time for.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mrcnn.config import get_config
from mrcnn.exits import FAILED, PASSED, UNDECIDED, guarded
from mrcnn.export.cli import default_canvas
from mrcnn.flags import bounded
from mrcnn_bench.base import timing, vcs
from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.running import backends

REPO = Path(__file__).resolve().parents[3]
# The harness's CUDA rows, and the CPU row every run is compared with.
CUDA_CASES = ("torchvision/eager,torchvision/cuda,static/cuda,static/cuda-inductor,static/cuda-inductor-bf16,"
              "torchvision/cuda-train,static/cuda-train")
CUDA_TESTS = (
    "tests/mrcnn/test_cuda.py",
    "tests/mrcnn/test_training_precision.py::test_fp16_gradscaler_on_cuda",
    "tests/mrcnn/test_train_loop.py::test_fp16_gradscaler_training_on_cuda",
    "tests/bench/test_run_command.py",
)
ROWS_IMAGE = "240x320"
MIN_STEP_S = 30.0  # a step is not started with less of the budget left than this
TRAIN_STEPS = 40
TRAIN_RUNS = {"fp32": "none", "fp16": "fp16"}  # folder -> --amp


@dataclass(frozen=True)
class GpuCheckOptions:
    out: Path = Path("out/gpu-check")
    budget_s: float = 480.0  # all steps together (a lent GPU machine is timed by the minute)
    rounds: int = 8  # timed rounds of the harness rows and of export-time
    steps: tuple[str, ...] = ()  # the steps to run; empty: all


@dataclass
class StepResult:
    """One step: its commands as run, their exit codes, seconds, and the verdict."""

    name: str
    verdict: str = "not run"  # passed / failed / not checked / not run
    why: str = ""
    commands: list[str] = field(default_factory=list)
    exit_codes: list[int | None] = field(default_factory=list)  # None: killed at its time limit
    seconds: float = 0.0
    log: str = ""


@dataclass(frozen=True)
class Step:
    name: str
    limit_s: float
    commands: Callable[[Path, GpuCheckOptions], list[list[str]]]
    # Reads what the commands wrote (the step's folder) once they all exited 0: "" passed, else why it
    # did not, prefixed "failed: " or "not checked: ".
    verify: Callable[[Path], str] = lambda _folder: ""


def _python(*args: str) -> list[str]:
    # faulthandler: a crash inside a compiled kernel or loader still leaves the Python stack in the log.
    return [sys.executable, "-X", "faulthandler", *args]


def _tests(folder: Path, _opts: GpuCheckOptions) -> list[list[str]]:
    return [_python("-m", "pytest", "-p", "no:cacheprovider", "-q", "--timeout", "600",
                    f"--junitxml={folder / 'tests.xml'}", *CUDA_TESTS)]


def _verify_tests(folder: Path) -> str:
    """Skips in the JUnit XML: a CUDA test that skipped on a GPU machine checked nothing."""
    skipped = [f"{case.get('name')} ({el.get('message', '')[:120]})"
               for case in ET.parse(folder / "tests.xml").iter("testcase") for el in case.findall("skipped")]
    return f"not checked: {len(skipped)} skipped: " + "; ".join(skipped[:5]) if skipped else ""


def _rows(folder: Path, opts: GpuCheckOptions) -> list[list[str]]:
    # One image size: one canvas, so each compiled row compiles once (a stream of sizes would compile
    # each canvas it meets, minutes of the budget).
    return [_python("-m", "mrcnn_bench", "run", "--preset", "tiny", "--image-size", ROWS_IMAGE, "--cases",
                    CUDA_CASES, "--rounds", str(opts.rounds), "--out", str(folder), "--name", "cuda_rows_tiny",
                    "--no-progress", "--start-over")]  # a check measures afresh, over any earlier one's rounds


def _train(folder: Path, _opts: GpuCheckOptions) -> list[list[str]]:
    common = ["--preset", "tiny", "--data", str(folder / "data"), "--synth-count", "16", "--steps",
              str(TRAIN_STEPS), "--device", "cuda", "--seed", "0", "--quiet"]
    return [_python("-m", "mrcnn.cli", "train", *common, "--amp", amp, "--out", str(folder / name))
            for name, amp in TRAIN_RUNS.items()]


def _verify_train(folder: Path) -> str:
    """Every logged loss finite, and an evaluation at the end of each run."""
    for amp in TRAIN_RUNS:
        records = [json.loads(line) for line in (folder / amp / "metrics.jsonl").read_text().splitlines() if line]
        bad = [r["step"] for r in records if any(k.startswith("loss") and not math.isfinite(v)
                                                   for k, v in r.items() if isinstance(v, float))]
        if bad:
            return f"failed: {amp} logged a non-finite loss at steps {bad[:5]}"
        if not any("bbox/AP" in r for r in records):
            return f"failed: the {amp} run logged no evaluation"
    return ""


def _aoti(folder: Path, opts: GpuCheckOptions) -> list[list[str]]:
    cfg = get_config("tiny")
    (h, w), stem = default_canvas(cfg), folder / cfg.name  # the file names mrcnn export gives them
    # Built, then each package checked and timed in a process of its own, AOTInductor first: a crash
    # (one was seen on an H200 with torch 2.11) then names the package and leaves the other checked.
    build = _python("-m", "mrcnn.cli", "export", "--preset", "tiny", "--device", "cuda", "--out", str(folder),
                    "--sample-image", "240x320")
    return [build, *(_python("-m", "mrcnn_bench", "export-time", f"{stem}_{h}x{w}_b1.{fmt}.pt2", "--image",
                             str(folder / "sample.ppm"), "--rounds", str(opts.rounds * 4),
                             "--out", str(folder / f"export_time_{fmt}.json"))
                     for fmt in ("aoti", "exported"))]


# Most telling first, where a short budget leaves the last out: correctness against torchvision on the
# GPU, then the rows users time, then what the tests cover in part (AOTInductor, fp16 training).
STEPS = (
    Step("tests", 240, _tests, _verify_tests),
    Step("rows", 240, _rows),
    Step("aoti", 240, _aoti),
    Step("fp16-train", 150, _train, _verify_train),
)


def machine() -> dict[str, object]:
    """What the records were measured on: GPU, driver, CUDA, torch and friends, Python, host."""
    info: dict[str, object] = {
        "gpu": torch.cuda.get_device_name(0), "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
        "cuda": torch.version.cuda, "torch": torch.__version__, "python": platform.python_version(),
        "cpu_cores": os.cpu_count(), "host": platform.node(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    for module in ("torchvision", "torch_xla", "pycocotools"):
        try:
            info[module] = getattr(__import__(module), "__version__", "installed")
        except ImportError:
            info[module] = None
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        info["driver"] = smi.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["driver"] = None
    info["commit"] = vcs.output(REPO, "rev-parse", "HEAD") or None
    return info


def _child_env() -> dict[str, str]:
    """The source tree first on the path: the check runs the project uninstalled."""
    paths = [str(REPO), str(REPO / "bench"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1"}


def _run(argv: list[str], log, limit_s: float) -> int | None:
    """Run ``argv`` in its own process group, output appended to ``log``; None when killed at ``limit_s``."""
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    proc = subprocess.Popen(argv, cwd=REPO, env=_child_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        return proc.wait(timeout=max(1.0, limit_s))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the harness's row workers too
        proc.wait()
        log.write(f"\n[gpu-check] killed at its limit of {limit_s:.0f} s\n")
        return None


def run_step(step: Step, opts: GpuCheckOptions, limit_s: float) -> StepResult:
    """Run one step's commands in order, then verify. The first builds what the others use, so they run
    only after it passed; the others are independent (each runs whatever the one before it did), until
    the step's time is spent."""
    folder = opts.out / step.name
    folder.mkdir(parents=True, exist_ok=True)
    result = StepResult(step.name, log=str(opts.out / f"{step.name}.log"))
    watch = timing.Stopwatch()
    with open(result.log, "w", encoding="utf-8") as log:
        for argv in step.commands(folder, opts):
            result.commands.append(" ".join(argv))
            rc = _run(argv, log, limit_s - watch.elapsed())
            result.exit_codes.append(rc)
            if rc is None or (rc != 0 and len(result.exit_codes) == 1):
                break
    result.seconds = watch.elapsed()
    failed = [(cmd, rc) for cmd, rc in zip(result.commands, result.exit_codes) if rc != 0]
    if failed:
        cmd, rc = failed[0]
        result.verdict = "failed"
        result.why = (f"killed at its limit of {limit_s:.0f} s" if rc is None else f"`{cmd}` exited {rc}") + (
            f" (and {len(failed) - 1} more)" if len(failed) > 1 else "")
    else:
        try:
            problem = step.verify(folder)
        except (OSError, ValueError, KeyError, ET.ParseError) as e:
            problem = f"failed: its records could not be read ({type(e).__name__}: {e})"
        verdict, _, why = problem.partition(": ") if problem else ("passed", "", "")
        result.verdict, result.why = verdict, why
    return result


def exit_code(results: list[StepResult]) -> int:
    if any(r.verdict == "failed" for r in results):
        return FAILED
    return PASSED if all(r.verdict == "passed" for r in results) else UNDECIDED


def markdown(info: dict[str, object], results: list[StepResult]) -> str:
    lines = [f"# GPU check: {info['gpu']}", "",
             f"torch {info['torch']} (CUDA {info['cuda']}), torchvision {info['torchvision']}, "
             f"driver {info['driver']}, Python {info['python']}, {info['cpu_cores']} CPU cores, "
             f"commit {info['commit']}, {info['date']}.", "",
             "| step | verdict | seconds | why | log |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r.name} | {r.verdict} | {r.seconds:.0f} | {r.why} | {Path(r.log).name} |" for r in results]
    return "\n".join(lines) + "\n"


def gpu_check(opts: GpuCheckOptions, log: Callable[[str], None] = print) -> int:
    """Run the steps within ``opts.budget_s``; writes DIR/gpu_check.json and .md; returns the exit code."""
    if (why := backends.unavailable("cuda")) is not None:
        print(f"mrcnn-bench gpu-check: {why}: nothing was checked (run it on a machine with an NVIDIA GPU)",
              file=sys.stderr)
        return UNDECIDED
    opts.out.mkdir(parents=True, exist_ok=True)
    info = machine()
    log(f"[gpu-check] {info['gpu']}, torch {info['torch']}, CUDA {info['cuda']}; budget {opts.budget_s:.0f} s")
    since_start = timing.Stopwatch()
    results: list[StepResult] = []
    for step in STEPS:
        if opts.steps and step.name not in opts.steps:
            continue
        left = opts.budget_s - since_start.elapsed()
        if left < MIN_STEP_S:
            results.append(StepResult(step.name, "not run", f"{left:.0f} s of the budget left"))
        else:
            log(f"[gpu-check] {step.name}: running (limit {min(step.limit_s, left):.0f} s) ...")
            results.append(run_step(step, opts, min(step.limit_s, left)))
        r = results[-1]
        log(f"[gpu-check] {r.name}: {r.verdict} in {r.seconds:.0f} s" + (f" ({r.why})" if r.why else ""))
        record = {"machine": info, "options": dataclasses.asdict(opts),
                  "steps": [dataclasses.asdict(r) for r in results]}
        atomic_write((opts.out / "gpu_check.json"), json.dumps(record, indent=2, default=str) + "\n")
        (opts.out / "gpu_check.md").write_text(markdown(info, results))
    log(f"[gpu-check] wrote {opts.out / 'gpu_check.md'}")
    return exit_code(results)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="out/gpu-check", metavar="DIR",
                        help="records, logs and each step's files (default: out/gpu-check)")
    parser.add_argument("--budget-s", type=bounded(float, 0, low_open=True), default=GpuCheckOptions.budget_s,
                        help=f"seconds for all steps together (default: {GpuCheckOptions.budget_s:.0f})")
    parser.add_argument("--rounds", type=bounded(int, 1), default=GpuCheckOptions.rounds,
                        help=f"timed rounds of the harness rows (export-time: 4x) (default: {GpuCheckOptions.rounds})")
    parser.add_argument("--steps", default="", help="comma list of steps to run, of "
                        f"{', '.join(s.name for s in STEPS)} (default: all)")


def run(args: argparse.Namespace) -> int:
    names = tuple(s.strip() for s in args.steps.split(",") if s.strip())
    if unknown := sorted(set(names) - {s.name for s in STEPS}):
        print(f"mrcnn-bench gpu-check: error: --steps: unknown {unknown}, choose from "
              f"{[s.name for s in STEPS]}", file=sys.stderr)
        return UNDECIDED
    if args.budget_s <= 0 or args.rounds < 1:
        print("mrcnn-bench gpu-check: error: --budget-s must be positive and --rounds at least 1", file=sys.stderr)
        return UNDECIDED
    opts = GpuCheckOptions(out=Path(args.out), budget_s=args.budget_s, rounds=args.rounds, steps=names)
    return gpu_check(opts, log=lambda msg: print(msg, flush=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mrcnn-bench gpu-check", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return guarded("mrcnn-bench", lambda: run(parser.parse_args(argv)), lambda: "gpu-check")

