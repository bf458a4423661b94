"""How long until a new process gets its first detections from static inductor, cold and warm?

    python bench/studies/first_result/first_result.py run [--workloads coco,tiny] [--rounds 3] [--out DIR]
    python bench/studies/first_result/first_result.py report [--out results/first_result]
    python bench/studies/first_result/first_result.py profile [--workload coco] [--out DIR]
    python bench/studies/first_result/first_result.py phases [--workload coco] [--rounds 2] [--out DIR]

Each round starts seven fresh Python processes, one after the other, each with its own inductor
cache folder (``TORCHINDUCTOR_CACHE_DIR``) and temporary folder (below; nothing from
``/tmp/torchinductor_$USER`` is read):

- ``cold``: an empty cache folder. After its first result the process saves the caches' portable
  artifacts (``torch.compiler.save_cache_artifacts``) to a file.
- ``warm``: the cold process's cache folder, as a second process on the same machine finds it.
- ``artifacts``: a new, empty cache folder and the cold process's artifacts file, loaded with
  ``torch.compiler.load_cache_artifacts`` before compiling: a fresh machine given the artifacts.
- ``precompile_cold``: a new, empty cache folder, with dynamo's experimental caching precompile on
  (``TORCH_CACHING_PRECOMPILE=1``). After its first result the process writes its traced frame and
  its AOTAutograd entry into the cache folder (``PrecompileContext``, a private API of torch 2.9:
  serialize, then populate the caches), which ``torch.compile`` does not do by itself.
- ``precompile_warm``: precompile_cold's folder, precompile on: a second process that loads the
  traced frame instead of tracing the model again (the part of a warm start the other caches leave).
- ``frozen_cold`` and ``frozen_warm``: an empty folder, then the same folder, for the model compiled
  with freezing (``mrcnn.frozen.FrozenInference``, the harness's ``static/frozen`` row): batch norm
  folded into the convolutions at compile time and the weights prepacked, so fewer kernels to
  generate and build, but a graph that holds oneDNN tensors, which torch 2.9's FX graph cache cannot
  store.

Each folder also gets its own temporary folder (``TMPDIR``): inductor keeps its precompiled C++
header under the temporary folder, not under ``TORCHINDUCTOR_CACHE_DIR``, so without it every
process after the first would find the header built (about 120 MB) and none would be cold.

The precompile modes compile ``model.forward`` (a bound method), since the precompile cache keys a
frame by its function's name and ``torch.compile(model)`` hands it the module; the graph is the same.

A process imports torch and mrcnn, builds the model, loads weights from a checkpoint file (as a
user loads theirs; random values, since compilation does not depend on them), makes the
``ImageBatch`` of one textured image, and calls ``torch.compile(model, fullgraph=True,
dynamic=False)`` on it under no_grad: the user's path in ``docs/model.md``. Time to first result
is the wall time from the launch of the process to the first call's return, measured by the parent;
the process reports its parts (model and weights, artifacts loading, first call; the rest is the
interpreter's start-up and the imports) and one more call (the steady state, for scale). Each
round's processes are appended to ``OUT/first_result.jsonl`` when the round ends, so a rerun
resumes at the next round; ``report`` (and the end of ``run``) writes ``OUT/first_result.json``
and ``OUT/first_result.md``: per workload and mode the median of the rounds with their range and
count, beside the goals (cold 45 s, warm 10 s, COCO size).

``phases`` runs cold processes only, plain and frozen, and splits their first call with torch's
own timers (tracing, AOTAutograd, lowering, kernel code generation, the wait for the C++ builds),
the vector-ISA check (called on its own before compiling) and the call itself.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench"))

from mrcnn_bench.base import vcs  # noqa: E402
from mrcnn_bench.base.files import atomic_write  # noqa: E402
from mrcnn_bench.running import store  # noqa: E402
from mrcnn_bench.running.journal import read_lines  # noqa: E402

# workload -> (preset, image (h, w))
WORKLOADS = {"coco": ("coco_r50_fpn", (480, 640)), "tiny": ("tiny", (240, 320))}
MODES = ("cold", "warm", "artifacts", "precompile_cold", "precompile_warm", "frozen_cold", "frozen_warm")
# at COCO size, this host kind
GOALS_S = {"cold": 45.0, "warm": 10.0, "artifacts": 10.0, "precompile_cold": 45.0, "precompile_warm": 10.0,
           "frozen_cold": 45.0, "frozen_warm": 10.0}  # fmt: skip
NAME = "first_result"
PRECOMPILE_ENV = "TORCH_CACHING_PRECOMPILE"
# the phases table's rows: a child's record -> seconds of its first call
FIRST_CALL_PARTS = {
    "vec ISA check": lambda r: r["vec_isa_check_s"],
    "dynamo tracing": lambda r: _phase(r, "bytecode_tracing"),
    "AOTAutograd (and freezing)": lambda r: _phase(r, "create_aot_dispatcher_function") - _phase(r, "compile_fx_inner"),
    "lowering and scheduling": lambda r: _phase(r, "GraphLowering.run") + _phase(r, "Scheduler.__init__"),
    "kernel code generation": lambda r: _phase(r, "Scheduler.codegen"),
    "waiting for the C++ builds": lambda r: _phase(r, "async_compile.wait"),
    # the rest of inductor's compile: the precompiled header, the wrapper's code, loading the module
    "inductor's compile, other": lambda r: _phase(r, "compile_fx_inner")
    - sum(_phase(r, k) for k in ("GraphLowering.run", "Scheduler.__init__", "Scheduler.codegen", "async_compile.wait")),
    "guards": lambda r: _phase(r, "build_guards"),
    "the call itself (the next call's time)": lambda r: r["second_call_s"],
}


def _phase(record: dict[str, Any], name: str) -> float:
    return record["compile_phases"].get(name, 0.0)  # a region the process never entered


def child(
    preset: str, size: tuple[int, int], weights: Path, save: Path | None, load: Path | None, precompile: bool,
    frozen: bool = False,
) -> dict[str, Any]:
    """One process's first result; runs in the child. Prints nothing but its JSON record."""
    import torch
    from torch._dynamo.utils import compilation_time_metrics, counters
    from torch._inductor import cpu_vec_isa

    from mrcnn.config import get_config
    from mrcnn.frozen import FrozenInference
    from mrcnn.model import MaskRCNN
    from mrcnn.transform import to_image_batch
    from mrcnn.weights import textured_images

    t_import = time.perf_counter()  # the start; the parent's launch time covers start-up and imports
    model = MaskRCNN(get_config(preset)).eval()
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    batch = to_image_batch(textured_images((size,), seed=0), model.cfg)
    t_model = time.perf_counter()
    loaded = None
    if load is not None:
        info = torch.compiler.load_cache_artifacts(load.read_bytes())
        loaded = {k: len(v) for k, v in vars(info).items() if isinstance(v, list)} if info else None
    t_load = time.perf_counter()
    # inductor's check of the CPU's vector ISA (cached for the process), timed on its own: part of
    # the first call, which would run it anyway
    cpu_vec_isa.valid_vec_isa_list()
    t_isa = time.perf_counter()
    if frozen:
        compiled = FrozenInference(model)  # fullgraph, dynamic=False; it runs under no_grad itself
    else:
        compiled = torch.compile(model.forward if precompile else model, fullgraph=True, dynamic=False)
    with torch.no_grad():
        det = compiled(batch)
        t_first, first_epoch = time.perf_counter(), time.time()
        compiled(batch)
        t_second = time.perf_counter()
    saved = None
    if save is not None:
        artifacts = _save_precompile() if precompile else torch.compiler.save_cache_artifacts()
        if artifacts is not None:
            save.write_bytes(artifacts[0])
            saved = save.stat().st_size
    # The same detections from every mode: a cache that changed the program would show here.
    checksum = sum(float(t.double().sum()) for t in (det.boxes, det.scores, det.masks))
    return {
        "model_s": t_model - t_import, "load_artifacts_s": t_load - t_model,
        "first_call_s": t_first - t_load, "second_call_s": t_second - t_first, "first_result_epoch": first_epoch,
        "valid_detections": int(det.valid.sum()), "output_checksum": checksum, "artifacts_loaded": loaded,
        "artifacts_saved_bytes": saved, "traced_graphs": int(counters["stats"]["unique_graphs"]),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "vec_isa_check_s": t_isa - t_load,
        # torch's dynamo_timed regions (seconds, summed over the process), which the phases table reads
        "compile_phases": {k: sum(v) for k, v in compilation_time_metrics.items()},
        # inductor's FX graph cache: hit, miss or bypass (a graph it cannot store) per graph
        "fx_graph_cache": {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")},
    }  # fmt: skip


def _save_precompile() -> tuple[bytes, Any] | None:
    """Write this process's traced frames and their compiled backends into the cache folder's
    ``dynamo`` store, where a later ``torch.compile`` with caching precompile looks them up; -> the
    serialized artifacts (for their size), or None when nothing new was traced."""
    from torch._dynamo.precompile_context import PrecompileContext
    from torch.compiler._cache import CacheArtifactManager

    serialized = PrecompileContext.serialize()
    if serialized is None:
        return None
    PrecompileContext._ensure_cache_artifacts_registered()
    artifacts = CacheArtifactManager.deserialize(serialized[0])
    if artifacts is None:
        raise RuntimeError("torch could not read back the precompile artifacts it had just written")
    PrecompileContext.populate_caches(artifacts)
    return serialized


def _launch(args: list[str], cache: Path, prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run this file's ``child`` command in a new process (``prefix``: arguments of the interpreter
    before the script, such as ``-m cProfile``); -> its record, with ``first_result_s``: the launch
    (here) to the return of its first call (there), on the machine's clock."""
    headers = cache.with_name(cache.name + "_tmp")  # inductor's precompiled header goes under TMPDIR
    headers.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "TMPDIR": str(headers), "PYTHONPATH": str(REPO)}
    # dynamo reads the switch when it is imported; the other modes must run without it
    env.pop(PRECOMPILE_ENV, None)
    if "--precompile" in args:
        env[PRECOMPILE_ENV] = "1"
    launched = time.time()
    command = [sys.executable, *prefix, __file__, "child", *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"child process failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    return {"first_result_s": record.pop("first_result_epoch") - launched, **record}


def _weights(tmp: Path, preset: str, size: tuple[int, int]) -> list[str]:
    """Save seeded weights of ``preset`` into ``tmp``; -> the child's arguments for them and ``size``."""
    import torch

    from mrcnn.config import get_config
    from mrcnn.model import MaskRCNN

    weights = tmp / f"{preset}.pt"
    torch.manual_seed(0)
    torch.save(MaskRCNN(get_config(preset)).state_dict(), weights)
    return ["--preset", preset, "--size", f"{size[0]}x{size[1]}", "--weights", str(weights)]


def profile(workload: str, out: Path, top: int = 45) -> Path:
    """Where a warm precompile process spends its first call: one precompile_cold process fills a
    cache folder, then a precompile_warm process runs under cProfile; -> ``OUT/warm_profile_W.txt``
    (the ``top`` functions by cumulative time, the process's record above them)."""
    import pstats

    preset, size = WORKLOADS[workload]
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="first_result_") as tmp_name:
        tmp = Path(tmp_name)
        pre = [*_weights(tmp, preset, size), "--precompile"]
        cold = _launch([*pre, "--save", str(tmp / "precompile.bin")], tmp / "cache")
        stats_file = tmp / "warm.pstats"
        warm = _launch(pre, tmp / "cache", prefix=("-m", "cProfile", "-o", str(stats_file)))
        text = io.StringIO()
        pstats.Stats(str(stats_file), stream=text).sort_stats("cumulative").print_stats(top)
    path = out / f"warm_profile_{workload}.txt"
    head = (f"python bench/studies/first_result/first_result.py profile --workload {workload}\n"
            f"precompile_cold: {json.dumps(cold)}\nprecompile_warm under cProfile: {json.dumps(warm)}\n")  # fmt: skip
    atomic_write(path, head + text.getvalue().replace(tmp_name, "TMP"))
    return path


