"""The accuracy gate (mrcnn_bench.gates.accuracy_gate, .accuracy_baseline): baseline parsing and location,
tolerance, pass/fail messages, errors. The recipes and injected faults are in test_accuracy_faults.py.

No training here: the gate's multi-minute CI run is a separate job (see results/accuracy/README.md).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mrcnn.recipes import get_recipe
from mrcnn_bench.gates import accuracy_gate
from mrcnn_bench.gates.accuracy_baseline import (
    BaselineError,
    BaselineRun,
    MetricBaseline,
    baseline_from_runs,
    baseline_runs,
    compare_to_baseline,
    default_baseline_path,
    false_fail_upper_bound,
    final_metrics,
    host_kind,
    kind_tolerance,
    load_baseline,
    measured_kinds,
    read_host,
    tolerance_across_kinds,
    tolerance_from_spread,
    write_host,
)
from mrcnn_bench.gates.accuracy_gate import AccuracyOptions, check_accuracy, main

REPO = Path(__file__).resolve().parents[2]


def write_baseline(path: Path, box=(0.30, 0.03), mask=(0.25, 0.02), recipe="ci") -> Path:
    doc = {
        "recipe": recipe,
        "metrics": {
            "bbox/AP": {"mean": box[0], "tolerance": box[1]},
            "segm/AP": {"mean": mask[0], "tolerance": mask[1]},
        },
    }
    path.write_text(json.dumps(doc))
    return path


# ------------------------------------------------------------------------------------------------
# Baseline and decision


def test_load_baseline_reads_mean_and_tolerance(tmp_path):
    base = load_baseline(write_baseline(tmp_path / "b.json"), "ci")
    assert base == {"bbox/AP": MetricBaseline(0.30, 0.03), "segm/AP": MetricBaseline(0.25, 0.02)}
    assert base["bbox/AP"].threshold == pytest.approx(0.27)


@pytest.mark.parametrize(
    "content, match",
    [
        (None, "not found"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", '"metrics" object'),
        ('{"metrics": {"bbox/AP": {"mean": 0.3, "tolerance": 0.1}}}', r'"segm/AP"'),
        ('{"metrics": {"bbox/AP": {"mean": "high", "tolerance": 0.1}, "segm/AP": {}}}', "mean"),
        ('{"metrics": {"bbox/AP": {"mean": 0.3, "tolerance": -1}, "segm/AP": {}}}', "tolerance"),
        ('{"recipe": "tiny", "metrics": {}}', "for recipe 'tiny', not 'ci'"),
    ],
)
def test_bad_baseline_file_gives_a_clear_error(tmp_path, content, match):
    path = tmp_path / "baseline.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BaselineError, match=match) as info:
        load_baseline(path, "ci")
    assert str(path) in str(info.value)


def test_baseline_of_other_recipe_settings_is_refused(tmp_path):
    settings = json.loads(json.dumps(get_recipe("ci").as_dict()))
    path = write_baseline(tmp_path / "b.json")
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "recipe_settings": settings}))
    assert load_baseline(path, "ci")["bbox/AP"].mean == pytest.approx(0.30)  # same settings: accepted
    path.write_text(json.dumps({**doc, "recipe_settings": {**settings, "description": "reworded"}}))
    assert load_baseline(path, "ci")  # a field that does not change the training: still accepted

    path.write_text(json.dumps({**doc, "recipe_settings": {**settings, "steps": settings["steps"] // 2}}))
    with pytest.raises(BaselineError, match=r"other settings of recipe 'ci' \(steps: baseline \d+, recipe now \d+\)"):
        load_baseline(path, "ci")


def test_committed_baseline_matches_the_recipe():
    """baselines/accuracy/ci.json stores the ci recipe's settings as Recipe.as_dict gives them now."""
    base = load_baseline(REPO / "baselines" / "accuracy" / "ci.json", "ci")
    assert set(base) == {"bbox/AP", "segm/AP"} and all(0 < b.threshold < b.mean for b in base.values())
    stored = json.loads((REPO / "baselines" / "accuracy" / "ci.json").read_text())["recipe_settings"]
    assert json.loads(json.dumps(get_recipe("ci").as_dict())) == stored


