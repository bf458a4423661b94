"""The history across commits: the ruler, one case against it, the parts of a commit, the asv suite's reading."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from mrcnn_bench import asv_machine, fixed_accuracy, history, interleaved, ruler  # noqa: E402


def test_ruler_never_imports_the_library():
    """A commit that edits mrcnn must not move the ruler: nothing of it may come from mrcnn."""
    tree = ast.parse((ROOT / "bench/mrcnn_bench/ruler.py").read_text())
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
    skipped = history.run_part(["mrcnn_bench.fixed_accuracy", "evaluate", "--root", str(tmp_path / "none")])
    assert skipped.skipped and skipped.record is None and "make asv-fixture" in skipped.error
    failed = history.run_part(["mrcnn_bench.compile_probe", "static/nope", "tiny"])
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
    assert asv_machine.cpu_model(cpuinfo) == "Intel(R) Xeon(R) Platinum 8488C"
    assert asv_machine.slug(asv_machine.cpu_model(cpuinfo)) == "intel-r-xeon-r-platinum-8488c"
    assert asv_machine.cpu_label(cpuinfo) == "Intel(R) Xeon(R) Platinum 8488C"  # no family and model lines
    # Two generations that a virtual machine names alike are told apart by family and model.
    cpuinfo.write_text("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n")
    assert asv_machine.slug(asv_machine.cpu_label(cpuinfo)) == "amd-epyc-f25m17"
    fixture = fixed_accuracy.Fixture(tmp_path / "fx")
    with pytest.raises(FileNotFoundError, match="make asv-fixture"):
        asv_machine.machine_name(fixture, cpu="AMD EPYC", cores=2)
    fixture.root.mkdir()
    fixture.model.write_bytes(b"weights")
    fixture.meta.write_text(json.dumps({"model_sha256": "3727811562f609a0"}))
    assert asv_machine.machine_name(fixture, cpu="AMD EPYC", cores=2) == "amd-epyc-2c-fx37278115"
    # Another fixture on the same host is another series.
    fixture.meta.write_text(json.dumps({"model_sha256": "df5e631b00000000"}))
    assert asv_machine.machine_name(fixture, cpu="AMD EPYC", cores=2) == "amd-epyc-2c-fxdf5e631b"


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
    classes = [suite.Latency, suite.Training, suite.Compiles, suite.Accuracy]
    assert {c.setup_cache for c in classes} == {suite._Commit.setup_cache}


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flags_name_the_machine_of_each_step(tmp_path):
    """asv leaves the machine out of a flag's parameters when only one machine has results."""
    graph = "graphs/arch-x86_64/branch-asv-scratch/cpu-AMD EPYC/machine-amd-epyc-2c-fx37278115/python-3.11/x.json"
    (tmp_path / "index.json").write_text(json.dumps({"revision_to_hash": {"7": "abc", "9": "def"}}))
    (tmp_path / "regressions.json").write_text(json.dumps({"regressions": [
        ["benchmarks.Latency.track_ratio('static/eager')", graph, {"branch": "asv-scratch"}, 0, 1.1, 1.0,
         [[7, 9, 1.0, 1.1]]],
        ["benchmarks.Accuracy.track_box_error", graph, {"machine": "other"}, 0, 0.9, 0.2, [[6, 7, 0.2, 0.9]]],
    ]}))
    rows = _script("asv_flags").flags(tmp_path)
    assert [(r["machine"], r["branch"], r["commit"], r["after"]) for r in rows] == [
        ("amd-epyc-2c-fx37278115", "asv-scratch", "def", 1.1), ("other", "", "abc", 0.9)
    ]


def test_flags_verdict_holds_the_range_and_names_main_s_steps():
    """Held flags on the range must be its injected commits; one on main's history is named, not counted."""
    verdict = _script("asv_flags").verdict
    kinds = {"s1": "slowdown", "r1": "recompile", "a1": "accuracy", "n1": "noop", "n2": "noop"}

    def row(commit, benchmark="benchmarks.Latency.track_ratio('static/eager')"):
        return {"benchmark": benchmark, "commit": commit}

    injected = [row("s1"), row("r1", "benchmarks.Compiles.track_count('static/xla', 'xla_compiles')"),
                row("a1", "benchmarks.Accuracy.track_box_error")]
    ok, lines = verdict([*injected, row("n1", "benchmarks.Latency.track_seconds('static/eager')"),
                         row("5505aa86fb00")], kinds)
    assert ok and "3 of the 3 injected commits and 0 other" in lines[0]
    assert lines[1].startswith("Held metrics on main's commits: 1 commit(s) flagged (5505aa86fb)")
    ok, lines = verdict([*injected, row("n2")], kinds)
    assert not ok and "1 other commit(s)" in lines[0] and "does NOT hold" in lines[0]
    ok, lines = verdict(injected[:2], kinds)
    assert not ok and "2 of the 3" in lines[0] and lines[1].endswith("0 commit(s) flagged.")


