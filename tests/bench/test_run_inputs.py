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
from mrcnn_bench.running.context import coco_images, load_weights_file


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
    proc = subprocess.run([sys.executable, "-m", "mrcnn_bench", "run", "--coco-root", str(tmp_path), "--cases",
                           "static/eager", "--rounds", "1", "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "holds no images" in proc.stderr and "Traceback" not in proc.stderr


def test_the_mask_memory_bound():
    """100 detections of a 6000x6000 image: about 17 GiB of pasted masks and image; refused with 16 GiB
    available, naming a side that fits, which itself passes."""
    from mrcnn_bench.running.context import check_paste_memory  # here: the other tests need only the readers

    with pytest.raises(ValueError, match=r"up to 6000x6000 would need .* up to about (\d+)x\1 fit") as e:
        check_paste_memory([(6000, 6000)], 100, 16 * 2**30, "--coco-root x")
    side = int(str(e.value).split("up to about ")[1].split("x")[0])
    assert 1000 < side < 6000
    check_paste_memory([(side, side)], 100, 16 * 2**30, "--coco-root x")
    check_paste_memory([(480, 640)] * 8, 100, 16 * 2**30, "--coco-root x")


CHILD = """
import resource, sys
from pathlib import Path
from mrcnn_bench.running.context import coco_images
status = dict(l.split(":", 1) for l in Path("/proc/self/status").read_text().splitlines() if ":" in l)
used = int(status["VmSize"].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (used + 2 * 2**30, resource.RLIM_INFINITY))  # 2 GiB more than now
try:
    coco_images(sys.argv[1], 1, "val2017", detections=100)
except ValueError as e:
    print("refused:", e)
images = coco_images(sys.argv[1], 1, "val2017", detections=2)
print("decoded", tuple(images[0].shape))
"""


def test_a_3000x3000_image_under_an_address_space_limit(tmp_path):
    """With 2 GiB of address space left, 100 masks of a 3000x3000 image (4.3 GiB) are refused in one line,
    not killed by the kernel; 2 masks fit, and the image decodes within the limit."""
    from PIL import Image  # here: the other tests need no images

    (tmp_path / "annotations").mkdir()
    (tmp_path / "val2017").mkdir()
    Image.new("RGB", (3000, 3000), (40, 80, 120)).save(tmp_path / "val2017" / "big.png")
    (tmp_path / "annotations" / "instances_val2017.json").write_text(json.dumps({
        "images": [{"id": 1, "file_name": "big.png", "height": 3000, "width": 3000}], "annotations": [],
        "categories": [{"id": 1, "name": "a"}]}))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "refused: --coco-root" in proc.stdout and "3000x3000 would need" in proc.stdout
    assert "decoded (3, 3000, 3000)" in proc.stdout


@pytest.mark.parametrize("setting", ["size_divisible=0", "num_classes=abc", "canvases=((100000,100000),)"])
def test_a_config_value_of_the_wrong_kind_or_range_is_one_line_exit_2(setting, capsys):
    """--set values reach the config's own checks: a zero divisor, a string for a count and a canvas
    no allocation holds are refused naming the field, before anything is measured."""
    from mrcnn_bench.cli import commands as cli

    assert cli.main(["run", "--cases", "static/eager", "--rounds", "1", "--no-progress", "--set", setting]) == 2
    err = capsys.readouterr().err
    assert "invalid config 'tiny'" in err and setting.split("=")[0] in err and "Traceback" not in err