def test_committed_baseline_is_the_tolerance_rule_over_its_runs():
    """A change to the rule (or a hand edit of the file) without rewriting the baseline fails here:
    `accuracy-gate --write-baseline --keep-runs --from-runs` rewrites it from its stored runs."""
    path = REPO / "baselines" / "accuracy" / "ci.json"
    runs = baseline_runs(path, "ci")
    doc = json.loads(path.read_text())
    for name, base in load_baseline(path, "ci").items():
        by_kind: dict[str, list[float]] = {}
        for run in runs:
            by_kind.setdefault(run.kind, []).append(run.metrics[name])
        assert base.mean == pytest.approx(statistics.fmean(v for vs in by_kind.values() for v in vs))
        assert base.tolerance == pytest.approx(tolerance_across_kinds(by_kind))
        assert doc["metrics"][name]["per_kind"].keys() == by_kind.keys()


def test_default_baseline_is_found_from_the_working_directory(tmp_path, monkeypatch, capsys):
    """--baseline, else $MRCNN_BASELINES_DIR/accuracy/<recipe>.json, else ./baselines/accuracy/<recipe>.json."""
    monkeypatch.delenv("MRCNN_BASELINES_DIR", raising=False)
    monkeypatch.delenv("MRCNN_RESULTS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_baseline_path("ci") == Path("baselines") / "accuracy" / "ci.json"
    assert main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(Path("baselines") / "accuracy" / "ci.json") in err[0] and "not found" in err[0]

    monkeypatch.setenv("MRCNN_BASELINES_DIR", str(tmp_path / "elsewhere"))
    assert default_baseline_path("tiny") == tmp_path / "elsewhere" / "accuracy" / "tiny.json"
    (tmp_path / "elsewhere" / "accuracy").mkdir(parents=True)
    write_baseline(tmp_path / "elsewhere" / "accuracy" / "ci.json")
    assert load_baseline(default_baseline_path("ci"), "ci")["bbox/AP"] == MetricBaseline(0.30, 0.03)


def test_the_old_results_variable_alone_is_refused_naming_the_new_one(monkeypatch, capsys):
    """$MRCNN_RESULTS_DIR named the folder the baselines left: exit 2 naming $MRCNN_BASELINES_DIR, not 'not found'."""
    monkeypatch.delenv("MRCNN_BASELINES_DIR", raising=False)
    monkeypatch.setenv("MRCNN_RESULTS_DIR", "results")
    with pytest.raises(BaselineError, match=r"MRCNN_RESULTS_DIR is no longer read.*MRCNN_BASELINES_DIR"):
        default_baseline_path("ci")
    assert main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "MRCNN_BASELINES_DIR" in err[0]
    monkeypatch.setenv("MRCNN_BASELINES_DIR", "baselines")  # the new name wins when both are set
    assert default_baseline_path("ci") == Path("baselines") / "accuracy" / "ci.json"


def test_pass_and_fail_messages_name_metric_value_baseline_tolerance_and_shortfall(tmp_path):
    base = load_baseline(write_baseline(tmp_path / "b.json"))
    ok, messages = compare_to_baseline({"bbox/AP": 0.28, "segm/AP": 0.26}, base)
    assert ok and all("ok" in m for m in messages)

    ok, messages = compare_to_baseline({"bbox/AP": 0.20, "segm/AP": 0.24}, base)
    assert not ok
    box = next(m for m in messages if m.startswith("bbox/AP"))
    assert "0.2000" in box and "0.3000" in box and "0.0300" in box and "short by 0.0700" in box
    assert "ok" in next(m for m in messages if m.startswith("segm/AP"))

    # Exactly at the threshold passes; just under fails; a missing or NaN metric fails.
    assert compare_to_baseline({"bbox/AP": 0.27, "segm/AP": 0.23}, base)[0]
    assert not compare_to_baseline({"bbox/AP": 0.2699, "segm/AP": 0.23}, base)[0]
    assert not compare_to_baseline({"bbox/AP": 0.3}, base)[0]
    assert not compare_to_baseline({"bbox/AP": float("nan"), "segm/AP": 0.3}, base)[0]


def test_tolerance_is_k_std_with_a_floor():
    values = [0.30, 0.32, 0.34]  # sample std 0.02
    assert tolerance_from_spread(values, k=3, floor=0.01) == pytest.approx(0.06)
    assert tolerance_from_spread(values, k=3, floor=0.1) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="at least 2"):
        tolerance_from_spread([0.3])


