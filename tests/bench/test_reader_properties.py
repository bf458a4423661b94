"""Property tests of the readers of outside files: a valid file, mutated at random (a value replaced by
any JSON value, a key dropped or added, a line torn), either reads back into a value that passes its
own checks, or raises the one input error the command lines turn into exit 2 (ValueError and its
kin). Never another exception, never NaN or a negative time inside.

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
from mrcnn_bench.gates import gate
from mrcnn_bench.running import journal, store
from mrcnn_bench.running.cases import Workload
from mrcnn_bench.running.records import Record, RunDocument, RunInfo

SETTINGS = settings(max_examples=60, derandomize=True, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=8),
                    st.floats(allow_nan=True, allow_infinity=True))
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
    except ValueError:
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
    except ValueError:
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
    except ValueError:
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
    except (ValueError, OSError):  # CocoFormatError, ImageDecodeError (an image the file names that is not there)
        return
    for t in targets:
        assert t["boxes"].isfinite().all() and (t["boxes"][:, 2:] >= t["boxes"][:, :2]).all()
        assert len(t["labels"]) == len(t["boxes"]) == len(t["masks"])
