"""The history across commits: the ruler, one case against it, the parts of a commit, the asv suite's reading.

The asv tools' logic (flags, spread, table, screenshots) is tested in test_asv_tools.py."""

from __future__ import annotations

import ast
import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from mrcnn_bench.base.errors import UsageError  # noqa: E402
from mrcnn_bench.history import asv_machine, fixed_accuracy, interleaved, ruler  # noqa: E402
from mrcnn_bench.history import commit as history  # noqa: E402
from mrcnn_bench.running import store  # noqa: E402


def test_ruler_never_imports_the_library():
    """A commit that edits mrcnn must not move the ruler: nothing of it may come from mrcnn."""
    tree = ast.parse((ROOT / "bench/mrcnn_bench/history/ruler.py").read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert imported and not [m for m in imported if m and m.split(".")[0] in ("mrcnn", "mrcnn_bench")]


def test_ruler_is_the_same_every_time_and_detects_finite_boxes():
    a, b = ruler.ruler_model().state_dict(), ruler.ruler_model().state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(x, y) for x, y in zip(ruler.ruler_images(), ruler.ruler_images(), strict=True))
    state = torch.get_rng_state()
    out = ruler.Ruler().call(0)[0]
    assert torch.equal(state, torch.get_rng_state())  # building it leaves the caller's RNG alone
    assert len(out["boxes"]) > 0 and torch.isfinite(out["boxes"]).all()


def test_ruler_training_step_leaves_the_weights_unchanged():
    r = ruler.Ruler("training")
    before = {k: v.clone() for k, v in r.model.state_dict().items()}
    r.call(0)
    assert all(torch.equal(before[k], v) for k, v in r.model.state_dict().items())
    with pytest.raises(ValueError, match="phase"):
        ruler.Ruler("serving")


def test_interleave_alternates_which_goes_first():
    order: list[str] = []
    case_s, ruler_s = interleaved.interleave(lambda i: order.append("case"), lambda i: order.append("ruler"), 4)
    assert order == ["ruler", "case", "case", "ruler", "ruler", "case", "case", "ruler"]
    assert len(case_s) == len(ruler_s) == 4


def test_measure_one_case_against_the_ruler():
    record = interleaved.measure("static/eager", rounds=3, threads=1)
    assert len(record.case_s) == len(record.ruler_s) == 3
    assert record.rounds == 3 and record.threads == 1 and record.phase == "inference"
    assert 0 < record.ratio_q1 <= record.ratio_median <= record.ratio_q3
    assert record.seconds_median > 0 and record.ruler_seconds_median > 0 and record.first_result_s > 0
    assert record.flops and record.flops > 1e9
    assert interleaved.CaseRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    with pytest.raises(ValueError, match="rounds"):
        interleaved.measure("static/eager", rounds=2)
    with pytest.raises(ValueError, match="unknown case"):
        interleaved.measure("static/nope")


def test_run_part_tells_cannot_run_here_from_failed(tmp_path):
    skipped = history.run_part(["mrcnn_bench.history.fixed_accuracy", "evaluate", "--root", str(tmp_path / "none")])
    assert skipped.skipped and skipped.record is None and "make asv-fixture" in skipped.error
    failed = history.run_part(["mrcnn_bench.gates.compile_probe", "static/nope", "tiny"])
    assert not failed.skipped and failed.record is None and "static/nope" in failed.error
    with pytest.raises(RuntimeError, match="static/nope"):
        failed.value("uncached_compile")


def test_fixture_scores_this_checkout(tmp_path):
    """The accuracy part end to end on a two-image fixture (random weights: any AP in [0, 1])."""
    from mrcnn.data.synthetic import generate
    from mrcnn.recipes import get_recipe
    from mrcnn.weights import synthetic_weights

    fixture = fixed_accuracy.Fixture(tmp_path)
    assert not fixture.ready() and "make asv-fixture" in fixture.missing_reason()
    generate(tmp_path / "data" / "set", 2, seed=0, split="train", progress=False)
    torch.save(synthetic_weights(get_recipe("ci").config()), fixture.model)
    fixture.meta.write_text(
        json.dumps({"recipe": "ci", "data_root": "data/set", "split": "train", "model_sha256": "x"})
    )
    record = fixed_accuracy.evaluate_fixture(fixture, threads=1)
    assert record.images == 2 and 0.0 <= record.box_ap <= 1.0 and 0.0 <= record.mask_ap <= 1.0