def phases(workload: str, rounds: int, out: Path) -> Path:
    """Where a cold first call goes, plain and frozen: ``rounds`` cold processes each -> ``OUT/phases_W.{json,md}``."""
    preset, size = WORKLOADS[workload]
    out.mkdir(parents=True, exist_ok=True)
    records: dict[str, list[dict[str, Any]]] = {"cold": [], "frozen_cold": []}
    with tempfile.TemporaryDirectory(prefix="first_result_") as tmp_name:
        tmp = Path(tmp_name)
        base = _weights(tmp, preset, size)
        for index in range(rounds):
            for mode, args in (("cold", base), ("frozen_cold", [*base, "--frozen"])):
                records[mode].append(_launch(args, tmp / f"{mode}{index}"))
                print(f"{workload} {mode} {index + 1}/{rounds}: first call {records[mode][-1]['first_call_s']:.1f} s",
                      file=sys.stderr, flush=True)  # fmt: skip

    table = {m: {n: statistics.median(part(r) for r in rs) for n, part in FIRST_CALL_PARTS.items()}
             for m, rs in records.items()}  # fmt: skip
    for m, rs in records.items():
        table[m]["first call"] = statistics.median(r["first_call_s"] for r in rs)
        table[m]["rest"] = table[m]["first call"] - sum(table[m][n] for n in FIRST_CALL_PARTS)
    command = f"python bench/studies/first_result/first_result.py phases --workload {workload} --rounds {rounds}"
    atomic_write(out / f"phases_{workload}.json", json.dumps({"command": command, "commit": vcs.output(store.REPO,
        "rev-parse", "--short", "HEAD"), "records": records, "medians": table}, indent=1) + "\n")  # fmt: skip
    lines = [f"# Where a cold first call goes: {preset} {size[0]}x{size[1]}", "",
             f"Command: `{command}`; commit {vcs.output(store.REPO, 'rev-parse', '--short', 'HEAD')}, "
             f"{store.cpu_model()} x{os.cpu_count()}. Seconds, median of {rounds} cold processes per path "
             "(empty cache folders, each with its own TMPDIR). Phases are torch's own timers "
             "(`torch._dynamo.utils.compilation_time_metrics`); the vector-ISA check is called first, "
             "on its own.", "",
             "| phase | " + " | ".join(table) + " |", "| --- |" + " --- |" * len(table)]  # fmt: skip
    for n in ("first call", *FIRST_CALL_PARTS, "rest"):
        lines.append(f"| {n} | " + " | ".join(f"{table[m][n]:.2f}" for m in table) + " |")
    path = out / f"phases_{workload}.md"
    atomic_write(path, "\n".join(lines) + "\n")
    return path


