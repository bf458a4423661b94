"""COCO evaluation: the oracles (ground truth fed back), the fixed-shape path, crowds and edge cases."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torchvision.models.detection.roi_heads import paste_masks_in_image
from torchvision.ops import roi_align

from mrcnn.data import synthetic
from mrcnn.data.coco import CocoDataset
from mrcnn.data.collate import collate
from mrcnn.evaluate import (
    METRIC_NAMES,
    CocoEvaluator,
    detections_to_coco_results,
    encode_masks,
    evaluate_coco,
    ground_truth_as_results,
    paste_and_encode,
    to_coco_results,
)
from mrcnn.postprocess import postprocess
from mrcnn.structures import Detections
from tests.fixtures.coco_quirks import CROWD_MASK, SPLIT, write_quirky_coco

NUM_IMAGES = 12
# segm AP of the ground truth sent through the fixed-shape path (canvas box + 28 x 28 RoIAlign crop,
# pasted back with torchvision's paste). Measured (seed 0): 0.804 on these 12 images, 0.776 on 30,
# 0.750 on 200 (APs 0.66, APm 0.96, APl 1.0; AP50 0.99). The loss sits in small objects and comes
# from the paste's integer box corners and RoIAlign's half-pixel offset, not from M: the mean mask
# IoU is the same with M = 56 or 112.
FIXED_SHAPE_SEGM_AP_FLOOR = 0.75


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> CocoDataset:
    root = synthetic.generate(tmp_path_factory.mktemp("synthetic"), NUM_IMAGES, seed=0, progress=False)
    return CocoDataset(root, "train")


@pytest.fixture(scope="module")
def samples(dataset) -> list:
    return [dataset[i] for i in range(len(dataset))]


def _gt_as_outputs(target: dict) -> dict:
    n = len(target["labels"])
    return {
        "boxes": target["boxes"],
        "scores": torch.ones(n),
        "labels": target["labels"],
        "masks": target["masks"][:, None].float(),
    }


def _gt_as_detections(sample: tuple, cfg) -> tuple:
    """One image's ground truth as fixed-shape model output: canvas boxes, M x M soft masks."""
    _, target = sample
    batch, targets, meta = collate([sample], cfg, batch_size=2)  # a padding slot too
    n, k, m = len(target["labels"]), cfg.box_detections_per_img, cfg.mask_size
    rois = torch.cat([torch.arange(n, dtype=torch.float32)[:, None], target["boxes"]], 1)
    # What a perfect model would predict: the mask inside its box at M x M, as torchvision trains it.
    crops = roi_align(target["masks"].float()[:, None], rois, (m, m), 1.0)[:, 0]
    det = Detections(
        torch.zeros(2, k, 4), torch.zeros(2, k), torch.zeros(2, k, dtype=torch.int64),
        torch.zeros(2, k, m, m), torch.zeros(2, k, dtype=torch.bool),
    )  # fmt: skip
    det.boxes[0, :n] = targets.boxes[0, :n]
    det.scores[0, :n] = 1.0
    det.labels[0, :n] = targets.labels[0, :n]
    det.masks[0, :n] = crops
    det.valid[0, :n] = True
    det.valid[1, :3] = True  # detections in the padding slot must be ignored
    return det, batch, meta


def test_ground_truth_fed_back_scores_one(dataset, samples):
    ev = CocoEvaluator(dataset.coco, dataset.label_to_category_id)
    for _, target in samples:
        ev.update([_gt_as_outputs(target)], [target["image_id"]])
    metrics = ev.summarize()
    assert set(metrics) == {f"{t}/{n}" for t in ("bbox", "segm") for n in METRIC_NAMES}
    # COCOeval averages over classes and IoU thresholds, so "1.0" may come out as 1 - 2e-16.
    assert metrics["bbox/AP"] == pytest.approx(1.0, abs=1e-12)
    assert metrics["segm/AP"] == pytest.approx(1.0, abs=1e-12)
    for value in metrics.values():  # -1: no GT in that size range
        assert value == pytest.approx(1.0, abs=1e-12) or value == -1.0
    assert evaluate_coco(dataset.coco, ground_truth_as_results(dataset.coco))["segm/AP"] == pytest.approx(1.0)


def test_fixed_shape_path(tiny_cfg, dataset, samples):
    ev = CocoEvaluator(dataset.coco, dataset.label_to_category_id)
    for sample in samples:
        det, batch, meta = _gt_as_detections(sample, tiny_cfg)
        ev.update_detections(det, batch, meta.image_ids)
    assert ev.image_ids == set(dataset.ids)
    metrics = ev.summarize()
    assert metrics["bbox/AP"] == pytest.approx(1.0, abs=1e-9)  # canvas and back: float round-off only
    assert FIXED_SHAPE_SEGM_AP_FLOOR <= metrics["segm/AP"] < 1.0
    assert metrics["segm/AP50"] == pytest.approx(1.0, abs=1e-12)


def test_fast_path_equals_postprocess_path(tiny_cfg, dataset, samples):
    fast = CocoEvaluator(dataset.coco, dataset.label_to_category_id)
    slow = CocoEvaluator(dataset.coco, dataset.label_to_category_id)
    for sample in samples[:4]:
        det, batch, meta = _gt_as_detections(sample, tiny_cfg)
        fast.update_detections(det, batch, meta.image_ids)
        slow.update_detections(det, batch, meta.image_ids, fast=False)
        # And directly: the same boxes as postprocess, to the bit.
        results, ids = detections_to_coco_results(det, batch, meta.image_ids)
        (out,) = postprocess(det, batch)
        assert ids == [sample[1]["image_id"]]
        xywh = out["boxes"].clone()
        xywh[:, 2:] -= xywh[:, :2]
        assert [r["bbox"] for r in results["bbox"]] == xywh.tolist()
    assert fast.results == slow.results
    assert fast.summarize() == slow.summarize()