def test_spread_summary_of_repeated_runs(tmp_path):
    module = _script("history_spread")
    for k, (ratio, seconds) in enumerate(((1.00, 0.20), (1.02, 0.25), (0.99, 0.30)), 1):
        record = {
            "ratio_median": ratio,
            "seconds_median": seconds,
            "ruler_seconds_median": seconds / ratio,
            "first_result_s": 1.0,
            "peak_memory_gb": 1.0,
            "loadavg_after": 0.5,
        }
        run = {"timing": {"static/eager": _part(record)}, "compiles": {}, "accuracy": _part(skipped=True)}
        (tmp_path / f"run_{k}.json").write_text(json.dumps(run))
    table = module.summarise(tmp_path)
    assert table.loc["static/eager ratio", "spread"] == pytest.approx(0.03 / 1.00)
    assert table.loc["static/eager seconds", "spread"] == pytest.approx(0.10 / 0.25)
    assert table.loc["static/eager ratio", "cv"] == pytest.approx(np.std([1.00, 1.02, 0.99], ddof=1) / np.mean(
        [1.00, 1.02, 0.99]))
    assert (tmp_path / "spread.md").read_text().startswith("# A/A spread over 3 runs")


def test_rounds_fill_the_time_budget_within_bounds():
    assert interleaved.rounds_for(0.4, 40.0) == 100
    assert interleaved.rounds_for(10.0, 40.0) == interleaved.MIN_ROUNDS
    assert interleaved.rounds_for(0.01, 40.0) == interleaved.MAX_ROUNDS