def test_the_tolerance_gives_each_kind_its_room_for_a_one_percent_false_fail():
    """A kind whose runs sit lower, or spread wider, than the pooled runs widens the tolerance to hold
    its own false fail at 1%; a kind with one run counts only in the pooled mean and sd."""
    from scipy import stats

    same = {"a": [0.50, 0.51, 0.52], "b": [0.50, 0.51, 0.52]}
    point = {"bound": None}  # the 1% point estimate's room alone (the bound's is the next test's)
    assert tolerance_across_kinds(same, k=3, floor=0.0) == pytest.approx(kind_tolerance(0.51, same["a"]))
    room = stats.t.ppf(0.99, 2) * 0.01 * (1 + 1 / 3) ** 0.5  # t predictive, sd 0.01 over 3 runs
    assert kind_tolerance(0.51, same["a"], **point) == pytest.approx(room)
    low = {"a": [0.50, 0.51, 0.52], "b": [0.44, 0.45, 0.46]}  # b's level 0.03 below the pooled mean 0.48
    assert tolerance_across_kinds(low, k=0, floor=0.0, **point) == pytest.approx(0.03 + room)
    # With the kinds the same, the false fail of one more run of either at that tolerance is 1%.
    tol = tolerance_across_kinds(same, k=0, floor=0.0, **point)
    assert stats.t.cdf(-tol / (0.01 * (1 + 1 / 3) ** 0.5), 2) == pytest.approx(0.01)
    one = {"a": [0.50, 0.51, 0.52], "b": [0.2]}
    assert tolerance_across_kinds(one, k=3, floor=0.0) >= 3 * tolerance_from_spread([0.50, 0.51, 0.52, 0.2], 1, 0)
    assert tolerance_across_kinds({"a": [0.5, 0.5]}, k=3, floor=0.04) == 0.04  # two runs: no room of its own
    with pytest.raises(ValueError, match="at least 2"):
        kind_tolerance(0.5, [0.5])


@pytest.mark.parametrize("n", [3, 10, 20, 200])
def test_the_tolerance_holds_the_false_fails_upper_bound_at_five_percent(n):
    """Few runs: the bound's room sets the tolerance, and the upper 95% bound at the threshold is 5%
    exactly; many runs: the 1% point estimate's room does, and the bound lies below 5%."""
    from scipy import stats

    values = [0.5 + 0.01 * float(stats.norm.ppf((i + 0.5) / n)) for i in range(n)]
    mean = sum(values) / n
    tol = tolerance_across_kinds({"a": values}, k=0, floor=0.0)
    assert tol == pytest.approx(kind_tolerance(mean, values))
    bound = false_fail_upper_bound(values, mean - tol)
    point = kind_tolerance(mean, values, bound=None)
    if tol > point:
        assert bound == pytest.approx(0.05)
    else:
        assert tol == pytest.approx(point) and bound < 0.05
    assert (tol > point) == (n <= 20)  # the bound sets it at 20 runs and fewer; at 200 the point estimate
    # The bound is a bound: it lies above the point estimate, and falls as the threshold does.
    assert bound > stats.t.cdf(-tol / (statistics.stdev(values) * (1 + 1 / n) ** 0.5), n - 1)
    assert false_fail_upper_bound(values, mean - 2 * tol) < bound


