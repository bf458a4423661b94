"""One commit's measurement for the history: the shared rounds, their stages, the processes of a
commit and how they pool (the parts' subprocesses are faked here, except one real shared round)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from mrcnn_bench.history import commit as history  # noqa: E402
from mrcnn_bench.history import interleaved, shared_rounds  # noqa: E402
from mrcnn_bench.running import backends, context  # noqa: E402
from mrcnn_bench.running.cases import Workload  # noqa: E402
from mrcnn_bench.running.stages import STAGE_KEYS  # noqa: E402

INFERENCE = ("torchvision/eager", "static/eager", "static/xla", "static/inductor")


def _record(case: str, ratios: list[float], stages: dict[str, float] | None = None) -> interleaved.CaseRecord:
    n = len(ratios)
    return interleaved.CaseRecord(
        case=case, phase="inference", rounds=n, threads=2, images_per_call=1,
        case_s=[r * 0.2 for r in ratios], ruler_s=[0.2] * n, ratio_median=sorted(ratios)[n // 2],
        ratio_q1=min(ratios), ratio_q3=max(ratios), seconds_median=0.2, ruler_seconds_median=0.2,
        first_result_s=1.0, peak_memory_gb=1.0, flops=1e9, loadavg_before=0.1, loadavg_after=0.2,
        ratio_per_process=[sorted(ratios)[n // 2]],
        stage_s={k: [0.1] * n for k in stages or {}}, ruler_stage_s={k: [0.1] * n for k in stages or {}},
        stage_ratio_median=dict(stages or {}),
    )


def test_processes_pool_into_the_median_of_their_medians():
    records = [_record("static/eager", [1.00, 1.01, 1.02], {"backbone": 1.0, "outside": 2.0}),
               _record("static/eager", [1.10, 1.11, 1.12], {"backbone": 1.2, "outside": 2.2}),
               _record("static/eager", [1.03, 1.04, 1.05], {"backbone": 1.1})]
    pooled = interleaved.pool(records)
    assert pooled.ratio_median == pytest.approx(1.04) and pooled.ratio_per_process == pytest.approx([1.01, 1.11, 1.04])
    assert pooled.rounds == 9 and pooled.processes == 3 and len(pooled.case_s) == 9
    # A stage every process measured pools like the ratio; one that a process lacks is left out.
    assert pooled.stage_ratio_median == {"backbone": pytest.approx(1.1)}
    assert len(pooled.stage_s["backbone"]) == len(pooled.ruler_stage_s["backbone"]) == 9
    assert interleaved.CaseRecord.from_dict(json.loads(json.dumps(pooled.to_dict()))) == pooled
    with pytest.raises(ValueError, match="different cases"):
        interleaved.pool([records[0], _record("static/xla", [1.0])])
    # Only the first process measures memory and FLOPs (the probes): the pool keeps its figures.
    later = interleaved.CaseRecord.from_dict({**records[1].to_dict(), "peak_memory_gb": float("nan"), "flops": None})
    assert interleaved.pool([records[0], later]).peak_memory_gb == 1.0


def _fake_runs(monkeypatch, fail: set[int] = frozenset()) -> list[list[str]]:
    """run_part faked: shared processes return a record per case (ratio 1 + k / 100 for the k-th
    part), compile records from the probing one; part numbers in ``fail`` exit 1."""
    calls: list[list[str]] = []

    def fake(args, timeout=history.PART_TIMEOUT_S, env=None):
        calls.append([*args, f"env={sorted(env or {})}"])
        k = len(calls)
        if k in fail:
            return history.Part(None, f"{args[0]} exited 1: boom {k}", 3.0)
        if args[0] == "mrcnn_bench.history.shared_rounds":
            names = args[2].split(",")
            probing = "--compile-probe" in args
            probed = args[args.index("--probe-cases") + 1].split(",") if "--probe-cases" in args else names
            compiles = {n: {"uncached_compile": 2, "first_call_s": 50.0}
                        for n in probed if probing and history.compiled(n)}
            timing = {n: _record(n, [1.0 + k / 100], {"backbone": 1.0} if n.endswith("eager") else None).to_dict()
                      for n in names}
            return history.Part({"timing": timing, "compiles": compiles}, None, 4.0 * len(names))
        if args[0] == "mrcnn_bench.history.interleaved":
            return history.Part(_record(args[1], [1.2]).to_dict(), None, 2.0)
        if args[0] == "mrcnn_bench.history.stage_work":
            counts = {k: {"flops": 0, "ops": 1, "bytes": 2} for k in STAGE_KEYS.values()}
            return history.Part({"work": {n: counts for n in args[2].split(",")}}, None, 5.0)
        return history.Part({"box_ap": 0.8, "mask_ap": 0.6}, None, 1.0)

    monkeypatch.setattr(history, "run_part", fake)
    monkeypatch.setattr(backends, "unavailable", lambda backend: None)
    return calls


def test_a_commit_times_its_inference_cases_in_a_few_shared_processes(monkeypatch):
    calls = _fake_runs(monkeypatch)
    record = history.measure_commit(cases=(*INFERENCE, "static/train"), budget_s=16.0, processes=4)
    kinds = [c[0] for c in calls]
    shared, one = "mrcnn_bench.history.shared_rounds", "mrcnn_bench.history.interleaved"
    work = "mrcnn_bench.history.stage_work"
    assert kinds == [shared, one, *[shared] * 3, work, "mrcnn_bench.history.fixed_accuracy"]
    # The work counters: every inference case in one process, after every timed one.
    assert calls[5][1:3] == ["--cases", ",".join(INFERENCE)]
    assert record.work["static/eager"].record["backbone"] == {"flops": 0, "ops": 1, "bytes": 2}
    shared = [c for c in calls if c[0] == "mrcnn_bench.history.shared_rounds"]
    # The first process probes (compile counts first, then memory and FLOPs); inductor is in the first two only.
    assert "--compile-probe" in shared[0] and "--probes" in shared[0]
    assert not any("--probes" in c or "--compile-probe" in c for c in shared[1:])
    assert [c[2] for c in shared] == [",".join(INFERENCE)] * 2 + ["torchvision/eager,static/eager,static/xla"] * 2
    assert all(c[c.index("--budget-s") + 1] == "16.0" for c in shared)
    # Every part of the commit shares one inductor cache and one input cache.
    assert {c[-1] for c in calls} == {f"env={sorted(['TORCHINDUCTOR_CACHE_DIR', context.CONTEXT_CACHE_ENV])}"}
    eager, inductor = record.timing["static/eager"], record.timing["static/inductor"]
    assert eager.record["processes"] == 4 and inductor.record["processes"] == 2
    assert eager.record["ratio_per_process"] == pytest.approx([1.01, 1.03, 1.04, 1.05])
    assert eager.record["stage_ratio_median"] == {"backbone": 1.0} and not inductor.record["stage_ratio_median"]
    assert eager.seconds == pytest.approx(4.0 * 4)  # its share of each shared process it was in
    assert record.timing["static/train"].record["ratio_median"] == 1.2
    assert set(record.compiles) == {"static/xla", "static/inductor"}
    assert record.compiles["static/xla"].value("uncached_compile") == 2
    assert record.accuracy.value("box_ap") == 0.8


def test_inductor_can_be_timed_away_from_the_process_that_probed_it(monkeypatch):
    calls = _fake_runs(monkeypatch)
    record = history.measure_commit(cases=INFERENCE, accuracy=False, processes=4, compiled_from=1)
    shared = [c for c in calls if c[0] == "mrcnn_bench.history.shared_rounds"]
    eager_only = "torchvision/eager,static/eager,static/xla"
    assert [c[2] for c in shared] == [eager_only, ",".join(INFERENCE), ",".join(INFERENCE), eager_only]
    # The first process still probes inductor (its counts, and the cold first call) without timing it.
    assert shared[0][shared[0].index("--probe-cases") + 1] == "static/xla,static/inductor"
    assert set(record.compiles) == {"static/xla", "static/inductor"}
    inductor = record.timing["static/inductor"].record
    assert inductor["processes"] == 2 and inductor["ratio_per_process"] == pytest.approx([1.02, 1.03])
    assert inductor["first_result_s"] == 50.0  # the probe's, not the warm first call of process 2
    # The suite's own plan is unchanged: no --probe-cases, inductor where it was probed.
    calls.clear()
    history.measure_commit(cases=INFERENCE, accuracy=False, processes=4)
    assert not any("--probe-cases" in c for c in calls)
    with pytest.raises(ValueError, match="compiled_from must be 0 to 3"):
        history.shared_plan(list(INFERENCE), processes=4, compiled_from=4)
    # Inductor alone, away from the first process: the first process that runs at all probes it.
    calls.clear()
    record = history.measure_commit(cases=("static/inductor",), accuracy=False, processes=4, compiled_from=1)
    assert len(calls) == 3 and "--compile-probe" in calls[0] and "--probe-cases" not in calls[0]
    assert calls[2][0] == "mrcnn_bench.history.stage_work"
    assert record.compiles["static/inductor"].value("uncached_compile") == 2


def test_a_failed_shared_process_fails_its_cases_and_never_gives_a_figure(monkeypatch):
    _fake_runs(monkeypatch, fail={1})  # the first process: its cases and the compile counts fail
    record = history.measure_commit(cases=INFERENCE, accuracy=False, processes=3)
    for case in INFERENCE:
        part = record.timing[case]
        assert part.record is None and "boom 1" in part.error and not part.skipped
    assert "boom 1" in record.compiles["static/inductor"].error
    _fake_runs(monkeypatch, fail={3})  # a later process: a figure from fewer processes is not the figure
    record = history.measure_commit(cases=INFERENCE, accuracy=False, processes=3)
    assert record.timing["static/inductor"].record is not None  # not in that process
    assert "boom 3" in record.timing["static/eager"].error
    assert record.compiles["static/xla"].value("uncached_compile") == 2


def test_a_failed_work_count_leaves_the_timing_alone(monkeypatch):
    """The work counters' process fails (part 4 here: after the three shared ones), or this process
    fails to start it: its cases get the error, every timed figure stays."""
    _fake_runs(monkeypatch, fail={4})
    record = history.measure_commit(cases=INFERENCE, accuracy=False, processes=3)
    assert all("boom 4" in record.work[c].error and record.work[c].record is None for c in INFERENCE)
    assert all(record.timing[c].record is not None for c in INFERENCE)

    def cannot_start(args, timeout=history.PART_TIMEOUT_S, env=None):
        raise OSError("no such interpreter")

    monkeypatch.setattr(history, "run_part", cannot_start)
    assert "OSError: no such interpreter" in history.counted(["mrcnn_bench.history.stage_work"], {}).error
    monkeypatch.setattr(history, "run_part", lambda args, timeout=0, env=None: history.Part([1, 2], None, 1.0))
    assert "no work record" in history.counted(["mrcnn_bench.history.stage_work"], {}).error


def test_a_case_that_cannot_run_here_is_skipped_and_left_out_of_the_processes(monkeypatch):
    calls = _fake_runs(monkeypatch)
    monkeypatch.setattr(backends, "unavailable", lambda backend: "PJRT_DEVICE is not set" if backend == "xla" else None)
    record = history.measure_commit(cases=("static/eager", "static/xla"), accuracy=False, processes=2)
    assert all("static/xla" not in c[2] for c in calls)
    for part in (record.timing["static/xla"], record.compiles["static/xla"]):
        assert part.skipped and "PJRT_DEVICE" in part.error
    assert record.timing["static/eager"].record["processes"] == 2


def test_shared_rounds_time_every_case_and_the_eager_stages_in_the_same_rounds():
    """One real process on the tiny preset: each case's rounds pair with the ruler's, and the stages
    of each timed call add up to the call (the rest of the call is the "outside" stage)."""
    records = shared_rounds.measure_shared(["torchvision/eager", "static/eager"], rounds=3, threads=1, probes=False)
    tv, static = records["torchvision/eager"], records["static/eager"]
    assert tv.ruler_s == static.ruler_s and len(static.case_s) == 3 and static.rounds == 3
    assert set(static.stage_ratio_median) == set(STAGE_KEYS.values())
    for rec in (tv, static):
        for seconds, stages in ((rec.case_s, rec.stage_s), (rec.ruler_s, rec.ruler_stage_s)):
            parts = [sum(stages[k][r] for k in STAGE_KEYS.values() if k != "total") for r in range(3)]
            assert parts == pytest.approx(seconds) and stages["total"] == pytest.approx(seconds)
            assert min(stages["backbone"]) > 0 and min(stages["mask_head"]) > 0 and min(stages["outside"]) > 0
    assert static.stage_ratio_median["total"] == pytest.approx(static.ratio_median)
    with pytest.raises(ValueError, match="only inference cases"):
        shared_rounds.measure_shared(["static/train"], rounds=3)
    with pytest.raises(ValueError, match="name each case once"):
        shared_rounds.measure_shared(["static/eager", "static/eager"], rounds=3)


def test_the_input_cache_makes_a_context_once_per_set_of_options(tmp_path, monkeypatch):
    made = []
    real = context._make_context
    monkeypatch.setattr(context, "_make_context", lambda opts: made.append(opts) or real(opts))
    monkeypatch.setenv(context.CONTEXT_CACHE_ENV, str(tmp_path / "inputs"))
    opts = context.ContextOptions(Workload(preset="tiny", images=1))
    first, desc = context.make_context(opts)
    again, desc_again = context.make_context(opts)
    assert len(made) == 1 and desc_again == desc
    assert first.weights.keys() == again.weights.keys()
    assert all(torch.equal(first.weights[k], again.weights[k]) for k in first.weights)
    context.make_context(context.ContextOptions(Workload(preset="tiny", images=1), seed=1))
    assert len(made) == 2  # other options: made anew
    monkeypatch.delenv(context.CONTEXT_CACHE_ENV)
    context.make_context(opts)
    assert len(made) == 3  # no cache folder: always made
