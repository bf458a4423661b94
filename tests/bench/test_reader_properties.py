"""Property tests of the readers of outside files: a valid file, mutated at random (a value replaced by
any JSON value, a key dropped or added, a line torn), either reads back into a value that passes its
own checks, or raises the one input error the command lines turn into exit 2 (UsageError, or OSError
for a file that is not there). Never another exception (a plain ValueError would be exit 3), never
NaN or a negative time inside. The values drawn include hostile numbers: huge, negative, NaN,
infinite, past 64 bits; and the files include JSON nested past the parser's stack.

Hypothesis draws the mutations; ``derandomize=True`` makes every CI run draw the same ones.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from mrcnn.data.coco import CocoDataset
from mrcnn.exits import UsageError
from mrcnn_bench.changes import asv_files, history_series
from mrcnn_bench.gates import gate
from mrcnn_bench.running import journal, store
from mrcnn_bench.running.cases import Workload
from mrcnn_bench.running.records import Record, RunDocument, RunInfo

SETTINGS = settings(max_examples=60, derandomize=True, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

hostile_numbers = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                            st.sampled_from([1e308, -1e308, 1e160, 1e9, -1e9, 2**32, 2**63, -1, 0]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=8), hostile_numbers)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                           max_leaves=6)


@st.composite
def mutated(draw, doc: Any) -> Any:
    """``doc`` with 1 to 3 mutations at random places: replace a value, drop a key, add a key."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(1, 3))):
        node, path = doc, []
        while isinstance(node, (dict, list)) and node and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
            path.append((node, key))
            node = node[key]
        if not path:
            return draw(json_values)  # the whole document replaced
        parent, key = path[-1]
        action = draw(st.sampled_from(["replace", "drop", "add"]))
        if action == "replace" or isinstance(parent, list):
            parent[key] = draw(json_values)
        elif action == "drop":
            del parent[key]
        else:
            parent[draw(st.text(max_size=6))] = draw(json_values)
    return doc


def _run_file() -> dict[str, Any]:
    times = [0.1, 0.2, 0.15]
    rec = Record(row="static/eager", case="static/eager", impl="static", compiler="eager", backend="cpu",
                 status="ok", times_s=times, median_s=0.15)
    info = RunInfo(workload=Workload(), options={"rounds": 3, "warmup": 1}, weights="synthetic")
    return json.loads(store.dumps(RunDocument(name="t", records=[rec], run=info, environment={"cpu": "x"})))


@SETTINGS
@given(doc=mutated(_run_file()))
def test_run_files(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("run") / "run.json"
    path.write_text(json.dumps(doc))
    try:
        run = store.load(path)
    except UsageError:
        return
    journal.check_name(run.name)
    for r in run.records:
        assert all(math.isfinite(t) and t >= 0 for t in r.times_s)


def _journal_lines() -> list[dict[str, Any]]:
    row = {"status": "ok", "seconds": 0.1, "detail": "", "loss": None, "parity": [], "counters": {}}
    return [{"kind": "start", "key": {"k": 1}},
            *({"kind": "round", "round": i, "machine": {}, "rows": {"a": dict(row)}} for i in range(2))]


@SETTINGS
@given(lines=mutated(_journal_lines()), tear=st.integers(0, 40))
def test_journals(tmp_path_factory, lines, tear):
    path = tmp_path_factory.mktemp("journal") / "r.rounds.jsonl"
    text = "".join(json.dumps(line) + "\n" for line in lines) if isinstance(lines, list) else json.dumps(lines)
    path.write_text(text[: len(text) - tear])
    try:
        back = journal.read(path, {"k": 1})
    except UsageError:
        return
    for rnd in back.rounds:
        for r in rnd.values():
            assert r.seconds is None or (math.isfinite(r.seconds) and r.seconds >= 0)


@SETTINGS
@given(doc=mutated({"preset": "tiny", "cases": {"static/inductor": {
    "unique_graphs": 2, "graph_breaks": 0, "recompiles": 1, "flops": 10.0, "per_call": []}}}))
def test_gate_baselines(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("gate") / "gate.json"
    path.write_text(json.dumps(doc))
    try:
        cases = gate.load_compile_baseline(path, "tiny")
    except UsageError:
        return
    for entry in cases.values():
        for metric in gate.GATED:
            v = entry.get(metric)
            assert v is None or (math.isfinite(v) and v >= 0)


def _coco() -> dict[str, Any]:
    return {
        "images": [{"id": 1, "file_name": "a.png", "height": 12, "width": 16},
                   {"id": 2, "file_name": "b.png", "height": 12, "width": 16}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 1, 6, 5], "area": 30.0, "iscrowd": 0,
             "segmentation": [[1, 1, 7, 1, 7, 6, 1, 6]]},
            {"id": 2, "image_id": 2, "category_id": 5, "bbox": [2, 2, 4, 4], "area": 16.0, "iscrowd": 0,
             "segmentation": {"size": [12, 16], "counts": [26, 4, 8, 4, 8, 4, 8, 4, 132]}},
        ],
        "categories": [{"id": 3, "name": "a"}, {"id": 5, "name": "b"}],
    }


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("coco_images")
    for name in ("a.png", "b.png"):
        Image.fromarray(np.zeros((12, 16, 3), np.uint8)).save(folder / name)
    return folder


