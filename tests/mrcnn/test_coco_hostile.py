"""Hostile COCO annotation files: what would reach pycocotools' C code or leave the image folder is
refused first, as an error naming the image or annotation (exit 2), never a signal or a traceback."""

from __future__ import annotations

import numpy as np
import pycocotools.mask as mask_utils
import pytest

from mrcnn.data.coco import CocoDataset, CocoFormatError
from mrcnn.data.coco_checks import rle_string_counts
from tests.fixtures.coco_quirks import CROWD_ANN_ID, SPLIT, uncompressed_rle, write_quirky_coco


@pytest.fixture
def quirky_root(tmp_path):
    return write_quirky_coco(tmp_path)


def _annotation(data: dict, ann_id: int) -> dict:
    return next(a for a in data["annotations"] if a["id"] == ann_id)


HOSTILE = {  # what reaches pycocotools' C code or the file system, refused first: (mutation, message)
    "traversal": (lambda d: d["images"][0].update(file_name="../../../x.png"), r"image id 1: file_name .* not a path"),
    "absolute": (lambda d: d["images"][0].update(file_name="/etc/hostname"), r"image id 1: file_name .* not a path"),
    "far polygon": (lambda d: _annotation(d, 101).update(segmentation=[[0, 0, 1e9, 0, 1e9, 1e9]]),
                    r"annotation id 101: a polygon point lies beyond"),
    "nan polygon": (lambda d: _annotation(d, 101).update(segmentation=[[0, 0, float("nan"), 0, 5, 5]]),
                    r"annotation id 101: a polygon holds a value that is not a finite number"),
    "huge image": (lambda d: d["images"][0].update(height=100_000, width=100_000),
                   r"image id 1 .* declares 100000x100000 pixels"),
    "rle overflow": (lambda d: _annotation(d, CROWD_ANN_ID)["segmentation"].update(counts=[2**40, 2400 - 2**40]),
                     rf"annotation id {CROWD_ANN_ID}: RLE counts must be run lengths"),
    "rle string alphabet": (lambda d: _annotation(d, 201)["segmentation"].update(counts="~~~\u00ff"),
                            r"annotation id 201: RLE counts string is not a compressed COCO RLE"),
    "rle string too long": (lambda d: _annotation(d, 201)["segmentation"].update(counts="0k5"),
                            r"annotation id 201: RLE counts sum to"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_annotations_are_refused_naming_them(tmp_path, name):
    mutate, message = HOSTILE[name]
    root = write_quirky_coco(tmp_path, mutate)
    with pytest.raises(CocoFormatError, match=message):
        CocoDataset(root, SPLIT)


def test_json_nested_too_deeply_is_named(quirky_root):
    ann_file = quirky_root / "annotations" / f"instances_{SPLIT}.json"
    ann_file.write_text("[" * 50_000 + "]" * 50_000)
    with pytest.raises(CocoFormatError, match="nested too deeply"):
        CocoDataset(quirky_root, SPLIT)


def test_rle_strings_decode_to_pycocotools_runs():
    rng = np.random.default_rng(3)
    for shape in [(1, 1), (7, 5), (40, 60), (300, 2)]:
        mask = np.asfortranarray((rng.random(shape) < 0.3).astype(np.uint8))
        counts = mask_utils.encode(mask)["counts"]
        runs = rle_string_counts(counts)
        assert runs == uncompressed_rle(mask)["counts"] and runs == rle_string_counts(counts.decode())
    assert rle_string_counts("0k") is None  # the string ends inside a number