def _record(case: str, ratios: list[float]) -> interleaved.CaseRecord:
    ruler_s = [0.2] * len(ratios)
    return interleaved.CaseRecord(
        case=case, phase="inference", rounds=len(ratios), threads=2, images_per_call=1,
        case_s=[r * 0.2 for r in ratios], ruler_s=ruler_s, ratio_median=sorted(ratios)[len(ratios) // 2],
        ratio_q1=min(ratios), ratio_q3=max(ratios), seconds_median=0.2, ruler_seconds_median=0.2,
        first_result_s=1.0, peak_memory_gb=1.0, flops=1e9, loadavg_before=0.1, loadavg_after=0.2,
        ratio_per_process=[sorted(ratios)[len(ratios) // 2]])


def test_processes_pool_into_the_median_of_their_medians():
    records = [_record("static/eager", [1.00, 1.01, 1.02]), _record("static/eager", [1.10, 1.11, 1.12]),
               _record("static/eager", [1.03, 1.04, 1.05])]
    pooled = interleaved.pool(records)
    assert pooled.ratio_median == pytest.approx(1.04) and pooled.ratio_per_process == pytest.approx([1.01, 1.11, 1.04])
    assert pooled.rounds == 9 and pooled.processes == 3 and len(pooled.case_s) == 9
    assert interleaved.CaseRecord.from_dict(json.loads(json.dumps(pooled.to_dict()))) == pooled
    with pytest.raises(ValueError, match="different cases"):
        interleaved.pool([records[0], _record("static/xla", [1.0])])


def test_a_commit_runs_process_p_of_every_case_before_process_p_plus_1(monkeypatch):
    calls: list[list[str]] = []

    def fake(args, timeout=history.PART_TIMEOUT_S):
        calls.append(list(args))
        if args[0] == "mrcnn_bench.interleaved":
            if args[1] == "static/xla" and len(calls) > 3:
                return history.Part(None, "static/xla: PJRT_DEVICE is not set", 1.0, skipped=True)
            return history.Part(_record(args[1], [1.0 + len(calls) / 100]).to_dict(), None, 2.0)
        return history.Part({}, None, 1.0)

    monkeypatch.setattr(history, "run_part", fake)
    record = history.measure_commit(cases=("static/eager", "static/xla"), budget_s=30.0, accuracy=False,
                                    processes=3)
    timed = [(c[1], c[3]) for c in calls if c[0] == "mrcnn_bench.interleaved"]
    assert timed == [("static/eager", "10.0"), ("static/xla", "10.0")] * 3
    eager = record.timing["static/eager"]
    assert eager.record["processes"] == 3 and eager.seconds == 6.0
    assert eager.record["ratio_per_process"] == pytest.approx([1.01, 1.03, 1.05])
    xla = record.timing["static/xla"]  # one process could not run: no figure from the other two
    assert xla.skipped and xla.record is None and "PJRT_DEVICE" in xla.error


def test_by_default_inference_cases_get_several_processes_and_training_one_with_the_whole_budget(monkeypatch):
    calls: list[list[str]] = []

    def fake(args, timeout=history.PART_TIMEOUT_S):
        calls.append(list(args))
        return history.Part(_record(args[1], [1.0]).to_dict(), None, 1.0)

    monkeypatch.setattr(history, "run_part", fake)
    record = history.measure_commit(cases=("static/eager", "static/train"), budget_s=40.0, accuracy=False)
    n = history.PROCESSES["inference"]
    assert n > 1 and history.PROCESSES["training"] == 1
    timed = [(c[1], float(c[3])) for c in calls]
    assert timed == [("static/eager", 40.0 / n), ("static/train", 40.0)] + [("static/eager", 40.0 / n)] * (n - 1)
    assert record.timing["static/eager"].record["processes"] == n
    assert record.timing["static/train"].record["processes"] == 1


def _asv_result(folder: Path, commit: str, date_ms: int, ratio: float, box_error: float) -> None:
    """A result file as asv writes it (api version 2), with the benchmarks asv_table reads."""
    columns = ["result", "params", "version", "started_at", "duration"]
    latency = ["'torchvision/eager'", "'static/eager'"]
    counts = [["'static/xla'", "'static/inductor'"], ["'xla_compiles'", "'fallback_ops'", "'graphs'", "'graph_breaks'",
                                                      "'recompiles'"]]
    results = {
        "benchmarks.Latency.track_ratio": [[1.0, ratio], [latency], "v", date_ms, 1.0],
        "benchmarks.Training.track_ratio": [[1.2], [["'static/train'"]], "v", date_ms, 1.0],
        "benchmarks.Compiles.track_count": [[2, 0, None, None, None, None, None, 2, 0, 1], counts, "v", date_ms, 1.0],
        "benchmarks.Accuracy.track_box_error": [[box_error], [], "v", date_ms, 1.0],
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "machine.json").write_text(json.dumps({"machine": folder.name, "version": 1}))
    (folder / f"{commit[:8]}-env-x.json").write_text(json.dumps({
        "commit_hash": commit, "env_name": "env-x", "date": date_ms, "params": {"machine": folder.name},
        "python": "3.11", "requirements": {}, "env_vars": {}, "result_columns": columns, "results": results,
        "durations": {}, "version": 2,
    }))


def test_asv_table_orders_commits_by_date_and_reads_every_held_metric(tmp_path):
    module = _script("asv_table")
    machine = tmp_path / "m1"
    _asv_result(machine, "b" * 40, 2_000_000_000_000, 1.10, 0.9)
    _asv_result(machine, "a" * 40, 1_000_000_000_000, 0.98, 0.2)
    frame = module.table(tmp_path, "m1")
    assert list(frame["commit"]) == ["aaaaaaaa", "bbbbbbbb"]
    assert list(frame["static/eager"]) == [0.98, 1.10] and list(frame["static/train"]) == [1.2, 1.2]
    assert list(frame["compiles (xla; inductor)"]) == ["2, 0; 2, 0, 1"] * 2
    assert list(frame["1 - box AP"]) == [0.2, 0.9] and frame["1 - mask AP"].isna().all()
    out = tmp_path / "t.md"
    assert module.main(["m1", "--results", str(tmp_path), "--out", str(out)]) == 0
    assert out.read_text().startswith("# m1: 2 commits")
    assert module.main(["nothing", "--results", str(tmp_path)]) == 2


def test_asv_table_levels_show_a_step_in_either_direction(tmp_path):
    """An improvement is a level too: the regressions page would not list it."""
    module = _script("asv_table")
    for k, ratio in enumerate((1.30, 1.31, 1.29, 1.00, 1.01, 0.99)):
        _asv_result(tmp_path / "m1", f"{k}" * 40, 1_000_000_000_000 + k * 1000, ratio, 0.2)
    levels = module.levels(module.table(tmp_path, "m1"))
    eager = levels[levels["ratio"] == "static/eager"]
    assert list(eager["from"]) == ["00000000", "33333333"] and list(eager["commits"]) == [3, 3]
    assert list(levels[levels["ratio"] == "static/train"]["commits"]) == [6]


def test_asv_table_keeps_the_commits_revs_names(tmp_path):
    """One machine may hold main's history and the scratch range, which interleave by date."""
    module = _script("asv_table")
    repo = tmp_path / "repo"
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "--quiet", str(repo)], check=True)
    hashes = []
    for k in range(3):
        subprocess.run([*git, "commit", "--quiet", "--allow-empty", "-m", f"c{k}"], check=True)
        done = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        hashes.append(done.stdout.strip())
    results = tmp_path / "results"
    for k, commit in enumerate(hashes):
        _asv_result(results / "m1", commit, 1_000_000_000_000 + k * 1000, 1.0, 0.2)
    _asv_result(results / "m1", "f" * 40, 1_000_000_000_500, 1.3, 0.2)  # another line of commits, between them
    assert len(module.table(results, "m1")) == 4
    assert module.commits(repo, "HEAD~1..HEAD") == {hashes[2]}
    frame = module.table(results, "m1", only=module.commits(repo, "HEAD"))
    assert list(frame["commit"]) == [h[:8] for h in hashes]
    out = tmp_path / "t.md"
    assert module.main(["m1", "--results", str(results), "--repo", str(repo), "--revs", "HEAD~1..HEAD",
                        "--out", str(out)]) == 0
    assert out.read_text().startswith("# m1: 1 commits of HEAD~1..HEAD")
    with pytest.raises(ValueError, match="no-such-branch"):
        module.commits(repo, "no-such-branch")
    assert module.main(["m1", "--results", str(results), "--repo", str(repo), "--revs", "no-such-branch"]) == 2
    assert module.main(["nothing", "--results", str(results), "--repo", str(repo), "--revs", "HEAD"]) == 2


def test_screenshot_graph_hash_leaves_machine_fields_free_unless_chosen():
    """Pinning each machine field to its first value selects nothing where machines disagree."""
    module = _script("dashboard_screenshots")
    index = {
        "params": {"arch": [None, "x86_64"], "machine": ["a", "b"]},
        "benchmarks": {"L.track_ratio": {"param_names": ["case"], "params": [["'static/eager'", "'static/xla'"]]}},
    }
    assert module.graph_hash(index, "L.track_ratio") == "#L.track_ratio?p-case='static%2Feager'"
    chosen = {"branch": "main", "p-case": "'static/xla'"}
    assert module.graph_hash(index, "L.track_ratio", chosen) == "#L.track_ratio?p-case='static%2Fxla'&branch=main"
    assert module.drew_series('<div class="flot-tick-label tickLabel">1.2</div>')
    assert not module.drew_series('<div class="flot-base"></div>')


def test_screenshot_verdict_reads_whichever_pages_were_taken():
    """The index proves the scripts ran by listing the first benchmark; a graph, by drawing ticks."""
    not_rendered = _script("dashboard_screenshots").not_rendered
    grid, graph = '<a href="#A.track_x">x</a>', '<div class="tickLabel">1.2</div>'
    assert not_rendered({"index": grid, "graph": graph}, "A.track_x", "B.track_y") is None
    assert not_rendered({"graph": graph}, "A.track_x", "B.track_y") is None  # --pages graph
    assert "does not list A.track_x" in not_rendered({"index": "<body></body>"}, "A.track_x", "B")
    assert "B.track_y drew no series" in not_rendered({"graph": "<div></div>"}, "A.track_x", "B.track_y")
    failed = not_rendered({"graph": graph + "JavaScript dependencies failed to load"}, "A.track_x", "B")
    assert failed.startswith("the graph page's DOM shows")
