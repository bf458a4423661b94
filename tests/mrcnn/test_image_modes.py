"""Images as they come: every mode Pillow opens becomes [3, H, W] uint8 RGB with its values kept (16-bit
greyscale scaled, not clipped at 255), or is refused with one line naming the file."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from mrcnn.data.coco import CocoDataset, ImageDecodeError
from mrcnn.data.images import rgb8


def _dataset(tmp_path, image: Image.Image, name: str = "a.png") -> CocoDataset:
    (tmp_path / "train").mkdir()
    (tmp_path / "annotations").mkdir()
    image.save(tmp_path / "train" / name)
    ann = {"images": [{"id": 1, "file_name": name, "height": image.height, "width": image.width}],
           "annotations": [], "categories": [{"id": 1, "name": "thing"}]}
    (tmp_path / "annotations" / "instances_train.json").write_text(json.dumps(ann))
    return CocoDataset(tmp_path, "train")


def test_sixteen_bit_greyscale_is_scaled_not_clipped(tmp_path):
    ramp = (np.arange(48 * 64, dtype=np.uint32).reshape(48, 64) * 21).astype(np.uint16)  # 0..64491
    image = _dataset(tmp_path, Image.fromarray(ramp)).load_image(0)
    assert str(image.dtype) == "torch.uint8"
    assert tuple(image.shape) == (3, 48, 64)
    expected = (ramp >> 8).astype(np.uint8)
    assert np.array_equal(image[0].numpy(), expected) and np.array_equal(image[1].numpy(), expected)
    assert (image == 255).float().mean() < 0.01, "saturated: clipped at 255 instead of scaled"


@pytest.mark.parametrize("mode", ["P", "1", "L", "LA", "RGBA", "CMYK"])
def test_other_modes_go_through_pillows_conversion(mode):
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8))
    image = rgb.convert(mode)
    out = rgb8(image)
    assert out.shape == (5, 7, 3) and out.dtype == np.uint8
    assert np.array_equal(out, np.asarray(image.convert("RGB")))


def test_a_one_pixel_image_loads(tmp_path):
    image = _dataset(tmp_path, Image.new("RGB", (1, 1), (10, 20, 30))).load_image(0)
    assert image.flatten().tolist() == [10, 20, 30]


@pytest.mark.parametrize(("mode", "dtype"), [("F", np.float32), ("I", np.int32)])
def test_pixels_of_no_stated_range_are_refused_naming_the_file(tmp_path, mode, dtype):
    image = Image.fromarray(np.ones((4, 4), dtype=dtype), mode)
    dataset = _dataset(tmp_path, image, name="a.tif")
    with pytest.raises(ImageDecodeError, match=r"a\.tif \(image id 1\): cannot decode image: 32-bit"):
        dataset.load_image(0)
