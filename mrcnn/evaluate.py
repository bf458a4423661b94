"""COCO mAP with pycocotools, from the model's fixed-shape outputs.

The path: ``Detections`` [B, K, ...] (canvas coordinates, M x M mask probabilities, ``valid``) ->
:func:`mrcnn.postprocess.postprocess` (valid detections only, boxes in original-image pixels,
masks pasted at the original size, exactly as torchvision) -> :func:`to_coco_results` (boxes to
COCO xywh, masks > 0.5 to RLE, labels to category ids) -> :func:`evaluate_coco` (``COCOeval`` for
"bbox" and "segm"). :class:`CocoEvaluator` strings these together batch by batch, so full-size
masks never pile up in memory.

Metrics are COCOeval's first six stats, keyed ``"<iou_type>/<name>"``: AP (IoU .50:.95), AP50,
AP75, APs, APm, APl, all at 100 detections per image. As in COCOeval, a value is -1.0 when no
ground truth falls in that category/area range (e.g. APl on a set without large objects); with
no detections at all AP is 0.0 wherever there is ground truth.
"""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pycocotools.mask as mask_utils
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import Tensor

from mrcnn.exits import UsageError
from mrcnn.postprocess import padded_masks, paste_window, per_image, resized_window, single_thread
from mrcnn.structures import Detections, ImageBatch

IOU_TYPES: tuple[str, ...] = ("bbox", "segm")
METRIC_NAMES: tuple[str, ...] = ("AP", "AP50", "AP75", "APs", "APm", "APl")  # COCOeval.stats[0:6]

LabelMap = Mapping[int, int] | Callable[[int], int] | None


def _category_ids(labels: Tensor, label_to_category_id: LabelMap) -> list[int]:
    values = labels.reshape(-1).tolist()
    if label_to_category_id is None:  # the 91-class convention: labels are category ids
        return [int(v) for v in values]
    if callable(label_to_category_id):
        return [int(label_to_category_id(v)) for v in values]
    try:
        return [int(label_to_category_id[v]) for v in values]
    except KeyError as e:
        raise UsageError(
            f"detection label {e.args[0]} has no category id (known labels {sorted(label_to_category_id)})"
        ) from None


def encode_masks(masks: Tensor, threshold: float = 0.5) -> list[dict[str, Any]]:
    """[N, 1, H, W] or [N, H, W] masks -> N compressed COCO RLEs (``counts`` as str, JSON-ready).

    Float masks are probabilities, binarised with ``> threshold`` as torchvision's COCO reference
    does; bool/uint8 masks are taken as they are (nonzero = inside).
    """
    if masks.dim() == 4:
        masks = masks[:, 0]
    if masks.is_floating_point():
        masks = masks > threshold
    if masks.shape[0] == 0:
        return []
    # pycocotools wants [H, W, N] in Fortran order, i.e. memory laid out as [N, W, H] in C order.
    fortran = masks.to(torch.uint8).transpose(1, 2).contiguous().cpu().numpy().transpose(2, 1, 0)
    rles = mask_utils.encode(fortran)
    for rle in rles:
        rle["counts"] = rle["counts"].decode("ascii")
    return rles


def _column_major_runs(patch: np.ndarray, x0: int, y0: int, height: int, width: int) -> list[int]:
    """Uncompressed COCO RLE counts of a [height, width] mask that is zero outside ``patch``.

    ``patch`` [ph, pw] bool sits at (y0, x0). COCO runs go down columns, starting with zeros, so
    only the pw columns that hold the patch need looking at: everything left of them is one run of
    zeros and everything right of them another.
    """
    ph, pw = patch.shape
    columns = np.zeros((pw, height), dtype=np.uint8)  # row j = image column x0 + j, top to bottom
    columns[:, y0 : y0 + ph] = patch.T
    flat = columns.reshape(-1)
    edges = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    runs = np.diff(np.concatenate(([0], edges, [flat.size]))).tolist()
    if flat[0]:
        runs.insert(0, 0)  # counts always start with a (possibly empty) run of zeros
    runs[0] += x0 * height
    tail = (width - x0 - pw) * height
    if tail:
        if flat[-1]:
            runs.append(tail)
        else:
            runs[-1] += tail
    return runs


