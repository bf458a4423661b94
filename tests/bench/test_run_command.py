"""``mrcnn-bench run`` end to end: the run file and its typed records, the tables, plot and HTML, the
dashboard over runs, committed run files that still load, clear errors for bad options, images from a
COCO-layout split, and a missing lazy subcommand that fails alone."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from mrcnn.data.coco import CocoDataset
from mrcnn.data.synthetic import generate
from mrcnn_bench.cli import commands as cli
from mrcnn_bench.cli import options as cli_options
from mrcnn_bench.reports import report
from mrcnn_bench.running import store
from mrcnn_bench.running.context import ContextOptions, make_context
from mrcnn_bench.running.records import Record, RunDocument, RunInfo

REPO = Path(__file__).resolve().parents[2]


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
    opts = cli_options.run_options(args)
    assert (opts.coco_split, opts.eval_root, opts.eval_split) == ("train", str(tmp_path), "train")
    ctx, _ = make_context(ContextOptions(opts.workload, opts.weights, 0, 1, False, opts.coco_root, opts.coco_split,
                                         opts.overrides))
    expected = CocoDataset(tmp_path, "train")
    assert len(ctx.images) == 2
    for i, image in enumerate(ctx.images):
        assert torch.equal(image, expected[i][0].float() / 255)


def test_a_missing_lazy_subcommand_fails_alone(monkeypatch, capsys):
    monkeypatch.setitem(cli.LAZY_COMMANDS, "export-time", ("mrcnn_bench.no_such_module", "help"))
    assert cli.main(["export-time", "--x"]) == 2
    assert "mrcnn_bench.no_such_module cannot be imported" in capsys.readouterr().err