def run(workloads: list[str], rounds: int, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    journal = out / f"{NAME}.jsonl"
    done = read_lines(journal) if journal.exists() else []
    start = {}
    for workload in workloads:  # checked before anything runs
        mine = [r for r in done if r["workload"] == workload]
        complete = {r["round"] for r in mine if r["mode"] == MODES[-1]}
        if any(r["round"] not in complete for r in mine):  # rounds are written whole: an older version's
            raise SystemExit(f"{journal} holds {workload} rounds without the modes {', '.join(MODES)} (written "
                             "by an older version of this study): move it away, then run again")  # fmt: skip
        start[workload] = max(complete) + 1 if complete else 0
    with tempfile.TemporaryDirectory(prefix="first_result_") as tmp_name:
        tmp = Path(tmp_name)
        for workload in workloads:
            preset, size = WORKLOADS[workload]
            base = _weights(tmp, preset, size)
            for index in range(start[workload], rounds):
                cache, fresh = tmp / f"{workload}{index}_cache", tmp / f"{workload}{index}_fresh"
                pre_cache, artifacts = tmp / f"{workload}{index}_precompile", tmp / "artifacts.bin"
                pre, frozen = [*base, "--precompile"], [*base, "--frozen"]
                plan = {"cold": ([*base, "--save", str(artifacts)], cache), "warm": (base, cache),
                        "artifacts": ([*base, "--load", str(artifacts)], fresh),
                        "precompile_cold": ([*pre, "--save", str(tmp / "precompile.bin")], pre_cache),
                        "precompile_warm": (pre, pre_cache),
                        "frozen_cold": (frozen, tmp / f"{workload}{index}_frozen"),
                        "frozen_warm": (frozen, tmp / f"{workload}{index}_frozen")}  # fmt: skip
                rows = []
                for mode in MODES:
                    record = _launch(*plan[mode])
                    rows.append({"workload": workload, "preset": preset, "size": list(size), "round": index,
                                 "mode": mode, **record, "loadavg_1m": os.getloadavg()[0],
                                 "date": time.strftime("%Y-%m-%d %H:%M:%S")})  # fmt: skip
                    print(f"{workload} round {index + 1}/{rounds} {mode}: first result "
                          f"{record['first_result_s']:.1f} s (first call {record['first_call_s']:.1f} s)",
                          file=sys.stderr, flush=True)  # fmt: skip
                with journal.open("a") as f:  # a round whole or not at all, so a rerun redoes a broken one
                    f.writelines(json.dumps(row) + "\n" for row in rows)
    report(out)


def _spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def report(out: Path) -> dict[str, Any]:
    """``OUT/first_result.jsonl`` -> ``.json`` and ``.md``."""
    rows = read_lines(out / f"{NAME}.jsonl")
    if not rows:
        raise SystemExit(f"no records in {out / (NAME + '.jsonl')}: run `run` first")
    for r in rows:  # launch to the child's first line: the interpreter's start-up and every import
        r["startup_s"] = r["first_result_s"] - r["model_s"] - r["load_artifacts_s"] - r["first_call_s"]
    parts = ("first_result_s", "startup_s", "model_s", "load_artifacts_s", "first_call_s", "second_call_s")
    summary: dict[str, Any] = {
        # the run that wrote these rows, rebuilt from them (the report may be rewritten later)
        "command": "python bench/studies/first_result/first_result.py run --workloads "
        f"{','.join(dict.fromkeys(r['workload'] for r in rows))} --rounds {1 + max(r['round'] for r in rows)}",
        "commit": vcs.output(store.REPO, "rev-parse", "--short", "HEAD"),
        "cpu": f"{store.cpu_model()} x{os.cpu_count()}",
        "torch": rows[-1]["torch"], "threads": rows[-1]["threads"], "goals_s": GOALS_S, "workloads": {},
    }  # fmt: skip
    for workload in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == workload]
        summary["workloads"][workload] = {
            "preset": mine[0]["preset"], "size": mine[0]["size"],
            "modes": {m: {p: _spread([r[p] for r in mine if r["mode"] == m]) for p in parts}
                      for m in MODES if any(r["mode"] == m for r in mine)},
            "saved_bytes": {m: _spread(saved) for m in ("cold", "precompile_cold")
                            if (saved := [r["artifacts_saved_bytes"] for r in mine
                                          if r["mode"] == m and r.get("artifacts_saved_bytes")])},
            "traced_graphs": {m: sorted({r["traced_graphs"] for r in mine if r["mode"] == m and "traced_graphs" in r})
                              for m in MODES},
            "fx_graph_cache": {m: sorted({json.dumps(r["fx_graph_cache"], sort_keys=True) for r in mine
                                          if r["mode"] == m and "fx_graph_cache" in r}) for m in MODES},
            # every process of a path returned the same detections (rounds without a checksum: None);
            # freezing folds batch norm into the convolutions, so its rounding is its own
            "outputs_agree": all(len({round(r["output_checksum"], 3) for r in mine
                                      if r["mode"].startswith("frozen") == frozen}) <= 1 for frozen in (False, True))
            if all("output_checksum" in r for r in mine) else None,
            "loadavg_1m": _spread([r["loadavg_1m"] for r in mine]),
        }  # fmt: skip
    atomic_write(out / f"{NAME}.json", json.dumps(summary, indent=1) + "\n")
    atomic_write(out / f"{NAME}.md", _markdown(summary))
    return summary


