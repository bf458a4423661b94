"""Data: the synthetic generator, the COCO loader (quirks and bad input), static batches and loaders."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pycocotools.mask as mask_utils
import pytest
import torch
from torchvision.ops import roi_align

from mrcnn.config import get_config
from mrcnn.data import synthetic
from mrcnn.data.coco import (
    CocoDataset,
    CocoDataWarning,
    CocoFormatError,
    ImageDecodeError,
    decode_segmentation,
    label_mode_for,
)
from mrcnn.data.collate import BucketBatchSampler, canvas_of, collate, crop_masks_to_boxes, make_loader
from tests.fixtures.coco_quirks import CATEGORY_IDS, CROWD_ANN_ID, CROWD_MASK, SPLIT, write_quirky_coco

NUM_IMAGES = 12  # image 1 (index 1) is empty and image 7 (index 6) crowded, by the generator's schedule


@pytest.fixture(scope="module")
def synthetic_root(tmp_path_factory) -> Path:
    return synthetic.generate(tmp_path_factory.mktemp("synthetic"), NUM_IMAGES, seed=0, progress=False)


@pytest.fixture(scope="module")
def synthetic_json(synthetic_root) -> dict:
    return json.loads((synthetic_root / "annotations" / "instances_train.json").read_text())


@pytest.fixture
def quirky_root(tmp_path) -> Path:
    return write_quirky_coco(tmp_path)


def _masks_of(data: dict, image_id: int) -> list[np.ndarray]:
    img = next(i for i in data["images"] if i["id"] == image_id)
    return [
        decode_segmentation(a["segmentation"], img["height"], img["width"]).astype(bool)
        for a in data["annotations"]
        if a["image_id"] == image_id
    ]


# ---------------------------------------------------------------- synthetic generator


def test_generator_is_deterministic(tmp_path):
    a = synthetic.generate(tmp_path / "a", 5, seed=3, progress=False)
    b = synthetic.generate(tmp_path / "b", 5, seed=3, progress=False)
    c = synthetic.generate(tmp_path / "c", 5, seed=4, progress=False)
    ann = "annotations/instances_train.json"
    assert (a / ann).read_bytes() == (b / ann).read_bytes()
    assert (a / ann).read_bytes() != (c / ann).read_bytes()
    for f in sorted((a / "train").iterdir()):
        assert f.read_bytes() == (b / "train" / f.name).read_bytes()
    # Image i depends on (seed, i) only, not on how many images are made.
    d = synthetic.generate(tmp_path / "d", 3, seed=3, progress=False)
    first = json.loads((a / ann).read_text())
    assert json.loads((d / ann).read_text())["images"] == first["images"][:3]


def test_generator_writes_the_coco_layout(synthetic_root, synthetic_json):
    assert {c["id"]: c["name"] for c in synthetic_json["categories"]} == dict(enumerate(synthetic.CATEGORIES, start=1))
    assert len(synthetic_json["images"]) == NUM_IMAGES
    for img in synthetic_json["images"]:
        path = synthetic_root / "train" / img["file_name"]
        with synthetic.Image.open(path) as pil:
            assert pil.size == (img["width"], img["height"]) and pil.mode == "RGB"
    ids = [a["id"] for a in synthetic_json["annotations"]]
    assert len(set(ids)) == len(ids)


def test_generator_stresses_dynamic_shapes(synthetic_root, synthetic_json):
    images = {i["id"]: i for i in synthetic_json["images"]}
    anns = synthetic_json["annotations"]
    sizes = [(i["height"], i["width"]) for i in images.values()]
    assert all(200 <= s <= 640 for hw in sizes for s in hw)
    assert any(h > w for h, w in sizes) and any(w > h for h, w in sizes)
    assert len({round(w / h, 1) for h, w in sizes}) >= 5  # varied aspect ratios

    per_image = [sum(a["image_id"] == i for a in anns) for i in images]
    assert min(per_image) == 0 and max(per_image) >= 20
    assert {a["category_id"] for a in anns} == set(range(1, 7))
    for a in anns:  # polygons, never degenerate, boxes inside the image
        assert a["iscrowd"] == 0 and len(a["segmentation"]) == 1 and len(a["segmentation"][0]) >= 6
        x, y, w, h = a["bbox"]
        img = images[a["image_id"]]
        assert w > 0 and h > 0 and x >= 0 and y >= 0 and x + w <= img["width"] and y + h <= img["height"]
        assert a["area"] > 0

    assert sum(a["area"] < 100 for a in anns) >= 5, "tiny objects"
    touching = [
        a for a in anns
        if a["bbox"][0] <= 0 or a["bbox"][1] <= 0
        or a["bbox"][0] + a["bbox"][2] >= images[a["image_id"]]["width"]
        or a["bbox"][1] + a["bbox"][3] >= images[a["image_id"]]["height"]
    ]  # fmt: skip
    assert len(touching) >= 5, "objects cut by the border"

    overlaps = 0
    for image_id in images:
        masks = _masks_of(synthetic_json, image_id)
        for i in range(len(masks)):
            for j in range(i + 1, len(masks)):
                overlaps += bool((masks[i] & masks[j]).any())
    assert overlaps >= 5, "overlapping objects"

    for image_id, img in images.items():  # backgrounds are not flat
        with synthetic.Image.open(synthetic_root / "train" / img["file_name"]) as pil:
            pixels = np.asarray(pil)
        covered = np.zeros(pixels.shape[:2], dtype=bool)
        for m in _masks_of(synthetic_json, image_id):
            covered |= m
        assert pixels[~covered].std() > 3


def test_generator_keeps_occluded_objects_half_visible():
    _, objects = synthetic._make_image(6, seed=0)  # a crowded image
    height, width = synthetic._make_image(6, seed=0)[0].shape[:2]
    masks = [synthetic._render_mask(poly, height, width) for _, poly in objects]
    for k, m in enumerate(masks):
        on_top = np.zeros_like(m)
        for later in masks[k + 1 :]:
            on_top |= later
        assert (m & ~on_top).sum() >= (1 - synthetic.MAX_HIDDEN_FRACTION) * m.sum()


def test_clip_polygon_to_image():
    square = np.array([[-5.0, -5.0], [5.0, -5.0], [5.0, 5.0], [-5.0, 5.0]])
    clipped = synthetic.clip_polygon(square, 10, 10)
    assert clipped.min() == 0 and clipped.max() == 5
    assert len(synthetic.clip_polygon(square - 20, 10, 10)) == 0


def test_cli(tmp_path):
    out = tmp_path / "cli"
    result = subprocess.run(
        [sys.executable, "-m", "mrcnn.data.synthetic", "--out", str(out), "--count", "2", "--seed", "1",
         "--split", "val", "--quiet"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "wrote 2 images" in result.stdout
    assert (out / "annotations" / "instances_val.json").is_file()
    assert len(list((out / "val").glob("*.png"))) == 2
    # The argparse pieces are reusable by the main CLI.
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd")
    synthetic.add_arguments(sub.add_parser("synthetic"))
    args = parser.parse_args(["synthetic", "--out", str(tmp_path / "x"), "--count", "1", "--quiet"])
    assert synthetic.run(args) == tmp_path / "x"


# ---------------------------------------------------------------- COCO loader


def test_loads_synthetic(synthetic_root, synthetic_json):
    ds = CocoDataset(synthetic_root, "train")
    assert len(ds) == NUM_IMAGES and ds.skipped == {}
    assert ds.label_to_category_id == {k: k for k in range(1, 7)}
    image, target = ds[6]
    img = next(i for i in synthetic_json["images"] if i["id"] == target["image_id"])
    assert image.dtype == torch.uint8 and tuple(image.shape) == (3, img["height"], img["width"])
    anns = [a for a in synthetic_json["annotations"] if a["image_id"] == target["image_id"]]
    assert target["ann_ids"].tolist() == [a["id"] for a in anns]
    xyxy = torch.tensor([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in anns)])
    assert torch.allclose(target["boxes"], xyxy)
    assert target["masks"].shape == (len(anns), img["height"], img["width"])
    assert torch.equal(target["masks"].bool(), torch.from_numpy(np.stack(_masks_of(synthetic_json, img["id"]))))
    assert ds.sizes[6] == (img["height"], img["width"])


def test_quirky_coco_contiguous_labels(quirky_root):
    ds = CocoDataset(quirky_root, SPLIT, num_classes=5)
    assert ds.category_id_to_label == {1: 1, 3: 2, 7: 3, 90: 4}
    assert ds.label_to_category_id == {1: 1, 2: 3, 3: 7, 4: 90}
    assert ds.label_names == {1: "person", 2: "car", 3: "train", 4: "toothbrush"}
    assert ds.labels_to_category_ids(torch.tensor([4, 1, 2])) == [90, 1, 3]
    with pytest.raises(ValueError, match="label 0 has no category"):
        ds.labels_to_category_ids([0])
    assert ds.ids == [1, 5, 9]
    _, target = ds[0]
    assert target["labels"].tolist() == [2, 4]  # crowd left out of training targets
    assert target["iscrowd"].tolist() == [0, 0]


def test_quirky_coco_category_id_labels(quirky_root):
    cfg = get_config("coco_r50_fpn")
    assert label_mode_for(cfg) == "category_id" and label_mode_for(get_config("tiny")) == "contiguous"
    ds = CocoDataset.from_config(quirky_root, SPLIT, cfg)
    assert ds.category_id_to_label == {c: c for c in CATEGORY_IDS}
    _, target = ds[0]
    assert target["labels"].tolist() == [3, 90]
    with pytest.raises(ValueError, match="num_classes is 7"):
        CocoDataset(quirky_root, SPLIT, label_mode="category_id", num_classes=7)


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # pycocotools + numpy 2
def test_quirky_coco_crowd_rle_and_masks(quirky_root):
    ds = CocoDataset(quirky_root, SPLIT, include_crowd=True)
    _, target = ds[0]
    assert target["ann_ids"].tolist() == [101, 102, CROWD_ANN_ID]
    assert target["iscrowd"].tolist() == [0, 0, 1]
    assert np.array_equal(target["masks"][2].numpy(), CROWD_MASK)
    assert target["masks"][0].sum() > 0 and target["masks"][1].sum() > 0  # multi-part polygon
    # The crowd stays in the evaluation ground truth either way.
    plain = CocoDataset(quirky_root, SPLIT)
    assert plain.coco.anns[CROWD_ANN_ID]["iscrowd"] == 1
    # Compressed RLE (a string) decodes too, and agrees with pycocotools' own annToMask.
    _, t5 = plain[1]
    assert t5["ann_ids"].tolist() == [201, 202]
    assert np.array_equal(t5["masks"][0].numpy(), plain.coco.annToMask(plain.coco.anns[201]))
    _, t9 = plain[2]
    assert t9["boxes"].shape == (0, 4) and t9["masks"].shape == (0, 50, 50)


# ---------------------------------------------------------------- bad input


def _expect_skip(root: Path, reason: str, ann_id: int, **kwargs) -> CocoDataset:
    with pytest.warns(CocoDataWarning, match=str(ann_id)):
        ds = CocoDataset(root, SPLIT, **kwargs)
    assert ds.skipped[reason] == 1 and ds.skipped_ids[reason] == [ann_id]
    return ds


def test_missing_image_file(quirky_root):
    (quirky_root / SPLIT / "000000000005.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"1 of 3 images .* missing: .*000000000005\.png"):
        CocoDataset(quirky_root, SPLIT)


def test_missing_annotation_file_and_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"instances_val2017\.json"):
        CocoDataset(tmp_path, SPLIT)
    write_quirky_coco(tmp_path)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        CocoDataset(tmp_path, SPLIT, image_dir=tmp_path / "nowhere")


def test_malformed_json(quirky_root):
    ann_file = quirky_root / "annotations" / f"instances_{SPLIT}.json"
    ann_file.write_text(ann_file.read_text()[:-40])
    with pytest.raises(CocoFormatError, match=r"instances_val2017\.json: malformed JSON at line 1 column"):
        CocoDataset(quirky_root, SPLIT)
    ann_file.write_text(json.dumps({"images": []}))
    with pytest.raises(CocoFormatError, match="'categories'"):
        CocoDataset(quirky_root, SPLIT)


def test_annotation_of_missing_image_or_category(tmp_path):
    def add(ann):
        return lambda d: d["annotations"].append(ann)

    base = {"iscrowd": 0, "area": 4.0, "segmentation": [[1, 1, 3, 1, 3, 3]], "bbox": [1, 1, 2, 2]}
    root = write_quirky_coco(tmp_path / "img", add({**base, "id": 900, "image_id": 77, "category_id": 1}))
    ds = _expect_skip(root, "unknown_image", 900)
    assert 900 not in ds.coco.anns
    root = write_quirky_coco(tmp_path / "cat", add({**base, "id": 901, "image_id": 1, "category_id": 2}))
    ds = _expect_skip(root, "unknown_category", 901)
    assert 901 not in ds.coco.anns and ds[0][1]["ann_ids"].tolist() == [101, 102]
    with pytest.raises(CocoFormatError, match="annotation id 901: category_id not in 'categories'"):
        CocoDataset(root, SPLIT, strict=True)


def test_polygons_with_fewer_than_3_points(tmp_path):
    def mutate(d):
        d["annotations"][0]["segmentation"] = [[5, 5, 25, 5]]  # 2 points: pycocotools would read a box
        d["annotations"][1]["segmentation"].append([1.0, 1.0])  # one good part, one bad

    root = write_quirky_coco(tmp_path, mutate)
    with pytest.warns(CocoDataWarning) as record:
        ds = CocoDataset(root, SPLIT)
    assert len(record) == 1  # one summary, with the counts and ids
    assert "101" in str(record[0].message) and "102" in str(record[0].message)
    assert ds.skipped == {"invalid_polygon": 1, "truncated_polygon": 1}
    _, target = ds[0]
    assert target["ann_ids"].tolist() == [102]
    assert len(ds.coco.anns[102]["segmentation"]) == 2 and 101 not in ds.coco.anns
    with pytest.raises(CocoFormatError, match="annotation id 101"):
        CocoDataset(root, SPLIT, strict=True)


def test_boxes_outside_the_image(tmp_path):
    def mutate(d):
        d["annotations"][0]["bbox"] = [100.0, 5.0, 10.0, 10.0]  # image 1 is 60 wide
        d["annotations"][1]["bbox"] = [50.0, 25.0, 20.0, 13.0]  # partly outside: clipped to x2 = 60
        d["annotations"][3]["bbox"] = [5.0, 30.0, 0.0, 20.0]  # zero width

    root = write_quirky_coco(tmp_path, mutate)
    with pytest.warns(CocoDataWarning, match="3 annotation|2 annotation"):
        ds = CocoDataset(root, SPLIT)
    assert ds.skipped == {"box_outside_image": 1, "box_clipped": 1, "degenerate_box": 1}
    _, target = ds[0]
    assert target["ann_ids"].tolist() == [102]
    assert target["boxes"].tolist() == [[50.0, 25.0, 60.0, 38.0]]
    assert ds.coco.anns[102]["bbox"] == [50.0, 25.0, 20.0, 13.0]  # evaluation GT untouched
    assert ds[1][1]["ann_ids"].tolist() == [202]


def test_bad_fields_name_the_annotation(tmp_path):
    root = write_quirky_coco(tmp_path / "a", lambda d: d["annotations"][2].update(id=101))
    with pytest.raises(CocoFormatError, match="duplicate annotation id 101"):
        CocoDataset(root, SPLIT)
    root = write_quirky_coco(tmp_path / "b", lambda d: d["annotations"][0].update(bbox=[1, 2, 3]))
    with pytest.raises(CocoFormatError, match="annotation id 101: 'bbox'"):
        CocoDataset(root, SPLIT)
    root = write_quirky_coco(tmp_path / "c", lambda d: d["annotations"][2]["segmentation"].update(size=[41, 60]))
    with pytest.raises(CocoFormatError, match=f"annotation id {CROWD_ANN_ID}: RLE size"):
        CocoDataset(root, SPLIT)


def test_undecodable_image(quirky_root):
    (quirky_root / SPLIT / "000000000005.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    ds = CocoDataset(quirky_root, SPLIT)  # found at load time, not at construction
    ds[0]
    with pytest.raises(ImageDecodeError, match=r"000000000005\.png \(image id 5\): cannot decode"):
        ds[1]
    synthetic.Image.new("RGB", (10, 10)).save(quirky_root / SPLIT / "000000000009.png")
    with pytest.raises(ImageDecodeError, match=r"000000000009\.png \(image id 9\): decoded size 10x10"):
        ds[2]


def test_decode_error_surfaces_from_workers(quirky_root, tiny_cfg):
    (quirky_root / SPLIT / "000000000001.png").write_bytes(b"garbage")
    loader = make_loader(CocoDataset(quirky_root, SPLIT), tiny_cfg, 2, num_workers=1)
    with pytest.raises(ImageDecodeError, match=r"000000000001\.png"):
        list(loader)


# ---------------------------------------------------------------- static batches


def test_crop_masks_matches_roi_align_on_the_whole_mask(synthetic_root):
    ds = CocoDataset(synthetic_root, "train")
    _, target = ds[6]
    target = {k: target[k][:8] for k in ("boxes", "masks")}  # RoIAlign on whole masks is slow
    n = len(target["boxes"])
    rois = torch.cat([torch.arange(n, dtype=torch.float32)[:, None], target["boxes"]], 1)
    expected = roi_align(target["masks"].float()[:, None], rois, (56, 56), 1.0)[:, 0] >= 0.5
    assert torch.equal(crop_masks_to_boxes(target["masks"], target["boxes"], 56), expected.to(torch.uint8))


def test_collate_shapes_and_coordinates(synthetic_root, tiny_cfg):
    ds = CocoDataset.from_config(synthetic_root, "train", tiny_cfg)
    by_canvas: dict = {}
    for i, hw in enumerate(ds.sizes):
        by_canvas.setdefault(canvas_of(*hw, tiny_cfg), []).append(i)
    indices = max(by_canvas.values(), key=len)[:3]
    samples = [ds[i] for i in indices]
    batch, targets, meta = collate(samples, tiny_cfg, batch_size=4)
    g, s = tiny_cfg.max_gt_instances, tiny_cfg.gt_mask_size
    assert tuple(batch.tensors.shape[-2:]) in tiny_cfg.canvases and batch.tensors.shape[0] == 4
    assert targets.boxes.shape == (4, g, 4) and targets.labels.shape == (4, g)
    assert targets.masks.shape == (4, g, s, s) and targets.masks.dtype == torch.uint8
    assert batch.valid.tolist() == [True, True, True, False]
    assert meta.image_ids.tolist() == [t["image_id"] for _, t in samples] + [-1]
    for i, (image, target) in enumerate(samples):
        n = len(target["labels"])
        assert targets.valid[i].tolist() == [True] * n + [False] * (g - n)
        (rh, rw), (oh, ow) = batch.image_sizes[i].tolist(), image.shape[-2:]
        scale = torch.tensor([rw / ow, rh / oh, rw / ow, rh / oh])
        assert torch.allclose(targets.boxes[i, :n], target["boxes"] * scale, atol=1e-3)
        assert torch.equal(targets.labels[i, :n], target["labels"])
        assert torch.equal(targets.masks[i, :n], crop_masks_to_boxes(target["masks"], target["boxes"], s))
        assert not targets.masks[i, n:].any() and not targets.boxes[i, n:].any()
        assert (targets.boxes[i, :n, 2] <= rw + 1e-3).all() and (targets.boxes[i, :n, 3] <= rh + 1e-3).all()
    assert not targets.valid[3].any()


def test_collate_drops_crowds_and_truncates(quirky_root, tiny_cfg):
    ds = CocoDataset(quirky_root, SPLIT, include_crowd=True)
    _, targets, meta = collate([ds[0]], tiny_cfg)
    assert targets.valid[0].sum() == 2 and meta.num_truncated.tolist() == [0]
    one = tiny_cfg.replace(max_gt_instances=1)
    with pytest.warns(CocoDataWarning, match="image id 1: 2 instances, keeping the first 1"):
        _, targets, meta = collate([ds[0]], one)
    assert targets.valid.shape == (1, 1) and meta.num_truncated.tolist() == [1]
    assert targets.labels.tolist() == [[2]]


def test_bucket_sampler(synthetic_root, tiny_cfg):
    ds = CocoDataset(synthetic_root, "train")
    sampler = BucketBatchSampler(ds.sizes, tiny_cfg, 4, shuffle=True, seed=1)
    epoch0 = list(sampler)
    assert sorted(i for b in epoch0 for i in b) == list(range(len(ds)))
    for b in epoch0:  # one canvas per batch, and only the last of each bucket may be short
        assert len({canvas_of(*ds.sizes[i], tiny_cfg) for i in b}) == 1
    assert sum(len(b) < 4 for b in epoch0) <= len(sampler.groups)
    assert list(sampler) == epoch0
    sampler.set_epoch(1)
    assert list(sampler) != epoch0
    assert all(len(b) == 4 for b in BucketBatchSampler(ds.sizes, tiny_cfg, 4, drop_last=True))
    ranks = [list(BucketBatchSampler(ds.sizes, tiny_cfg, 4, num_replicas=2, rank=r)) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) > 0


def test_loader_pads_the_last_batch_and_matches_with_workers(synthetic_root, tiny_cfg):
    ds = CocoDataset(synthetic_root, "train")
    batches = list(make_loader(ds, tiny_cfg, 4, num_workers=0))
    seen = []
    padded = 0
    for batch, targets, meta in batches:
        assert batch.tensors.shape[0] == 4 and targets.boxes.shape[0] == 4
        ids = meta.image_ids[batch.valid].tolist()
        seen += ids
        assert (meta.image_ids[~batch.valid] == -1).all() and not targets.valid[~batch.valid].any()
        padded += int((~batch.valid).any())
    assert sorted(seen) == list(range(1, NUM_IMAGES + 1)) and padded >= 1

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing dropped along the way
        worker_batches = list(make_loader(ds, tiny_cfg, 4, num_workers=2))
    assert len(worker_batches) == len(batches)
    for (b0, t0, m0), (b1, t1, m1) in zip(batches, worker_batches):
        # Workers run torch on one thread; the resize then differs by up to ~7e-5 (measured), not more.
        assert torch.allclose(b0.tensors, b1.tensors, atol=1e-4) and torch.equal(m0.image_ids, m1.image_ids)
        assert all(torch.equal(x, y) for x, y in zip(t0, t1))


def test_loader_needs_sizes(tiny_cfg):
    with pytest.raises(TypeError, match="sizes"):
        make_loader([(torch.zeros(3, 8, 8), {})], tiny_cfg, 2)


def test_mask_area_matches_coco_area(synthetic_json):
    # The generator's "area" is pycocotools' pixel count, which COCOeval's size ranges use.
    img = synthetic_json["images"][6]
    for a in (a for a in synthetic_json["annotations"] if a["image_id"] == img["id"]):
        rle = mask_utils.frPyObjects(a["segmentation"], img["height"], img["width"])
        assert a["area"] == int(mask_utils.area(mask_utils.merge(rle)))