def test_baseline_written_from_runs_keeps_each_run_with_its_host_kind(tmp_path):
    intel = {"cpu": "Intel(R) Xeon(R) Processor f6m207", "onednn_max_cpu_isa": None, "threads": 1}
    capped = {**intel, "onednn_max_cpu_isa": "AVX2"}
    runs = [BaselineRun(s, host, {"bbox/AP": 0.30 + 0.02 * s + d, "segm/AP": 0.20 + 0.02 * s, "bbox/AP50": 0.6})
            for s in range(3) for host, d in ((intel, 0.0), (capped, -0.01))]
    doc = baseline_from_runs("ci", runs, k=3, floor=0.01, commands=["x"])
    assert host_kind(capped) == "Intel(R) Xeon(R) Processor f6m207, oneDNN <= AVX2"
    assert doc["kinds"] == sorted({host_kind(intel), host_kind(capped)})
    box = doc["metrics"]["bbox/AP"]
    assert box["mean"] == pytest.approx(0.315)
    assert box["per_kind"][host_kind(capped)] == {"runs": 3, "mean": pytest.approx(0.31), "std": pytest.approx(0.02)}
    by_kind = {host_kind(h): [0.30 + 0.02 * s + d for s in range(3)] for h, d in ((intel, 0.0), (capped, -0.01))}
    assert box["tolerance"] == pytest.approx(tolerance_across_kinds(by_kind, 3, 0.01))
    assert [(r["seed"], r["kind"]) for r in doc["runs"][:2]] == [(0, host_kind(intel)), (0, host_kind(capped))]
    assert doc["environment"]["torch"] == torch.__version__
    path = tmp_path / "ci.json"
    path.write_text(json.dumps(doc))
    mask = doc["metrics"]["segm/AP"]["tolerance"]
    assert load_baseline(path, "ci")["segm/AP"] == MetricBaseline(pytest.approx(0.22), pytest.approx(mask))
    assert measured_kinds(path) == doc["kinds"]


def test_write_baseline_from_run_folders(tmp_path, capsys):
    for seed, ap in enumerate([0.1, 0.2, 0.3]):
        run = tmp_path / f"ci-s{seed}"
        run.mkdir()
        rows = [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5, "bbox/AP": ap, "segm/AP": ap / 2}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # Trained on another host: its record travels with the folder. A CPU no host reports, so that the
    # two runs without a record (this host, whatever it is) are always of another kind.
    elsewhere = {"cpu": "Elsewhere CPU f0m0", "onednn_max_cpu_isa": None, "threads": 1, "machine": "x86_64"}
    write_host(tmp_path / "ci-s2", elsewhere)
    assert read_host(tmp_path / "ci-s2") == elsewhere and read_host(tmp_path / "ci-s0") is None
    out = tmp_path / "baseline.json"
    argv = ["--recipe", "ci", "--write-baseline", "--baseline", str(out), "--floor", "0.01", "--from-runs"]
    assert main(argv + [str(tmp_path / f"ci-s{s}") for s in range(3)]) == 0
    base = load_baseline(out, "ci")
    assert base["bbox/AP"].mean == pytest.approx(0.2) and base["bbox/AP"].tolerance == pytest.approx(0.3)
    assert final_metrics(tmp_path / "ci-s2")["bbox/AP"] == 0.3
    runs = json.loads(out.read_text())["runs"]
    assert runs[2]["kind"] == "Elsewhere CPU f0m0" and runs[2]["seed"] == 2
    assert runs[0]["host"]["assumed"] and runs[0]["kind"] != "Elsewhere CPU f0m0"  # no record: this host, said so

    (tmp_path / "run0").mkdir()  # a folder whose name does not give its seed: exit 2 with the reason
    assert main([*argv, str(tmp_path / "run0")]) == 2
    assert "must be named <anything>-s<seed>" in capsys.readouterr().err
    (tmp_path / "ci-s2" / "host.json").write_text("[1, 2")  # a damaged host record: exit 2 naming it
    assert main([*argv, str(tmp_path / "ci-s2")]) == 2
    assert "host.json" in capsys.readouterr().err


