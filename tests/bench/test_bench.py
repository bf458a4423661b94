"""The harness: cases, parity statistics, the runner's run file and tables, typed records, the
bounded worker, file comparison, the dashboard, the slowdown hook, the pipeline registry, the
module graph, and the gate's exact compile check (with an injected recompile)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from mrcnn.data.coco import CocoDataset
from mrcnn.data.synthetic import generate
from mrcnn.model import MaskRCNN
from mrcnn.parity import match_detections
from mrcnn.reference import torchvision_model
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, textured_images
from mrcnn_bench import ab, cli, gate, pipelines, report, store
from mrcnn_bench.cases import CASES, COMPILERS, Case, Row, Variant, Workload, parse_cases
from mrcnn_bench.context import Context, ContextOptions, make_context, save_context
from mrcnn_bench.execution import RowTimeout, WorkerRow
from mrcnn_bench.parity import aggregate_parity, parity_stats
from mrcnn_bench.pipelines import compact
from mrcnn_bench.probes import count_flops
from mrcnn_bench.profile import STAGES, profile_stages, stage_times
from mrcnn_bench.records import Record, RunDocument, RunInfo
from mrcnn_bench.slowdown import inject_slowdown

REPO = Path(__file__).resolve().parents[2]


def _dets(boxes, labels, scores, size=(40, 50)) -> dict[str, torch.Tensor]:
    boxes = torch.tensor(boxes, dtype=torch.float32)
    masks = torch.zeros(len(boxes), 1, *size)
    for i, (x1, y1, x2, y2) in enumerate(boxes.int().tolist()):
        masks[i, 0, y1:y2, x1:x2] = 0.9
    return {"boxes": boxes, "labels": torch.tensor(labels), "scores": torch.tensor(scores), "masks": masks}


REF = _dets([[0, 0, 20, 20], [10, 10, 40, 30], [5, 20, 25, 38]], [1, 2, 1], [0.9, 0.8, 0.6])


# ------------------------------------------------------------------------------------------------
# Cases


def test_case_names_and_parsing():
    assert Case("static", compiler="inductor", precision="bf16").name == "static/inductor-bf16"
    assert Case("torchvision", backend="xla").name == "torchvision/xla"
    assert Case("static", compiler="inductor", phase="training").name == "static/inductor-train"
    assert [c.name for c in parse_cases("static/eager,quick")][:2] == ["static/eager", "torchvision/eager"]
    assert all(c.phase == "training" for c in parse_cases("training"))
    with pytest.raises(ValueError, match=r"unknown case\(s\) \['static/nope'\]"):
        parse_cases("static/eager,static/nope")
    with pytest.raises(ValueError, match="export and aoti cases exist for static inference only"):
        Case("torchvision", compiler="aoti")
    with pytest.raises(ValueError, match="image_size"):
        Workload("tiny", (0, 10))


def test_absent_backend_has_a_reason():
    reason = CASES["static/cuda"].skip_reason()
    assert (reason is None) == torch.cuda.is_available()
    if reason:
        assert reason == "no CUDA device"


# ------------------------------------------------------------------------------------------------
# Parity


def test_identical_detections_match_fully():
    s = parity_stats(REF, {k: v.clone() for k, v in REF.items()})
    assert (s["num_ref"], s["num_other"], s["matched"]) == (3, 3, 3)
    assert s["matched_ref"] == s["matched_other"] == 1.0
    assert s["mask_iou_min"] == s["mask_iou_mean"] == 1.0


@pytest.mark.parametrize(("key", "index", "change"), [
    ("boxes", 1, torch.tensor([4.0, 0.0, 4.0, 0.0])),  # IoU 26/34 < 0.9
    ("labels", 0, 2),
    ("scores", 2, -0.03),  # beyond the 0.02 score tolerance
])
def test_a_changed_detection_is_unmatched(key, index, change):
    other = {k: v.clone() for k, v in REF.items()}
    other[key][index] += change
    assert parity_stats(REF, other)["matched"] == 2


def test_boolean_masks_and_aggregation():
    other = compact([REF])[0]  # what the harness keeps of each timed output
    assert other["masks"].dtype == torch.bool
    assert match_detections(REF, other).min_mask_iou == 1.0
    empty = {k: v[:0] for k, v in REF.items()}
    agg = aggregate_parity([parity_stats(REF, other), parity_stats(REF, empty)])
    assert agg["matched_ref"] == pytest.approx(0.5) and agg["matched_other"] == 1.0
    assert aggregate_parity([parity_stats(empty, empty)])["matched_ref"] == 1.0


# ------------------------------------------------------------------------------------------------
# The main job: run file, tables, dashboard


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_weights):
    """One small run of the CLI (two inference rows, one training row, one absent backend)."""
    tmp = tmp_path_factory.mktemp("run")
    weights = tmp / "weights.pt"
    torch.save(tiny_weights, weights)
    code = cli.main([
        "run", "--preset", "tiny", "--cases", "torchvision/eager,static/eager,static/train,static/cuda",
        "--rounds", "3", "--images", "1", "--weights", str(weights), "--out", str(tmp / "out"), "--name", "t",
        "--no-progress", "--peak-reps", "1", "--set", "box_score_thresh=0.05",  # the default, recorded
    ])
    assert code == 0
    return tmp / "out"


def test_run_writes_records_with_environment(run_dir):
    doc = store.load(run_dir / "t.json")
    recs = {r.row: r for r in doc.records}
    static = recs["static/eager"]
    assert static.status == "ok" and len(static.times_s) == 3
    assert static.parity_matched_ref == 1.0 and static.parity_matched_other == 1.0
    assert static.flops > 1e9 and static.peak_mem_gb > 0.1
    assert recs["static/train"].images_per_s > 0 and math.isfinite(recs["static/train"].final_loss)
    assert recs["static/cuda"].status == ("ok" if torch.cuda.is_available() else "skipped")
    for r in doc.records:  # every record carries where it came from
        assert r.env["torch"] == torch.__version__ and r.env["threads"] >= 1 and r.env["seed"] == 0
        assert "commit" in r.env and "cpu" in r.env and "gpu" in r.env
    assert doc.run.peaks["matmul_fp32"] > 0
    raw = json.loads((run_dir / "t.json").read_text())
    committed = json.loads((REPO / "results" / "runs" / "run_tiny.json").read_text())
    # The record's own fields: the same keys in the same order as a committed run file; its environment
    # may add keys (what the machine shows, e.g. the frequency governor) but keeps every old one.
    fields = [k for k in raw["records"][0] if not k.startswith("env_")]
    old = [k for k in committed["records"][0] if not k.startswith("env_")]
    # ... and the keys added since, which are written only when set.
    assert fields[: len(old)] == old and fields[len(old) :] == ["warmup_s", "first_pass_s"]
    warm = raw["records"][1]["warmup_s"]
    assert len(warm) >= 1 and warm[0] == raw["records"][1]["first_result_s"]
    assert raw["records"][1]["first_pass_s"] == pytest.approx(math.fsum(warm))
    assert {k for k in committed["records"][0] if k.startswith("env_")} <= set(raw["records"][0])
    assert raw["run"]["ceiling"]["fp32_gflops"] > 0 and raw["records"][0]["env_cpus"]


@pytest.mark.parametrize("path", sorted((REPO / "results" / "runs").glob("*.json")), ids=lambda p: p.name)
def test_committed_run_files_load_as_typed_records(path):
    """Every committed run file loads through Record and writes back to the very same text."""
    raw = json.loads(path.read_text())
    doc = store.load(path)
    assert doc.records and all(isinstance(r, Record) for r in doc.records)
    assert store.dumps(doc).strip() == path.read_text().strip()
    assert math.isnan(Record.from_dict({**raw["records"][0], "median_s": None}).median_s)
    with pytest.raises(ValueError, match="unknown key"):
        Record.from_dict({**raw["records"][0], "median": 1.0})


def test_run_tables_and_html(run_dir):
    md = (run_dir / "t.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| row"))
    for column in ("ratio_vs_tv", "median_s", "images_per_s", "compiles", "frac_peak", "parity", "target"):
        assert column in header
    if not torch.cuda.is_available():
        assert "skipped: no CUDA device" in md
    assert "100.0% / 100.0%" in md  # static/eager against torchvision, both directions
    assert "Workload: preset tiny, box_score_thresh=0.05, images" in md  # config overrides are shown
    assert "<table" in (run_dir / "t.html").read_text()
    assert (run_dir / "t_inference.png").stat().st_size > 1000
    assert "ratio_vs_tv" in (run_dir / "t.csv").read_text()


def test_dashboard_merges_runs(run_dir, tmp_path):
    second = json.loads((run_dir / "t.json").read_text())
    second["name"] = "t_other_machine"
    for r in second["records"]:
        r["env_host"] = "gpu-box"
    (tmp_path / "t2.json").write_text(json.dumps(second))
    files = [str(run_dir / "t.json"), str(tmp_path / "t2.json")]
    assert cli.main(["report", *files, "--out", str(tmp_path / "html")]) == 0
    index = (tmp_path / "html" / "index.html").read_text()
    assert "gpu-box" in index and "static/eager" in index and "t_other_machine.html" in index


def test_timeout_and_skip_are_shown():
    rec = Record(row="torchvision/xla", case="torchvision/xla", status="timeout", backend="xla", impl="torchvision",
                 detail="> 1 s (in first call, UncachedCompile=12)")
    doc = RunDocument("t", {}, RunInfo(limit_s=1.0), [rec])
    shown = report.shown_frame(doc)
    assert shown.loc[0, "median_s"] == "> 1 s"
    assert "UncachedCompile=12" in shown.loc[0, "status"]


def test_unknown_case_and_bad_options_are_clear_errors(capsys):
    assert cli.main(["run", "--cases", "static/nope"]) == 2
    assert "unknown case(s) ['static/nope']" in capsys.readouterr().err
    assert cli.main(["run", "--preset", "nope"]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err
    assert cli.main(["run", "--set", "no_such_field=1"]) == 2
    assert "unknown config field" in capsys.readouterr().err
    assert cli.main(["compare", "missing_a.json", "missing_b.json"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_images_and_evaluation_come_from_a_coco_layout_split(tmp_path, tiny_weights):
    """--coco-root ROOT --coco-split S: the timed images are S's, and --eval evaluates S too."""
    generate(tmp_path, 3, seed=0, split="train", progress=False)
    weights = tmp_path / "weights.pt"
    torch.save(tiny_weights, weights)
    args = cli.build_parser().parse_args(
        ["run", "--coco-root", str(tmp_path), "--coco-split", "train", "--eval", "2", "--images", "2",
         "--weights", str(weights)])
    opts = cli.run_options(args)
    assert (opts.coco_split, opts.eval_root, opts.eval_split) == ("train", str(tmp_path), "train")
    ctx, _ = make_context(ContextOptions(opts.workload, opts.weights, 0, 1, False, opts.coco_root, opts.coco_split,
                                         opts.overrides))
    expected = CocoDataset(tmp_path, "train")
    assert len(ctx.images) == 2
    for i, image in enumerate(ctx.images):
        assert torch.equal(image, expected[i][0].float() / 255)