def paste_and_encode(
    masks: Tensor, boxes: Tensor, image_size: tuple[int, int], threshold: float = 0.5, padding: int = 1
) -> list[dict[str, Any]]:
    """M x M mask probabilities -> COCO RLEs, without ever building a full-size mask.

    Gives exactly ``encode_masks(paste_masks_in_image(masks[:, None], boxes, image_size) > threshold)``
    (torchvision's paste, as :func:`mrcnn.postprocess.postprocess` uses it): the same padding, box
    expansion, integer box corners and bilinear resize, but each mask is resized, thresholded and
    run-length encoded only inside its own box. The full-size paste allocates and scans
    N x H x W floats per image and dominates evaluation time otherwise.

    Args:
        masks: [N, M, M] float probabilities (``Detections.masks`` of one image, valid rows only).
        boxes: [N, 4] float (x1, y1, x2, y2) in original-image pixels.
        image_size: (H, W) of the original image.
    Returns:
        N compressed RLEs, ``counts`` as str.
    """
    height, width = image_size
    if masks.shape[0] == 0:
        return []
    padded, int_boxes = padded_masks(masks, boxes, padding)
    with single_thread():
        uncompressed = [_paste_one(mask, box, height, width, threshold) for mask, box in zip(padded, int_boxes)]
    rles = mask_utils.frPyObjects(uncompressed, height, width)
    for rle in rles:
        rle["counts"] = rle["counts"].decode("ascii")
    return rles


def _paste_one(mask: Tensor, box: list[int], height: int, width: int, threshold: float) -> dict[str, Any]:
    """Uncompressed RLE of one [1, m, m] padded mask pasted into integer ``box`` (torchvision's paste)."""
    window = paste_window(box, height, width)
    if window is None:
        return {"counts": [height * width], "size": [height, width]}
    patch = (resized_window(mask, window) > threshold).numpy()
    rows, columns = window.image
    return {"counts": _column_major_runs(patch, columns.start, rows.start, height, width), "size": [height, width]}


def detections_to_coco_results(
    det: Detections,
    batch: ImageBatch,
    image_ids: Tensor | Sequence[int],
    label_to_category_id: LabelMap = None,
    *,
    iou_types: Sequence[str] = IOU_TYPES,
    mask_threshold: float = 0.5,
) -> tuple[dict[str, list[dict[str, Any]]], list[int]]:
    """Fixed-shape model output -> COCO results, the fast way (see :func:`paste_and_encode`).

    Same numbers as ``to_coco_results(postprocess(det, batch), ...)``: boxes are rescaled with
    postprocess's arithmetic (torchvision's per-axis float32 ratios) and masks pasted exactly as
    torchvision's paste does, only without full-size masks.

    Args:
        det: ``Detections`` [B, K, ...] in canvas coordinates, with M x M mask probabilities.
        batch: the ``ImageBatch`` they came from (sizes and ``valid``).
        image_ids: [B] COCO image id per slot (``BatchMeta.image_ids``); padding slots are skipped.
    Returns:
        (results as :func:`to_coco_results` gives them, image ids of the valid slots).
    """
    all_ids = torch.as_tensor(image_ids).cpu()
    results: dict[str, list[dict[str, Any]]] = {t: [] for t in iou_types}
    seen = []
    for d in per_image(det, batch):
        image_id = int(all_ids[d.index])
        seen.append(image_id)
        rles = paste_and_encode(d.masks, d.boxes, d.original_size, mask_threshold) if "segm" in results else None
        _append_results(results, image_id, d.boxes, d.scores, d.labels, rles, label_to_category_id)
    return results, seen


def _append_results(
    results: dict[str, list[dict[str, Any]]],
    image_id: int,
    boxes: Tensor,
    scores: Tensor,
    labels: Tensor,
    rles: list[dict[str, Any]] | None,
    label_to_category_id: LabelMap,
) -> None:
    scores_list = scores.detach().float().cpu().tolist()
    categories = _category_ids(labels.detach().cpu(), label_to_category_id)
    if "bbox" in results:
        xywh = boxes.detach().float().cpu().clone()
        xywh[:, 2:] -= xywh[:, :2]
        for box, score, cat in zip(xywh.tolist(), scores_list, categories):
            results["bbox"].append({"image_id": image_id, "category_id": cat, "bbox": box, "score": score})
    if "segm" in results and rles is not None:
        for rle, score, cat in zip(rles, scores_list, categories):
            results["segm"].append({"image_id": image_id, "category_id": cat, "segmentation": rle, "score": score})