@SETTINGS
@given(doc=mutated(_coco()))
def test_coco_annotation_files(tmp_path_factory, image_dir, doc):
    ann = tmp_path_factory.mktemp("coco") / "instances.json"
    ann.write_text(json.dumps(doc))
    try:
        data = CocoDataset(ann.parent, "x", ann_file=ann, image_dir=image_dir)
        targets = [data.load_target(i) for i in range(len(data))]
    except (UsageError, OSError):  # CocoFormatError, ImageDecodeError (an image the file names that is not there)
        return
    for t in targets:
        assert t["boxes"].isfinite().all() and (t["boxes"][:, 2:] >= t["boxes"][:, :2]).all()
        assert len(t["labels"]) == len(t["boxes"]) == len(t["masks"])


DEEP = "[" * 50_000 + "]" * 50_000


@pytest.mark.parametrize("reader", ["run", "journal", "gate", "coco", "asv"])
def test_json_nested_past_the_stack_is_an_input_error(tmp_path, image_dir, reader):
    path = tmp_path / "deep.json"
    path.write_text(DEEP)
    read = {"run": lambda: store.load(path), "journal": lambda: journal.read(path, {"k": 1}),
            "gate": lambda: gate.load_compile_baseline(path, "tiny"),
            "coco": lambda: CocoDataset(tmp_path, "x", ann_file=path, image_dir=image_dir)}
    if reader == "asv":
        folder = tmp_path / "m1"
        folder.mkdir()
        (folder / "machine.json").write_text(json.dumps({"machine": "m1", "version": 1}))
        (folder / "abcdef12-env.json").write_text(DEEP)
        assert asv_files.read(tmp_path, "m1").skipped[0].reason == "JSON nested too deeply to read"
        return
    with pytest.raises(UsageError):
        read[reader]()


def _asv_result() -> dict[str, Any]:
    return {"commit_hash": "ab" * 20, "env_name": "env-x", "date": 1_000_000, "params": {"machine": "m1"},
            "python": "3.11", "requirements": {}, "env_vars": {},
            "result_columns": ["result", "params", "version", "started_at", "duration"],
            "results": {
                "benchmarks.Latency.track_ratio": [[1.1, 1.2], [["'static/eager'", "'static/xla'"]], "v", 1, 1.0],
                "benchmarks.Compiles.track_count": [[3], [["'static/xla'"], ["'xla_compiles'"]], "v", 1, 1.0]},
            "durations": {}, "version": 2}


@SETTINGS
@given(doc=mutated(_asv_result()))
def test_asv_result_files(tmp_path_factory, doc):
    """A mutated result file is used as asv would, or left out with its reason; every value read is a
    number under its own parameters."""
    results = tmp_path_factory.mktemp("asv")
    (results / "m1").mkdir()
    (results / "m1" / "machine.json").write_text(json.dumps({"machine": "m1", "version": 1}))
    (results / "m1" / "abababab-env-x.json").write_text(json.dumps(doc))
    read = asv_files.read(results, "m1")
    assert len(read.results) + len(read.skipped) == 1
    if read.skipped:
        assert read.skipped[0].reason
        return
    try:
        series, _, _ = history_series.read_asv(results, "m1", ["ab" * 20], history_series.HELD)
    except UsageError:  # nothing held left in it
        return
    for commits, values in series.values():
        assert commits == ["abababab"] and all(isinstance(v, float) and math.isfinite(v) for v in values)


csv_cells = st.one_of(st.text(max_size=6), hostile_numbers.map(repr), st.sampled_from(["nan", "inf", "-0", "1e400"]))


@SETTINGS
@given(header=st.lists(st.sampled_from(["commit", "value", "metric", "note"]), min_size=1, max_size=4),
       rows=st.lists(st.lists(csv_cells, min_size=1, max_size=4), max_size=8))
def test_series_csv_files(tmp_path_factory, header, rows):
    path = tmp_path_factory.mktemp("csv") / "s.csv"
    path.write_text("\n".join(",".join(r) for r in [header, *rows]) + "\n")
    try:
        series = history_series.read_csv(path)
    except UsageError:
        return
    for commits, values in series.values():
        assert len(commits) == len(set(commits)) == len(values) and all(math.isfinite(v) for v in values)