def test_asv_machine_is_named_by_cpu_cores_and_fixture(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8488C\nflags\t: fpu\n")
    assert store.cpu_model(cpuinfo) == "Intel(R) Xeon(R) Platinum 8488C"
    assert asv_machine.slug(store.cpu_model(cpuinfo)) == "intel-r-xeon-r-platinum-8488c"
    assert store.cpu_label(cpuinfo) == "Intel(R) Xeon(R) Platinum 8488C"  # no family and model lines
    # Two generations that a virtual machine names alike are told apart by family and model.
    cpuinfo.write_text("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n")
    assert asv_machine.slug(store.cpu_label(cpuinfo)) == "amd-epyc-f25m17"
    fixture = fixed_accuracy.Fixture(tmp_path / "fx")
    with pytest.raises(FileNotFoundError, match="make asv-fixture"):
        asv_machine.machine_name(fixture, cpu="AMD EPYC", cores=2)
    fixture.root.mkdir()
    fixture.model.write_bytes(b"weights")
    fixture.meta.write_text(json.dumps({"model_sha256": "3727811562f609a0" * 4}))
    assert asv_machine.machine_name(fixture, cpu="AMD EPYC", cores=2) == "amd-epyc-2c-fx37278115"
    # Another fixture on the same host is another series.
    fixture.meta.write_text(json.dumps({"model_sha256": "df5e631b" + "0" * 56}))
    assert asv_machine.machine_name(fixture, cpu="AMD EPYC", cores=2) == "amd-epyc-2c-fxdf5e631b"
    # A digest cut short or not hex is a damaged fixture: one line that says how to remake it.
    for bad in ("3727811562f609a0", "g" * 64, 7):
        fixture.meta.write_text(json.dumps({"model_sha256": bad}))
        with pytest.raises(UsageError, match="make asv-fixture"):
            asv_machine.machine_name(fixture, cpu="AMD EPYC", cores=2)


def test_asv_machine_registers_the_host_fields(tmp_path, monkeypatch):
    """`asv machine --yes --machine NAME` alone stores the name only; the registered entry has the host's fields."""
    pytest.importorskip("asv")
    monkeypatch.setenv("HOME", str(tmp_path))
    asv_machine.register("amd-epyc-2c-fx37278115")
    entry = json.loads((tmp_path / ".asv-machine.json").read_text())["amd-epyc-2c-fx37278115"]
    assert entry["machine"] == "amd-epyc-2c-fx37278115"
    assert entry["num_cpu"] and entry["cpu"] and entry["os"] and entry["arch"] and entry["ram"]
    assert entry == asv_machine.stable_fields(entry)


def test_asv_machine_keeps_one_series_when_the_vm_build_changes(tmp_path):
    """A new kernel build or a few hundred kB of memory must not split a machine's graphs in two."""
    old = {"arch": "x86_64", "cpu": "AMD EPYC", "machine": "m", "num_cpu": "2",
           "os": "Linux 6.18.44-fc-v669", "ram": "25276502016"}
    new = asv_machine.stable_fields({**old, "os": "Linux 6.18.44-fc-v769", "ram": "25276063744"})
    assert new == asv_machine.stable_fields(old) == {**old, "os": "Linux 6.18", "ram": "24 GiB"}
    assert asv_machine.stable_fields({"os": "Darwin", "ram": ""}) == {"os": "Darwin", "ram": ""}
    (tmp_path / "m").mkdir()
    result = {"commit_hash": "abc", "params": {**old, "python": "3.11"}, "results": {"x": [1.5]}, "version": 2}
    (tmp_path / "m" / "abc-env-1.json").write_text(json.dumps(result))
    (tmp_path / "m" / "machine.json").write_text(json.dumps({**old, "version": 1}, indent=4))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "def-env-1.json").write_text(json.dumps(result))
    assert asv_machine.align_results(tmp_path, new) == 2
    aligned = json.loads((tmp_path / "m" / "abc-env-1.json").read_text())
    assert aligned == {**result, "params": {**new, "python": "3.11"}}  # the measured values untouched
    assert json.loads((tmp_path / "m" / "machine.json").read_text()) == {**new, "version": 1}
    assert json.loads((tmp_path / "other" / "def-env-1.json").read_text()) == result  # another machine's
    assert asv_machine.align_results(tmp_path, new) == 0  # idempotent
    (tmp_path / "m" / "notes.json").write_text('{"no": "params"}')
    assert asv_machine.align_results(tmp_path, new) == 0  # not a result file: left alone
    (tmp_path / "m" / "broken.json").write_text("{")
    with pytest.raises(ValueError, match=r"broken\.json is not asv's JSON"):
        asv_machine.align_results(tmp_path, new)