# ------------------------------------------------------------------------------------------------
# compare A B on stored runs


def _records(times: list[float], **extra) -> list[Record]:
    fields = {"unique_graphs": 1, **extra}
    return [Record(case="static/eager", status="ok", times_s=times, median_s=sorted(times)[len(times) // 2], **fields)]


def test_compare_flags_a_slowdown_and_exact_changes():
    a = [0.30 + 0.001 * (i % 5) for i in range(20)]
    b = [t * 1.15 for t in a]
    table = ab.compare_records(_records(a), _records(b, unique_graphs=2))
    line = table.iloc[0]
    assert bool(line["regression"]) and line["ratio_b_over_a"] == pytest.approx(1.15, rel=0.01)
    assert "REGRESSION" in line["verdict"] and "unique_graphs 1 -> 2" in line["exact_changes"]
    assert line["n"] == 20 and "95% CI" in line["verdict"]
    same = ab.compare_records(_records(a), _records(list(reversed(a)))).iloc[0]
    assert not same["regression"] and same["exact_changes"] == ""


# ------------------------------------------------------------------------------------------------
# The bounded worker


def test_worker_is_killed_at_its_time_limit(tmp_path, tiny_weights):
    """A variant whose code hangs during set-up (here, importing its config): the worker is killed at the limit."""
    code = tmp_path / "code"
    (code / "mrcnn").mkdir(parents=True)
    (code / "mrcnn" / "__init__.py").write_text("")
    (code / "mrcnn" / "config.py").write_text("import time\n\ntime.sleep(600)\n")
    ctx = Context("tiny", {}, Workload(), {}, [], [], 1, 0)
    save_context(ctx, tmp_path)
    row = WorkerRow(Row(Case("static"), Variant("A", str(code))), tmp_path, limit=3.0)
    start = time.monotonic()
    with pytest.raises(RowTimeout, match=r"> 3 s \(in setup"):
        row.setup()
    assert time.monotonic() - start < 60
    assert row.proc is not None and row.proc.poll() is not None  # the worker is gone
    row.close()


# ------------------------------------------------------------------------------------------------
# Stage profile (a fake clock: no timing in the assertions)


class _Tick(torch.nn.Module):
    """Advances the fake clock by ``cost`` then runs its children."""

    def __init__(self, clock: list[float], cost: float = 0.0, **children: torch.nn.Module) -> None:
        super().__init__()
        self.clock, self.cost = clock, cost
        for name, child in children.items():
            self.add_module(name, child)

    def forward(self, x):
        self.clock[0] += self.cost
        for child in self.children():
            x = child(x)
        return x


def test_stage_times_split_a_call_into_stages():
    clock = [0.0]
    t = lambda cost=0.0, **kw: _Tick(clock, cost, **kw)  # noqa: E731
    model = t(backbone=t(body=t(2.0), fpn=t(1.0)), rpn=t(1.0, head=t(2.0)),
              roi_heads=t(1.0, box_head=t(), box_predictor=t(), mask_head=t(2.0), mask_predictor=t()))

    def call():
        clock[0] += 3.0  # outside the network
        model(0)

    times = stage_times({"toy": (model, call)}, reps=1, clock=lambda: clock[0])["toy"]
    assert [label for label, *_ in STAGES] == list(times)
    assert times["backbone: ResNet body + FPN"] == 3.0 and times["RPN head (convs)"] == 2.0
    assert times["RPN rest: anchors, top-k, decode, NMS"] == 1.0 and times["mask head (convs)"] == 2.0
    assert times["outside the network: resize, pad, box rescale, mask paste"] == 3.0
    assert times["total, end to end"] == 12.0


def test_profile_times_and_counts_every_stage_of_both_models():
    """The static backbone runs the ResNet's and FPN's layers itself, so hooks on ``backbone.body``
    never fire there (its stage once read 0 s and its time landed "outside the network"). On this
    workload (the image fills the canvas, every detection slot valid) both models do the same work
    in every stage, so their FLOPs per stage must agree."""
    ctx, _ = make_context(ContextOptions(Workload(preset="tiny", images=1)))
    times, flops = profile_stages(ctx, reps=1)
    backbone, outside, total = "backbone: ResNet body + FPN", STAGES[-2][0], "total, end to end"
    assert flops["static"] == pytest.approx(flops["torchvision"])
    assert flops["static"][backbone] > 0.5 * flops["static"][total]
    assert flops["static"][outside] == 0.0
    assert times["static"][backbone] > 0.0 and times["torchvision"][backbone] > 0.0


def test_stage_table_gives_each_stage_its_fraction_of_the_ceiling():
    info = RunInfo(stages={"static": {"a": 2.0, "total": 4.0}}, stage_flops={"static": {"a": 400e9, "total": 500e9}},
                   ceiling={"fp32_gflops": 400.0})
    frame = report.stage_frame(RunDocument("t", {}, info, []))
    df = frame.set_index(frame.columns[0])
    assert df.loc["a", "static_gflop"] == 400.0 and df.loc["a", "static_frac_ceiling"] == 0.5
    assert df.loc["total", "static_share"] == 1.0 and df.loc["total", "static_frac_ceiling"] == 500 / 4 / 400
    assert "static_frac_ceiling" not in report.stage_frame(RunDocument("t", {}, RunInfo(stages=info.stages), []))


# ------------------------------------------------------------------------------------------------
# The gate


SAMPLE_XLA_LOG = textwrap.dedent("""\
    mrcnn-bench gate: call 2 on image (250, 300) -> model input [1, 3, 320, 384]
    Compilation Analysis: ================================================================================
    Compilation Analysis: Compilation Cause
    Compilation Analysis:   user torch_xla.sync
    Compilation Analysis: Graph Info:
    Compilation Analysis:   Graph Hash: abc123
    Compilation Analysis:   Number of Graph Inputs: 1
    Compilation Analysis: Python Frame Triggered Execution:
    Compilation Analysis:   sync (/site-packages/torch_xla/torch_xla.py:87)
    Compilation Analysis:   run (/repo/bench/mrcnn_bench/runner.py:277)
    Compilation Analysis: --------------------------------------------------------------------------------
    """)


def test_gate_failure_messages_name_metric_change_and_cause():
    causes = gate.xla_compile_causes(SAMPLE_XLA_LOG)
    assert causes == [{"cause": ["user torch_xla.sync"], "graph_hash": "abc123",
                       "frames": ["sync (/site-packages/torch_xla/torch_xla.py:87)",
                                  "run (/repo/bench/mrcnn_bench/runner.py:277)"],
                       "during": "call 2 on image (250, 300) -> model input [1, 3, 320, 384]"}]
    base = {"uncached_compile": 2, "flops": 10.0, "per_call": [{"image": [240, 320], "uncached_compile": 1},
                                                                {"image": [250, 300], "uncached_compile": 1}],
            "xla_causes": []}
    now = {"uncached_compile": 3, "flops": 10.0, "xla_causes": causes,
           "per_call": [{"image": [240, 320], "uncached_compile": 1}, {"image": [250, 300], "uncached_compile": 2}]}
    (msg,) = gate.compile_failures("static/xla", base, now)
    assert msg.startswith("static/xla: uncached_compile rose from 2 to 3 (+1)")
    assert "after the call on image [250, 300]" in msg and "model input [1, 3, 320, 384]" in msg
    assert "runner.py:277" in msg
    assert gate.compile_failures("static/xla", base, base) == []
    dyn = gate.compile_failures("static/inductor", {"graph_breaks": 0}, {
        "graph_breaks": 1, "reasons": {"graph_breaks": ["data-dependent branch (model.py:40)"], "recompiles": []}})
    assert dyn == ["static/inductor: graph_breaks rose from 0 to 1 (+1)\n    graph break: data-dependent branch "
                   "(model.py:40)"]


@pytest.mark.slow
@pytest.mark.xla
def test_gate_fails_on_an_injected_recompile(tmp_path):
    """The real gate on static/xla: flat over seven sizes, then failing when images are padded tightly."""
    pytest.importorskip("torch_xla")
    baseline = tmp_path / "gate.json"
    base_cmd = [sys.executable, "-m", "mrcnn_bench.cli", "gate", "--cases", "static/xla", "--accuracy", "none",
                "--baseline", str(baseline)]
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    subprocess.run([*base_cmd, "--write-baseline"], check=True, env=env, cwd=REPO, capture_output=True)
    counts = json.loads(baseline.read_text())["cases"]["static/xla"]
    assert counts["uncached_compile"] == 2 and counts["fallback_ops"] == 0  # one per canvas bucket
    fault = subprocess.run([*base_cmd, "--inject", "recompile"], env=env, cwd=REPO, capture_output=True, text=True)
    assert fault.returncode == 1, fault.stdout + fault.stderr
    assert "GATE FAILED" in fault.stdout and "static/xla: uncached_compile rose from 2 to" in fault.stdout
    assert "XLA compiled a new graph" in fault.stdout and "model input [1, 3, 320, 384]" in fault.stdout


def test_compare_runs_two_checkouts_interleaved(tmp_path, capsys):
    """Live compare: A and B in worker processes importing their own checkout ('.' twice here).

    B runs with the slowdown hook (recorded in its variant's overrides; that the hook adds the
    work is shown by FLOP count in the slowdown test). Nothing here asserts on timing: the ratio,
    the verdict's direction and the exit code are the machine's, and a timed assertion in a unit
    test is a flaky test; results/latency_gate holds the gate's measured error rates.
    """
    out = tmp_path / "cmp.json"
    code = cli.main(["compare", str(REPO), str(REPO), "--cases", "static/eager", "--rounds", "7", "--images", "1",
                     "--inject-slowdown", "0.2", "--peak-reps", "0", "--no-flops", "--no-progress",
                     "--out", str(out)])
    assert code in (0, 1)  # the exit code is the verdict's: timing, not asserted
    data = json.loads(out.read_text())
    (line,) = data["comparison"]
    assert line["case"] == "static/eager" and line["n"] == 7 and 0 <= line["p_value"] <= 1
    assert line["ratio_b_over_a"] > 0 and line["verdict"].startswith("B is ") and "n=7" in line["verdict"]
    recs = {r["row"]: r for r in data["run"]["records"]}
    assert set(recs) == {"A:static/eager", "B:static/eager"}
    assert recs["B:static/eager"]["variant_overrides"] == {"inject_slowdown": 0.2}
    assert not recs["A:static/eager"]["variant_overrides"]
    assert all(len(r["times_s"]) == 7 and r["variant_code"] == str(REPO) for r in recs.values())
    assert "static/eager" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------
# The slowdown hook


def _strips(height: int, fraction: float) -> list[int]:
    """The extra body passes of the old ``MaskRCNN._injected_work`` (body share 0.5), written out again."""
    rows = round(fraction / 0.5 * height)
    return [height] * (rows // height) + ([rows % height] if rows % height else [])


@pytest.mark.parametrize(("impl", "fraction"), [("static", 0.1), ("static", 0.6), ("torchvision", 0.1)])
def test_slowdown_hook_does_the_old_extra_work_and_keeps_outputs(tiny_cfg, tiny_weights, impl, fraction):
    """Extra FLOPs = the body over the old formula's strips (0.6: a whole pass plus a strip); outputs bit-identical."""
    if impl == "static":
        model = load_torchvision_weights(MaskRCNN(tiny_cfg), tiny_weights).eval()
        batch = to_image_batch(textured_images(((240, 320),), seed=1), tiny_cfg)
        call, canvas = (lambda: model(batch)), batch.tensors
    else:
        model = torchvision_model(tiny_cfg).eval()
        model.load_state_dict(tiny_weights)
        images = textured_images(((240, 320),), seed=1)
        call, canvas = (lambda: model(images)), model.transform(images)[0].tensors
    with torch.no_grad():
        plain, plain_flops = call(), count_flops(call)
        strips = _strips(canvas.shape[-2], fraction)
        reference = sum(count_flops(lambda s=s: model.backbone.body(canvas[..., :s, :])) for s in strips)
        handle = inject_slowdown(model, fraction)
        hooked, hooked_flops = call(), count_flops(call)
        handle.remove()
    assert reference > 0 and len(strips) == (2 if fraction > 0.5 else 1)
    assert hooked_flops - plain_flops == reference
    if impl == "static":
        assert int(plain.valid.sum()) > 10
        pairs = zip(plain._fields, plain, hooked)
    else:
        pairs = ((k, a[k], b[k]) for a, b in zip(plain, hooked) for k in a)
    for name, x, y in pairs:
        assert torch.equal(x, y), name


# ------------------------------------------------------------------------------------------------
# The pipeline registry and the module graph


def test_every_compiler_has_one_registered_pipeline():
    assert set(pipelines.PIPELINES) == set(COMPILERS)
    with pytest.raises(ValueError, match="already registered"):
        pipelines.register_pipeline("eager")(pipelines.build_eager)


def test_a_missing_lazy_subcommand_fails_alone(monkeypatch, capsys):
    monkeypatch.setitem(cli.LAZY_COMMANDS, "export-time", ("mrcnn_bench.no_such_module", "help"))
    assert cli.main(["export-time", "--x"]) == 2
    assert "mrcnn_bench.no_such_module cannot be imported" in capsys.readouterr().err
