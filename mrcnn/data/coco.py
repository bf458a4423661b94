"""COCO-format loader: the synthetic set and an unchanged COCO 2017 download, through pycocotools.

A root holds ``annotations/instances_<split>.json`` and the images under ``<split>/``. The JSON is
read and checked here first, then indexed by pycocotools, so every problem is reported with the
file and the annotation id instead of surfacing as a KeyError deep inside pycocotools.

Labels: with ``label_mode="category_id"`` (the 91-class COCO preset) the label *is* the COCO
category id, gaps included, which is torchvision's convention and what its COCO weights predict.
With ``label_mode="contiguous"`` (every other data set) categories sorted by id get labels 1..C.
Label 0 is the background in both.

Crowd annotations (``iscrowd=1``, usually uncompressed RLE) are not training instances: they are
left out of the targets unless ``include_crowd=True``, but they stay in :attr:`CocoDataset.coco`,
the ground truth handed to COCOeval, which uses them to ignore detections on crowds.

Bad input, and what happens to it (``strict=True`` turns every skip into an error):

======================================  =========================================================
missing or unreadable annotation file   error naming the file
malformed JSON                          error naming the file, line and column
missing/duplicate ids, bad fields       error naming the file and the image/annotation id
file_name outside the image folder      error naming the image id (absolute, or ".." leaves it)
image larger than Pillow decodes        error naming the image id (its masks would not fit either)
polygon coordinate not finite, or       error naming the annotation (pycocotools' C code would
beyond [-W, 2W] x [-H, 2H]              crash on it)
RLE counts not h*w non-negative runs    error naming the annotation (its decoder writes past the
                                        mask otherwise)
JSON nested too deeply to read          error naming the file
missing image files                     error naming the first missing files and the count
image that fails to decode, wrong size  error (when loaded) naming the file and the image id
annotation of a missing image           skipped, counted (COCOeval never evaluates it)
annotation of a missing category        skipped, counted (COCOeval never evaluates it)
polygon with fewer than 3 points        that polygon dropped; annotation skipped if none is left;
                                        counted (pycocotools would crash or read it as a box)
box of zero width/height, or entirely   skipped, counted (torchvision's reference drops these
outside the image                       too, silently)
box partly outside the image            kept, clipped in the training targets, counted; the
                                        evaluation ground truth keeps COCO's box as it is
======================================  =========================================================

Skipped annotations are removed from the evaluation ground truth as well, so training and
evaluation always see the same instances. Counts are in :attr:`CocoDataset.skipped` (with example
ids in :attr:`CocoDataset.skipped_ids`) and summarised in one :class:`CocoDataWarning`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import warnings
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pycocotools.mask as mask_utils
import torch
from PIL import Image
from pycocotools.coco import COCO
from torch import Tensor
from torch.utils.data import Dataset

from mrcnn.config import Config
from mrcnn.data.coco_checks import inside_folder, is_number, max_image_pixels, polygons_problem, rle_problem
from mrcnn.data.images import rgb8
from mrcnn.exits import UsageError

LabelMode = Literal["contiguous", "category_id"]

COCO_NUM_CLASSES = 91  # torchvision's COCO models: background + category ids 1..90 (with gaps)


class CocoFormatError(UsageError):
    """An annotation file that cannot be used as it is; the message names the file and the id."""


class ImageDecodeError(OSError):
    """An image file that is missing, cannot be decoded, or disagrees with its JSON entry."""


class CocoDataWarning(UserWarning):
    """Annotations were skipped or clipped; the message gives the counts and example ids."""


# Why each annotation can be skipped (or, for box_clipped, changed); keys of CocoDataset.skipped.
SKIP_REASONS: dict[str, str] = {
    "unknown_image": "image_id not in 'images'",
    "unknown_category": "category_id not in 'categories'",
    "invalid_polygon": "no polygon with 3 or more points",
    "degenerate_box": "box with zero or negative width or height",
    "box_outside_image": "box entirely outside its image",
    "box_clipped": "box partly outside its image (kept, clipped in training targets)",
    "truncated_polygon": "polygon(s) with fewer than 3 points dropped (annotation kept)",
}
_NOT_SKIPS = ("box_clipped", "truncated_polygon")  # counted, but the annotation is kept


def label_mode_for(cfg: Config) -> LabelMode:
    """COCO's 91-class preset uses category ids as labels; every other class count is contiguous."""
    return "category_id" if cfg.num_classes == COCO_NUM_CLASSES else "contiguous"