@pytest.fixture
def suite():
    sys.path.insert(0, str(ROOT / "bench" / "asv_suite"))
    try:
        yield importlib.import_module("benchmarks")
    finally:
        sys.path.remove(str(ROOT / "bench" / "asv_suite"))


def _part(record=None, error=None, skipped=False):
    return {"record": record, "error": error, "seconds": 1.0, "skipped": skipped}


def test_asv_suite_reads_one_record_per_commit(suite):
    cache = {
        "timing": {
            "static/eager": _part(
                {
                    "ratio_median": 0.8,
                    "seconds_median": 0.2,
                    "first_result_s": 1.0,
                    "peak_memory_gb": 1.5,
                    "flops": 1e10,
                    "loadavg_after": 1.0,
                }
            ),
            "static/xla": _part(error="interleaved static/xla exited 1: boom"),
            "torchvision/eager": _part(error="cannot run here", skipped=True),
            "static/train": _part({"ratio_median": 1.1, "seconds_median": 1.0, "images_per_call": 2}),
        },
        "compiles": {"static/xla": _part({"uncached_compile": 2, "fallback_ops": 0})},
        "accuracy": _part({"box_ap": 0.8, "mask_ap": 0.6}),
    }
    latency, training, compiles, accuracy = suite.Latency(), suite.Training(), suite.Compiles(), suite.Accuracy()
    latency.setup(cache, "static/eager")
    assert latency.track_ratio(cache, "static/eager") == 0.8
    assert latency.track_seconds(cache, "static/eager") == 0.2
    with pytest.raises(NotImplementedError, match="cannot run here"):  # asv: skipped
        latency.setup(cache, "torchvision/eager")
    with pytest.raises(RuntimeError, match="boom"):  # asv: failed, never a number
        latency.track_ratio(cache, "static/xla")
    assert training.track_seconds_per_image(cache, "static/train") == 0.5
    assert compiles.track_count(cache, "static/xla", "xla_compiles") == 2
    with pytest.raises(NotImplementedError, match="no graphs counter"):
        compiles.setup(cache, "static/xla", "graphs")
    stages = suite.Stages()
    with pytest.raises(NotImplementedError, match="stage backbone not measured"):  # measured before stages
        stages.setup(cache, "static/eager", "backbone")
    cache["timing"]["static/eager"]["record"]["stage_ratio_median"] = {"backbone": 1.25}
    stages.setup(cache, "static/eager", "backbone")
    assert stages.track_ratio(cache, "static/eager", "backbone") == 1.25
    assert suite.STAGED == ["torchvision/eager", "static/eager"]  # the eager cases: compiled ones have no stages
    with pytest.raises(RuntimeError, match="boom"):  # a failed measurement fails its stages too, never skips them
        stages.setup(cache, "static/xla", "backbone")
        stages.track_ratio(cache, "static/xla", "backbone")
    assert accuracy.track_box_error(cache) == pytest.approx(0.2)
    assert accuracy.track_mask_error(cache) == pytest.approx(0.4)
    for method in (suite.Latency.track_ratio, suite.Training.track_ratio):
        assert "lower is better" in method.unit


def test_asv_find_can_measure_one_case(suite, monkeypatch):
    monkeypatch.delenv(suite.CASES_ENV, raising=False)
    assert suite.measured_cases() == suite.TRACKED
    monkeypatch.setenv(suite.CASES_ENV, " static/inductor ,")
    assert suite.measured_cases() == ("static/inductor",)
    monkeypatch.setenv(suite.CASES_ENV, "static/inductor,static/nope")
    with pytest.raises(ValueError, match=r"not tracked: \['static/nope'\]"):
        suite.measured_cases()
    cache = {"timing": {"static/inductor": _part({"ratio_median": 0.8})}, "compiles": {}, "accuracy": _part()}
    with pytest.raises(NotImplementedError, match="static/eager: not measured"):  # asv: skipped
        suite.Latency().setup(cache, "static/eager")


def test_asv_suite_shares_one_measurement_per_commit(suite):
    """asv keys setup_cache by its source line: every class must inherit the same one."""
    classes = [suite.Latency, suite.Stages, suite.Training, suite.Compiles, suite.Accuracy]
    assert {c.setup_cache for c in classes} == {suite._Commit.setup_cache}


def test_rounds_fill_the_time_budget_within_bounds():
    assert interleaved.rounds_for(0.4, 40.0) == 100
    assert interleaved.rounds_for(10.0, 40.0) == interleaved.MIN_ROUNDS
    assert interleaved.rounds_for(0.01, 40.0) == interleaved.MAX_ROUNDS