def test_paste_and_encode_equals_full_size_paste():
    gen = torch.Generator().manual_seed(0)
    height, width, n = 61, 83, 200
    masks = torch.rand(n, 28, 28, generator=gen)
    xy = torch.rand(n, 2, generator=gen) * torch.tensor([width + 20.0, height + 20.0]) - 10
    wh = torch.rand(n, 2, generator=gen) ** 3 * 70 + 0.05  # mostly small, some tiny and some huge
    boxes = torch.cat([xy, xy + wh], 1)
    boxes[:, 0::2] = boxes[:, 0::2].clamp(0, width)
    boxes[:, 1::2] = boxes[:, 1::2].clamp(0, height)
    expected = encode_masks(paste_masks_in_image(masks[:, None], boxes, (height, width)), 0.5)
    assert paste_and_encode(masks, boxes, (height, width)) == expected
    assert paste_and_encode(masks[:0], boxes[:0], (height, width)) == []


def test_dropping_half_the_detections(dataset):
    """Keep every other GT object of each class: COCO AP must fall to the value its formula gives."""
    results = ground_truth_as_results(dataset.coco)
    anns = sorted(dataset.coco.anns.values(), key=lambda a: a["id"])
    kept_ids, expected = set(), []
    rec_thrs = np.linspace(0.0, 1.0, 101)  # COCOeval's recall thresholds
    for cat in dataset.coco.getCatIds():
        ids = [a["id"] for a in anns if a["category_id"] == cat]
        kept = ids[::2]
        kept_ids.update(kept)
        # Every kept detection is a true positive with precision 1, up to recall k/n and none after.
        expected.append(np.count_nonzero(rec_thrs <= len(kept) / len(ids)) / len(rec_thrs))
    # ground_truth_as_results lists the annotations in getAnnIds order.
    order = dataset.coco.getAnnIds(imgIds=dataset.coco.getImgIds(), iscrowd=False)
    halved = {t: [r for r, aid in zip(results[t], order) if aid in kept_ids] for t in ("bbox", "segm")}
    assert len(halved["bbox"]) == len(kept_ids) < len(anns)
    metrics = evaluate_coco(dataset.coco, halved)
    assert metrics["bbox/AP"] == pytest.approx(float(np.mean(expected)), abs=1e-12)
    assert metrics["segm/AP"] == pytest.approx(float(np.mean(expected)), abs=1e-12)
    assert 0.5 <= metrics["bbox/AP"] < 0.6


def test_crowds_are_ignored_and_labels_map_back(tmp_path):
    ds = CocoDataset(write_quirky_coco(tmp_path), SPLIT)  # contiguous labels 1..4 for ids 1, 3, 7, 90
    ev = CocoEvaluator(ds.coco, ds.label_to_category_id)
    for index in range(len(ds)):
        _, target = ds[index]
        ev.update([_gt_as_outputs(target)], [target["image_id"]])
    # A confident "person" (label 1) on the crowd region: matched to the crowd, so neither a true
    # nor a false positive.
    crowd = torch.from_numpy(CROWD_MASK)[None, None].float()
    ev.update([{"boxes": torch.tensor([[40.0, 10.0, 55.0, 30.0]]), "scores": torch.tensor([0.99]),
                "labels": torch.tensor([1]), "masks": crowd}], [1])  # fmt: skip
    assert {r["category_id"] for r in ev.results["bbox"]} == {1, 3, 7, 90}
    metrics = ev.summarize()
    assert metrics["bbox/AP"] == pytest.approx(1.0, abs=1e-12)
    assert metrics["segm/AP"] == pytest.approx(1.0, abs=1e-12)
    json.dumps(ev.results)  # results are plain JSON (RLE counts as str)


def test_empty_results_and_image_subsets(dataset, capsys):
    metrics = evaluate_coco(dataset.coco, {"bbox": [], "segm": []})
    assert metrics["bbox/AP"] == 0.0 and metrics["segm/AP"] == 0.0
    assert capsys.readouterr().out == ""  # COCOeval's prints are silenced unless verbose
    ev = CocoEvaluator(dataset.coco)
    assert ev.summarize()["bbox/AP"] == 0.0
    # Images never given to the evaluator are not evaluated: one perfect image scores 1.
    image_id = dataset.ids[0]
    one = to_coco_results([_gt_as_outputs(dataset[0][1])], [image_id])
    assert evaluate_coco(dataset.coco, one, image_ids=[image_id])["segm/AP"] == pytest.approx(1.0, abs=1e-12)
    assert evaluate_coco(dataset.coco, one)["segm/AP"] < 0.5
    evaluate_coco(dataset.coco, one, iou_types=["bbox"], verbose=True)
    assert "Average Precision" in capsys.readouterr().out


def test_bad_results(dataset):
    out = _gt_as_outputs(dataset[0][1])
    with pytest.raises(ValueError, match=r"label \d has no category"):
        to_coco_results([out], [dataset.ids[0]], {})
    with pytest.raises(ValueError, match="not in the ground truth: \\[123456\\]"):
        evaluate_coco(dataset.coco, to_coco_results([out], [123456]))
    with pytest.raises(ValueError, match="needs 'masks'"):
        to_coco_results([{k: v for k, v in out.items() if k != "masks"}], [dataset.ids[0]])
    assert to_coco_results([out], [dataset.ids[0]], iou_types=["bbox"]).keys() == {"bbox"}