def test_write_baseline_keeps_the_stored_runs_and_replaces_a_rerun_seed(tmp_path, capsys):
    intel = {"cpu": "Intel(R) Xeon(R) Processor f6m207", "onednn_max_cpu_isa": None, "threads": 1}
    amd = {**intel, "cpu": "AMD EPYC f25m17"}

    def run_folder(name: str, ap: float, host: dict) -> str:
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text(json.dumps({"step": 2, "bbox/AP": ap, "segm/AP": ap / 2}) + "\n")
        write_host(tmp_path / name, host)
        return str(tmp_path / name)

    out = tmp_path / "baseline.json"
    argv = ["--recipe", "ci", "--write-baseline", "--baseline", str(out), "--floor", "0.01"]
    assert main([*argv, "--from-runs", run_folder("a-s0", 0.30, intel), run_folder("a-s1", 0.40, intel)]) == 0
    # Seed 1 again on the same kind (it replaces the stored run), seed 0 on another kind (added).
    assert main([*argv, "--keep-runs", "--from-runs", run_folder("b-s1", 0.50, intel),
                 run_folder("b-s0", 0.20, amd)]) == 0
    doc = json.loads(out.read_text())
    assert [(r["kind"], r["seed"], r["metrics"]["bbox/AP"]) for r in doc["runs"]] == [
        ("AMD EPYC f25m17", 0, 0.20), ("Intel(R) Xeon(R) Processor f6m207", 0, 0.30),
        ("Intel(R) Xeon(R) Processor f6m207", 1, 0.50)]
    assert doc["metrics"]["bbox/AP"]["mean"] == pytest.approx(1 / 3)
    assert any("a-s0" in c for c in doc["commands"]) and any("b-s0" in c for c in doc["commands"])

    doc["runs"][0]["metrics"] = {"bbox/AP": "high"}  # a damaged stored run: exit 2 naming the entry
    out.write_text(json.dumps(doc))
    assert main([*argv, "--keep-runs", "--from-runs", str(tmp_path / "b-s1")]) == 2
    assert '"runs"[0]' in capsys.readouterr().err
    doc["runs"][0]["metrics"] = {"bbox/AP": 0.2, "segm/AP": 0.1}
    out.write_text(json.dumps(doc | {"metrics": {}}))  # the stored runs alone, under the rule as it is now
    assert main([*argv, "--keep-runs", "--from-runs"]) == 2  # ...but the file must load as a baseline first
    out.write_text(json.dumps(doc))
    assert main([*argv, "--keep-runs", "--from-runs"]) == 0
    assert len(json.loads(out.read_text())["runs"]) == 3
    assert main([*argv, "--from-runs"]) == 2  # no runs at all: said
    assert "at least 2 runs" in capsys.readouterr().err
    missing = ["--recipe", "ci", "--write-baseline", "--baseline", str(tmp_path / "none.json"), "--keep-runs"]
    assert main([*missing, "--from-runs", str(tmp_path / "b-s1")]) == 2  # nothing to keep: said, not a new file
    assert "not found" in capsys.readouterr().err and not (tmp_path / "none.json").exists()


def test_missing_checkpoint_is_a_clear_error(tmp_path, capsys):
    baseline = write_baseline(tmp_path / "b.json")
    missing = tmp_path / "nope" / "checkpoint_0000010.pt"
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        check_accuracy(AccuracyOptions(checkpoint=missing, baseline=baseline))
    assert main(["--checkpoint", str(missing), "--baseline", str(baseline)]) == 2
    assert "checkpoint not found" in capsys.readouterr().err