def load_coco_json(path: str | Path) -> dict[str, Any]:
    """Read a COCO annotation file, with errors that name the file (and line/column for bad JSON)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"COCO annotation file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CocoFormatError(f"{path}: cannot read annotation file: {e}") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CocoFormatError(f"{path}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from e
    except RecursionError:
        raise CocoFormatError(f"{path}: JSON nested too deeply to read (a COCO file nests a few levels)") from None
    if not isinstance(data, dict):
        raise CocoFormatError(f"{path}: expected a JSON object at the top level, got {type(data).__name__}")
    for key in ("images", "categories"):
        if not isinstance(data.get(key), list):
            raise CocoFormatError(f"{path}: missing or non-list '{key}' (is this a COCO instances file?)")
    if not isinstance(data.get("annotations", []), list):
        raise CocoFormatError(f"{path}: 'annotations' must be a list")
    return data


def decode_segmentation(segm: Any, height: int, width: int) -> np.ndarray:
    """COCO ``segmentation`` (polygons, uncompressed or compressed RLE) -> [height, width] uint8 0/1."""
    if isinstance(segm, list):  # polygons: each [x1, y1, x2, y2, ...]; their union is the mask
        rle = mask_utils.merge(mask_utils.frPyObjects(segm, height, width))
    elif isinstance(segm.get("counts"), list):  # uncompressed RLE, as COCO stores crowds
        rle = mask_utils.frPyObjects(segm, height, width)
    else:  # compressed RLE (a string)
        rle = segm
    with warnings.catch_warnings():
        # pycocotools' decode trips numpy 2's __array__(copy=...) deprecation on every call: noise
        # that would bury real warnings (and fail runs that turn warnings into errors).
        warnings.filterwarnings("ignore", "__array__ implementation", DeprecationWarning)
        return mask_utils.decode(rle)


class CocoDataset(Dataset):
    """A COCO-layout data set: ``root/annotations/instances_<split>.json`` and ``root/<split>/``.

    Each item is ``(image, target)``:

    - image: [3, H, W] uint8, RGB, at the original size (no EXIF rotation, as COCO tools read it; any
      mode Pillow opens, 16-bit greyscale scaled to 8 bits: :func:`rgb8`);
    - target: ``image_id`` (int), ``boxes`` [N, 4] float32 (x1, y1, x2, y2) in original pixels,
      clipped to the image; ``labels`` [N] int64; ``masks`` [N, H, W] uint8 0/1; ``iscrowd`` [N]
      uint8; ``area`` [N] float32 (COCO's); ``ann_ids`` [N] int64. Crowds only if ``include_crowd``.

    Args:
        root: data set root.
        split: e.g. "train2017", "val2017" (real COCO) or "train" (synthetic).
        label_mode: "contiguous" (labels 1..C by sorted category id) or "category_id".
        num_classes: if given (background included), checked against the largest label.
        include_crowd: keep ``iscrowd=1`` annotations in the targets (flagged in ``iscrowd``).
        strict: raise on every annotation that would otherwise be skipped.
        ann_file, image_dir: override the COCO layout.
    """

    def __init__(
        self,
        root: str | Path,
        split: str = "train",
        *,
        label_mode: LabelMode = "contiguous",
        num_classes: int | None = None,
        include_crowd: bool = False,
        strict: bool = False,
        ann_file: str | Path | None = None,
        image_dir: str | Path | None = None,
    ) -> None:
        if label_mode not in ("contiguous", "category_id"):
            raise ValueError(f"label_mode must be 'contiguous' or 'category_id', got {label_mode!r}")
        self.root = Path(root)
        self.split = split
        self.ann_file = Path(ann_file) if ann_file else self.root / "annotations" / f"instances_{split}.json"
        self.image_dir = Path(image_dir) if image_dir else self.root / split
        self.label_mode: LabelMode = label_mode
        self.include_crowd = include_crowd
        self.strict = strict
        self.skipped: Counter[str] = Counter()
        self.skipped_ids: dict[str, list[int]] = {}

        raw = load_coco_json(self.ann_file)
        self.images = self._check_images(raw["images"])
        self.categories = self._check_categories(raw["categories"])
        annotations = self._check_annotations(raw.get("annotations", []))
        self._check_image_files()

        # pycocotools indexes our cleaned copy, so training and COCOeval share one ground truth.
        dataset = {k: v for k, v in raw.items() if k != "annotations"}
        dataset["annotations"] = annotations
        self.coco = COCO()
        self.coco.dataset = dataset
        with contextlib.redirect_stdout(io.StringIO()):  # createIndex prints progress
            self.coco.createIndex()
        self.ids: list[int] = sorted(self.images)

        cat_ids = sorted(self.categories)
        if label_mode == "category_id":
            self.category_id_to_label = {c: c for c in cat_ids}
        else:
            self.category_id_to_label = {c: k + 1 for k, c in enumerate(cat_ids)}
        self.label_to_category_id = {v: k for k, v in self.category_id_to_label.items()}
        self.label_names = {self.category_id_to_label[c]: self.categories[c].get("name", str(c)) for c in cat_ids}
        max_label = max(self.label_to_category_id, default=0)
        if num_classes is not None and max_label >= num_classes:
            hint = " (use label_mode='contiguous')" if label_mode == "category_id" else ""
            raise UsageError(
                f"{self.ann_file}: labels go up to {max_label} ({len(cat_ids)} categories, "
                f"label_mode={label_mode!r}) but num_classes is {num_classes}{hint}"
            )
        self._warn_skips()

    @classmethod
    def from_config(cls, root: str | Path, split: str, cfg: Config, **kwargs: Any) -> CocoDataset:
        """The data set with the label convention and class-count check ``cfg`` implies."""
        return cls(root, split, label_mode=label_mode_for(cfg), num_classes=cfg.num_classes, **kwargs)

    # ------------------------------------------------------------------ validation

    def _fail(self, what: str) -> CocoFormatError:
        return CocoFormatError(f"{self.ann_file}: {what}")

    def _check_images(self, images: list[Any]) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for k, img in enumerate(images):
            if not isinstance(img, dict) or not isinstance(img.get("id"), int):
                raise self._fail(f"images[{k}] has no integer 'id'")
            iid = img["id"]
            if iid in out:
                raise self._fail(f"duplicate image id {iid}")
            if not isinstance(img.get("file_name"), str) or not img["file_name"]:
                raise self._fail(f"image id {iid} has no 'file_name'")
            if not inside_folder(img["file_name"]):
                raise self._fail(f"image id {iid}: file_name {img['file_name']!r} is not a path inside the image "
                                 f"folder {self.image_dir} (absolute, or '..' leaves it)")
            for key in ("height", "width"):
                if not isinstance(img.get(key), int) or isinstance(img[key], bool) or img[key] <= 0:
                    raise self._fail(f"image id {iid} ({img['file_name']}) has no positive integer '{key}'")
            if img["height"] * img["width"] > max_image_pixels():
                raise self._fail(f"image id {iid} ({img['file_name']}) declares {img['height']}x{img['width']} "
                                 f"pixels, more than the {max_image_pixels()} an image may have (Pillow refuses "
                                 "to decode it, and each of its masks would be that many bytes)")
            out[iid] = img
        return out

    def _check_categories(self, categories: list[Any]) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for k, cat in enumerate(categories):
            if not isinstance(cat, dict) or not isinstance(cat.get("id"), int) or cat["id"] <= 0:
                raise self._fail(f"categories[{k}] needs a positive integer 'id' (0 is the background)")
            if cat["id"] in out:
                raise self._fail(f"duplicate category id {cat['id']}")
            out[cat["id"]] = cat
        return out

    def _skip(self, reason: str, ann_id: int) -> None:
        if self.strict and reason != "box_clipped":  # clipping loses nothing COCOeval would use
            raise self._fail(f"annotation id {ann_id}: {SKIP_REASONS[reason]}")
        self.skipped[reason] += 1
        examples = self.skipped_ids.setdefault(reason, [])
        if len(examples) < 10:
            examples.append(ann_id)

    def _check_annotations(self, annotations: list[Any]) -> list[dict[str, Any]]:
        kept: list[dict[str, Any]] = []
        seen: set[int] = set()
        for k, ann in enumerate(annotations):
            if not isinstance(ann, dict) or not isinstance(ann.get("id"), int):
                raise self._fail(f"annotations[{k}] has no integer 'id'")
            aid = ann["id"]
            if aid in seen:  # pycocotools would silently keep only the last one
                raise self._fail(f"duplicate annotation id {aid}")
            seen.add(aid)
            img = self.images.get(ann.get("image_id"))  # type: ignore[arg-type]
            if img is None:
                self._skip("unknown_image", aid)
                continue
            if ann.get("category_id") not in self.categories:
                self._skip("unknown_category", aid)
                continue
            bbox = ann.get("bbox")
            if not isinstance(bbox, list) or len(bbox) != 4 or not all(is_number(v) for v in bbox):
                raise self._fail(f"annotation id {aid}: 'bbox' must be 4 finite numbers [x, y, w, h], got {bbox!r}")
            ann = self._check_segmentation(ann, img)
            if ann is None:
                continue
            x, y, w, h = bbox
            if w <= 0 or h <= 0:
                self._skip("degenerate_box", aid)
                continue
            if x >= img["width"] or y >= img["height"] or x + w <= 0 or y + h <= 0:
                self._skip("box_outside_image", aid)
                continue
            if x < 0 or y < 0 or x + w > img["width"] or y + h > img["height"]:
                self._skip("box_clipped", aid)
            # COCOeval reads both fields; fill them in as COCO defines them rather than fail there.
            if "iscrowd" not in ann:
                ann = {**ann, "iscrowd": 0}
            if not is_number(ann.get("area")):
                mask = decode_segmentation(ann["segmentation"], img["height"], img["width"])
                ann = {**ann, "area": float(mask.sum())}
            kept.append(ann)
        return kept

    def _check_segmentation(self, ann: dict[str, Any], img: dict[str, Any]) -> dict[str, Any] | None:
        """The annotation with unusable polygons removed, or None when it was skipped."""
        aid, segm = ann["id"], ann.get("segmentation")
        if isinstance(segm, dict):
            problem = rle_problem(segm, img["height"], img["width"])
            if problem:
                raise self._fail(f"annotation id {aid}: {problem} (image id {img['id']})")
            return ann
        if not isinstance(segm, list):
            raise self._fail(f"annotation id {aid}: 'segmentation' must be polygons or RLE, got {type(segm).__name__}")
        problem = polygons_problem(segm, img["height"], img["width"])
        if problem:
            raise self._fail(f"annotation id {aid}: {problem} (image id {img['id']})")
        # Fewer than 6 numbers is not a polygon (and pycocotools reads exactly 4 as a box).
        good = [p for p in segm if isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0]
        if not good:
            self._skip("invalid_polygon", aid)
            return None
        if len(good) < len(segm):
            self._skip("truncated_polygon", aid)
            ann = {**ann, "segmentation": good}
        return ann

    def _check_image_files(self) -> None:
        if not self.image_dir.is_dir():
            raise FileNotFoundError(f"image folder {self.image_dir} (for {self.ann_file}) does not exist")
        # One directory listing instead of a stat per file: 118k images take well under a second.
        present = set(os.listdir(self.image_dir))
        missing = [
            img["file_name"]
            for img in self.images.values()
            if img["file_name"] not in present and not (self.image_dir / img["file_name"]).is_file()
        ]
        if missing:
            shown = ", ".join(str(self.image_dir / f) for f in missing[:5])
            raise FileNotFoundError(
                f"{len(missing)} of {len(self.images)} images listed in {self.ann_file} are missing: {shown}"
                + (", ..." if len(missing) > 5 else "")
            )

    def _warn_skips(self) -> None:
        if not self.skipped:
            return
        parts = []
        for reason, n in sorted(self.skipped.items()):
            ids = self.skipped_ids[reason]
            parts.append(f"{n} {SKIP_REASONS[reason]} (annotation ids {ids}{'...' if n > len(ids) else ''})")
        dropped = sum(n for r, n in self.skipped.items() if r not in _NOT_SKIPS)
        warnings.warn(
            f"{self.ann_file}: {dropped} annotation(s) skipped; " + "; ".join(parts), CocoDataWarning, stacklevel=3
        )

    # ------------------------------------------------------------------ access

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def sizes(self) -> list[tuple[int, int]]:
        """(height, width) of every item, from the JSON (no decoding): for canvas bucketing."""
        return [(self.images[i]["height"], self.images[i]["width"]) for i in self.ids]

    def image_path(self, index: int) -> Path:
        return self.image_dir / self.images[self.ids[index]]["file_name"]

    def load_image(self, index: int) -> Tensor:
        """Item ``index``'s image, [3, H, W] uint8 RGB; errors name the file and the image id."""
        info = self.images[self.ids[index]]
        path = self.image_dir / info["file_name"]
        try:
            with Image.open(path) as pil:
                array = rgb8(pil)
        except FileNotFoundError:
            raise ImageDecodeError(f"{path} (image id {info['id']}): file not found") from None
        except (OSError, ValueError, Image.DecompressionBombError) as e:
            raise ImageDecodeError(f"{path} (image id {info['id']}): cannot decode image: {e}") from e
        if array.shape[:2] != (info["height"], info["width"]):
            raise ImageDecodeError(
                f"{path} (image id {info['id']}): decoded size {array.shape[0]}x{array.shape[1]} differs from "
                f"{info['height']}x{info['width']} in {self.ann_file}"
            )
        return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()

    def load_target(self, index: int) -> dict[str, Any]:
        """Item ``index``'s annotations as tensors (see the class docstring), without the image."""
        info = self.images[self.ids[index]]
        h, w = info["height"], info["width"]
        anns = [a for a in self.coco.imgToAnns.get(info["id"], []) if self.include_crowd or not a.get("iscrowd", 0)]
        boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]  # xywh -> xyxy
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, w)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, h)
        masks = np.zeros((len(anns), h, w), dtype=np.uint8)
        for k, a in enumerate(anns):
            masks[k] = decode_segmentation(a["segmentation"], h, w)
        return {
            "image_id": info["id"],
            "boxes": boxes,
            "labels": torch.tensor([self.category_id_to_label[a["category_id"]] for a in anns], dtype=torch.int64),
            "masks": torch.from_numpy(masks),
            "iscrowd": torch.tensor([int(a.get("iscrowd", 0)) for a in anns], dtype=torch.uint8),
            "area": torch.tensor([float(a.get("area", 0.0)) for a in anns], dtype=torch.float32),
            "ann_ids": torch.tensor([a["id"] for a in anns], dtype=torch.int64),
        }

    def __getitem__(self, index: int) -> tuple[Tensor, dict[str, Any]]:
        return self.load_image(index), self.load_target(index)

    def labels_to_category_ids(self, labels: Tensor | np.ndarray | list[int]) -> list[int]:
        """Model labels -> COCO category ids. Raises on a label no category has (0 included)."""
        out = []
        for label in np.asarray(labels).reshape(-1).tolist():
            if label not in self.label_to_category_id:
                raise UsageError(
                    f"label {label} has no category in {self.ann_file} (labels: {sorted(self.label_to_category_id)})"
                )
            out.append(self.label_to_category_id[label])
        return out

    def category_mapping(self) -> Mapping[int, int]:
        """label -> category id, for :func:`mrcnn.evaluate.to_coco_results`."""
        return dict(self.label_to_category_id)