def to_coco_results(
    outputs: Sequence[Mapping[str, Tensor]],
    image_ids: Sequence[int],
    label_to_category_id: LabelMap = None,
    *,
    iou_types: Sequence[str] = IOU_TYPES,
    mask_threshold: float = 0.5,
) -> dict[str, list[dict[str, Any]]]:
    """torchvision-style outputs -> COCO result lists, one per IoU type.

    Args:
        outputs: per image, ``boxes`` [N, 4] (x1, y1, x2, y2) in original-image pixels, ``scores``
            [N], ``labels`` [N], and for "segm" ``masks`` [N, 1, H, W] (or [N, H, W]) at the
            original size: what torchvision's model and :func:`mrcnn.postprocess.postprocess` give.
        image_ids: the COCO image id of each output.
        label_to_category_id: dict or function from label to category id; None when labels are
            category ids already (the 91-class COCO convention).
    Returns:
        ``{"bbox": [{image_id, category_id, bbox [x, y, w, h], score}, ...], "segm": [... with
        "segmentation" RLE instead of "bbox"]}``. Kept apart because pycocotools' ``loadRes``
        takes a result's area from its box whenever a box is present, which would put segm
        results in the wrong APs/APm/APl range.
    """
    if len(outputs) != len(image_ids):
        raise ValueError(f"{len(outputs)} outputs but {len(image_ids)} image ids")
    unknown = set(iou_types) - set(IOU_TYPES)
    if unknown:
        raise ValueError(f"unsupported iou_types {sorted(unknown)}; use {IOU_TYPES}")
    results: dict[str, list[dict[str, Any]]] = {t: [] for t in iou_types}
    for out, image_id in zip(outputs, image_ids):
        rles = None
        if "segm" in results:
            if "masks" not in out:
                raise ValueError(f"image id {int(image_id)}: 'segm' evaluation needs 'masks' in the outputs")
            rles = encode_masks(out["masks"].detach(), mask_threshold)
        _append_results(results, int(image_id), out["boxes"], out["scores"], out["labels"], rles, label_to_category_id)
    return results


def _empty_results(coco_gt: COCO) -> COCO:
    """A result set with no detections (``loadRes`` fails on an empty list)."""
    coco_dt = COCO()
    coco_dt.dataset = {
        "images": list(coco_gt.dataset["images"]),
        "categories": copy.deepcopy(coco_gt.dataset["categories"]),
        "annotations": [],
    }
    with contextlib.redirect_stdout(io.StringIO()):
        coco_dt.createIndex()
    return coco_dt


def evaluate_coco(
    coco_gt: COCO,
    results: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    image_ids: Sequence[int] | None = None,
    iou_types: Sequence[str] | None = None,
    verbose: bool = False,
) -> dict[str, float]:
    """COCOeval over ``results`` (as :func:`to_coco_results` makes them).

    Args:
        coco_gt: ground truth, e.g. ``CocoDataset.coco`` (crowds included: COCOeval needs them).
        results: ``{"bbox": [...], "segm": [...]}``; an empty list scores 0 (or -1, see module doc).
        image_ids: evaluate only these images (the ones the model saw); default every GT image.
        iou_types: default: the keys of ``results``.
        verbose: let COCOeval print its usual table.
    Returns:
        ``{"bbox/AP": ..., "bbox/AP50": ..., ..., "segm/APl": ...}``.
    """
    iou_types = tuple(results) if iou_types is None else tuple(iou_types)
    known = set(coco_gt.getImgIds())
    metrics: dict[str, float] = {}
    for iou_type in iou_types:
        if iou_type not in IOU_TYPES:
            raise ValueError(f"unsupported iou_type {iou_type!r}; use {IOU_TYPES}")
        dets = results.get(iou_type, [])
        stray = {d["image_id"] for d in dets} - known
        if stray:
            raise ValueError(f"{iou_type} results name image ids not in the ground truth: {sorted(stray)[:10]}")
        quiet = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
        with quiet:
            # loadRes writes ids, areas (and polygons for boxes) into the dicts it gets: give it copies.
            coco_dt = coco_gt.loadRes([dict(d) for d in dets]) if dets else _empty_results(coco_gt)
            evaluator = COCOeval(coco_gt, coco_dt, iou_type)
            if image_ids is not None:
                evaluator.params.imgIds = sorted({int(i) for i in image_ids})
            evaluator.evaluate()
            evaluator.accumulate()
            evaluator.summarize()
        for name, value in zip(METRIC_NAMES, evaluator.stats[: len(METRIC_NAMES)]):
            metrics[f"{iou_type}/{name}"] = float(value)
    return metrics


