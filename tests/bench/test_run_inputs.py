"""``mrcnn-bench run``'s inputs are refused before any row is set up: weights of another model or preset,
and a COCO split with no images, each with one line naming the flag (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from mrcnn.config import get_config
from mrcnn.weights import synthetic_weights
from mrcnn_bench.context import coco_images, load_weights_file


def test_weights_of_another_model_or_preset_are_refused(tmp_path):
    other = tmp_path / "other.pt"
    torch.save({"x.weight": torch.zeros(2)}, other)
    with pytest.raises(ValueError, match=r"--weights .*other\.pt: .*1 unexpected \[x\.weight\]"):
        load_weights_file(str(other), get_config("tiny"))
    tiny = tmp_path / "tiny.pt"
    torch.save(synthetic_weights(get_config("tiny"), seed=0), tiny)
    assert load_weights_file(str(tiny), get_config("tiny"))
    with pytest.raises(ValueError, match=r"--weights .*tiny\.pt: .*other shapes"):
        load_weights_file(str(tiny), get_config("tiny", num_classes=5))


def test_an_empty_coco_split_is_refused(tmp_path):
    (tmp_path / "annotations").mkdir()
    (tmp_path / "val2017").mkdir()
    (tmp_path / "annotations" / "instances_val2017.json").write_text(
        json.dumps({"images": [], "annotations": [], "categories": [{"id": 1, "name": "a"}]}))
    with pytest.raises(ValueError, match="split 'val2017' holds no images"):
        coco_images(str(tmp_path), 4)
    proc = subprocess.run([sys.executable, "-m", "mrcnn_bench.cli", "run", "--coco-root", str(tmp_path), "--cases",
                           "static/eager", "--rounds", "1", "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "holds no images" in proc.stderr and "Traceback" not in proc.stderr