def test_gate_refuses_bad_inputs_before_any_work(tmp_path, capsys):
    assert main(["--baseline", str(tmp_path / "absent.json")]) == 2
    assert "not found" in capsys.readouterr().err
    baseline = write_baseline(tmp_path / "b.json")
    with pytest.raises(ValueError, match="unknown fault"):
        check_accuracy(AccuracyOptions(baseline=baseline, fault="cosmic_ray"))
    with pytest.raises(ValueError, match="unknown recipe"):
        check_accuracy(AccuracyOptions(recipe="huge", baseline=baseline))
    assert main(["--recipe", "huge", "--baseline", str(baseline)]) == 2
    assert "unknown recipe 'huge'" in capsys.readouterr().err


def test_check_accuracy_on_a_checkpoint_reports_failures(tmp_path, monkeypatch):
    """The decision glue, with the evaluation replaced by fixed metrics (no data set, no training)."""
    baseline = write_baseline(tmp_path / "b.json")
    checkpoint = tmp_path / "checkpoint_0000001.pt"
    checkpoint.write_bytes(b"")
    measured = {"bbox/AP": 0.31, "segm/AP": 0.10, "bbox/AP50": 0.5}
    monkeypatch.setattr(accuracy_gate, "evaluate_checkpoint", lambda path, recipe, data_base: dict(measured))
    result = check_accuracy(AccuracyOptions(checkpoint=checkpoint, baseline=baseline))
    assert not result.passed and result.metrics == measured
    assert result.baseline == {"bbox/AP": 0.30, "segm/AP": 0.25} and result.tolerance["segm/AP"] == 0.02
    assert len(result.failures) == 1 and result.failures[0].startswith("segm/AP = 0.1000")
    assert "FAIL" in result.report() and "short by 0.1300" in result.report()
    with pytest.raises(ValueError, match="cannot apply to an existing checkpoint"):
        check_accuracy(AccuracyOptions(checkpoint=checkpoint, baseline=baseline, fault="box_coder"))

    measured["segm/AP"] = 0.24
    result = check_accuracy(AccuracyOptions(checkpoint=checkpoint, baseline=baseline))
    assert result.passed and result.failures == [] and "PASS" in result.report()


def test_the_gate_trains_on_the_baselines_thread_count_and_gives_it_back(tmp_path, monkeypatch):
    """The seeds were trained on one thread: the gate's training runs on --accuracy-threads (default 1)."""
    from mrcnn_bench.cli import commands as cli

    seen = []

    def fake_training(recipe, out_dir, **kwargs):
        seen.append(torch.get_num_threads())
        return SimpleNamespace(metrics={"bbox/AP": 0.9, "segm/AP": 0.9})

    monkeypatch.setattr(accuracy_gate, "train_recipe", fake_training)
    monkeypatch.setattr(accuracy_gate, "default_baseline_path", lambda recipe: write_baseline(tmp_path / "b.json"))
    torch.set_num_threads(2)
    assert cli.main(["gate", "--skip-compile", "--no-progress"]) == 0
    assert cli.main(["gate", "--skip-compile", "--no-progress", "--accuracy-threads", "2"]) == 0
    assert seen == [1, 2] and torch.get_num_threads() == 2


def test_the_gate_names_its_host_kind_and_says_when_the_baseline_never_ran_there(tmp_path, monkeypatch):
    monkeypatch.setattr(accuracy_gate, "train_recipe",
                        lambda recipe, out_dir, **kw: SimpleNamespace(metrics={"bbox/AP": 0.9, "segm/AP": 0.9}))
    baseline = write_baseline(tmp_path / "b.json")
    out = tmp_path / "run"
    result = check_accuracy(AccuracyOptions(baseline=baseline, out_dir=out))
    here = host_kind(read_host(out))
    assert result.kind == here and f"on {here}" in result.report()
    assert not result.kind_measured and "the false-fail rate on it is not known" in result.report()
    doc = json.loads(baseline.read_text())
    baseline.write_text(json.dumps({**doc, "kinds": ["AMD EPYC f25m17", here]}))
    result = check_accuracy(AccuracyOptions(baseline=baseline, out_dir=out))
    assert result.passed and result.kind_measured and "not known" not in result.report()