class CocoEvaluator:
    """Accumulate results batch by batch, then run COCOeval once over the images seen.

    Example::

        ev = CocoEvaluator(dataset.coco, dataset.label_to_category_id)
        for batch, targets, meta in loader:
            ev.update_detections(model(batch), batch, meta.image_ids)
        metrics = ev.summarize()
    """

    def __init__(
        self,
        coco_gt: COCO,
        label_to_category_id: LabelMap = None,
        *,
        iou_types: Sequence[str] = IOU_TYPES,
        mask_threshold: float = 0.5,
    ) -> None:
        self.coco_gt = coco_gt
        self.label_to_category_id = label_to_category_id
        self.iou_types = tuple(iou_types)
        self.mask_threshold = mask_threshold
        self.results: dict[str, list[dict[str, Any]]] = {t: [] for t in self.iou_types}
        self.image_ids: set[int] = set()

    def update(self, outputs: Sequence[Mapping[str, Tensor]], image_ids: Sequence[int]) -> None:
        """Add torchvision-style outputs (original-image coordinates) for ``image_ids``."""
        ids = [int(i) for i in image_ids]
        converted = to_coco_results(
            outputs, ids, self.label_to_category_id, iou_types=self.iou_types, mask_threshold=self.mask_threshold
        )
        for iou_type, dets in converted.items():
            self.results[iou_type] += dets
        self.image_ids.update(ids)

    def update_detections(
        self, det: Detections, batch: ImageBatch, image_ids: Tensor | Sequence[int], *, fast: bool = True
    ) -> None:
        """Add fixed-shape ``Detections`` [B, K, ...]; ``image_ids`` [B] (BatchMeta.image_ids).

        Only slots with ``batch.valid`` count, and only detections with ``det.valid``. ``fast``
        pastes and encodes masks inside their boxes only (:func:`paste_and_encode`, identical
        results); ``fast=False`` goes through :func:`mrcnn.postprocess.postprocess` and full-size
        masks, one image at a time to bound memory (100 masks at 480x640 are 120 MB).
        """
        if fast:
            converted, ids = detections_to_coco_results(
                det,
                batch,
                image_ids,
                self.label_to_category_id,
                iou_types=self.iou_types,
                mask_threshold=self.mask_threshold,
            )
            for iou_type, dets in converted.items():
                self.results[iou_type] += dets
            self.image_ids.update(ids)
            return
        from mrcnn.postprocess import postprocess  # the model side; imported late to keep this light

        all_ids = torch.as_tensor(image_ids).cpu()
        for i in torch.nonzero(batch.valid.cpu()).flatten().tolist():
            one = slice(i, i + 1)
            outputs = postprocess(Detections(*(t[one] for t in det)), ImageBatch(*(t[one] for t in batch)))
            self.update(outputs, [int(all_ids[i])])

    def summarize(self, verbose: bool = False) -> dict[str, float]:
        """COCO metrics over every image passed to :meth:`update` (none: every GT image)."""
        return evaluate_coco(
            self.coco_gt,
            self.results,
            image_ids=sorted(self.image_ids) if self.image_ids else None,
            iou_types=self.iou_types,
            verbose=verbose,
        )


def ground_truth_as_results(coco_gt: COCO, image_ids: Sequence[int] | None = None) -> dict[str, list[dict]]:
    """Every non-crowd GT annotation as a score-1 detection, at full resolution (the AP = 1 oracle)."""
    ids = coco_gt.getImgIds() if image_ids is None else list(image_ids)
    results: dict[str, list[dict[str, Any]]] = {"bbox": [], "segm": []}
    for ann in coco_gt.loadAnns(coco_gt.getAnnIds(imgIds=ids, iscrowd=False)):
        rle = coco_gt.annToRLE(ann)
        counts = rle["counts"]
        rle = {"size": rle["size"], "counts": counts.decode("ascii") if isinstance(counts, bytes) else counts}
        base = {"image_id": ann["image_id"], "category_id": ann["category_id"], "score": 1.0}
        results["bbox"].append({**base, "bbox": list(ann["bbox"])})
        results["segm"].append({**base, "segmentation": rle})
    return results