def _markdown(summary: dict[str, Any]) -> str:
    lines = [
        "# Time to first result: static inductor in a new process, cold and warm",
        "",
        f"Command: `{summary['command']}` (see `bench/studies/first_result/first_result.py`). Commit "
        f"{summary['commit']}; torch {summary['torch']}, {summary['threads']} threads, {summary['cpu']}.",
        "",
        "Seconds, median of the rounds [min-max] (n rounds). First result: launch of the process to the "
        "return of its first call. Goals at COCO size: cold 45 s, warm (second process, or a fresh cache "
        "folder given the artifacts) 10 s.",
        "",
        "| workload | mode | first result | start-up and imports | model + weights | load artifacts | first call "
        "| next call | graphs traced | goal | n |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for workload, w in summary["workloads"].items():
        for mode, m in w["modes"].items():

            def cell(part: str, m: dict = m) -> str:
                s = m[part]
                return f"{s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}]"

            traced = "/".join(map(str, w["traced_graphs"].get(mode, []))) or "-"
            goal = summary["goals_s"][mode] if workload == "coco" else None
            met = "" if goal is None else (f"{goal:.0f} s, met" if m["first_result_s"]["max"] <= goal
                                           else f"{goal:.0f} s, **missed**")  # fmt: skip
            lines.append(
                f"| {workload} ({w['preset']} {w['size'][0]}x{w['size'][1]}) | {mode} | {cell('first_result_s')} | "
                f"{cell('startup_s')} | {cell('model_s')} | {cell('load_artifacts_s')} | {cell('first_call_s')} | "
                f"{cell('second_call_s')} | {traced} | {met} | {m['first_result_s']['n']} |"
            )
    lines += ["", "A goal counts as met only when every round met it (the max, not the median). Graphs traced: "
              "the graphs dynamo traced in the process (0 when its cache gave it the traced frame)."]  # fmt: skip
    for workload, w in summary["workloads"].items():
        saved = "; ".join(f"{m} wrote {b['median'] / 1e6:.1f} MB" for m, b in w["saved_bytes"].items())
        agree = {True: "the same detections in every process of a path (frozen or not)",
                 False: "**detections differ between processes**",
                 None: "no output checksum recorded"}[w["outputs_agree"]]  # fmt: skip
        lines.append(f"{workload}: {saved or 'no artifacts saved'}; {agree}; load average (1 min) "
                     f"{w['loadavg_1m']['min']:.1f}-{w['loadavg_1m']['max']:.1f}.")  # fmt: skip
        fx = "; ".join(f"{m} {' or '.join(c)}" for m, c in w.get("fx_graph_cache", {}).items() if c)
        if fx:
            lines.append(f"{workload}, inductor's FX graph cache per process: {fx}.")
    return "\n".join(lines) + "\n"


def _size(text: str) -> tuple[int, int]:
    h, _, w = text.partition("x")
    return int(h), int(w)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="measure (resumes at the next round)")
    r.add_argument("--workloads", default="coco,tiny", help="comma-separated, from: " + ", ".join(WORKLOADS))
    r.add_argument("--rounds", type=int, default=3, help="rounds per workload (default 3)")
    rep = sub.add_parser("report", help="rewrite the .json and .md from the .jsonl")
    prof = sub.add_parser("profile", help="cProfile of a warm precompile process's first call")
    ph = sub.add_parser("phases", help="where a cold first call goes, plain and frozen")
    ph.add_argument("--rounds", type=int, default=2, help="cold processes per path (default 2)")
    for p in (prof, ph):
        p.add_argument("--workload", choices=sorted(WORKLOADS), default="coco")
    for p in (r, rep, prof, ph):
        p.add_argument("--out", type=Path, default=REPO / "results" / "first_result")
    c = sub.add_parser("child", help=argparse.SUPPRESS)
    c.add_argument("--preset", required=True)
    c.add_argument("--size", type=_size, required=True)
    c.add_argument("--weights", type=Path, required=True)
    c.add_argument("--save", type=Path)
    c.add_argument("--load", type=Path)
    c.add_argument("--precompile", action="store_true", help="compile model.forward, save with PrecompileContext")
    c.add_argument("--frozen", action="store_true", help="compile with freezing (mrcnn.frozen.FrozenInference)")
    args = parser.parse_args(argv)
    if getattr(args, "rounds", 1) < 1:
        parser.error("--rounds must be at least 1")
    if args.command == "child":
        print(json.dumps(child(args.preset, args.size, args.weights, args.save, args.load, args.precompile,
                               args.frozen)))
    elif args.command == "run":
        unknown = set(args.workloads.split(",")) - set(WORKLOADS)
        if unknown:
            parser.error(f"unknown workloads {sorted(unknown)}")
        run(args.workloads.split(","), args.rounds, args.out)
    elif args.command == "profile":
        print(profile(args.workload, args.out))
    elif args.command == "phases":
        print(phases(args.workload, args.rounds, args.out))
    else:
        report(args.out)


if __name__ == "__main__":
    main()
