"""Do loaded packages reproduce the eager model? Output comparison for ``mrcnn export --check``.

Eager here is the model with the pure-tensor ops, the form that is exported, run on the same
padded batch as the packages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mrcnn.config import Canvas
from mrcnn.export.core import OUTPUT_NAMES, DeployableMaskRCNN, tensor_ops_model
from mrcnn.export.deployed import DeployedModel
from mrcnn.export.ppm import read_ppm
from mrcnn.parity import match_detections
from mrcnn.weights import textured_images

# Pairing rule of match_outputs, and the worst mask IoU of a pair that still counts as a match.
IOU_MIN = 0.99
SCORE_TOL = 1e-3
MIN_MASK_IOU = 0.95


def max_abs_diff(a: Sequence[Tensor], b: Sequence[Tensor]) -> dict[str, float]:
    """Per output field, the largest absolute difference (bool/int fields as 0/1 or label steps)."""
    return {n: float((x.double() - y.double()).abs().max()) if x.numel() else 0.0
            for n, x, y in zip(OUTPUT_NAMES, a, b)}


def match_outputs(
    expected: Sequence[Tensor], actual: Sequence[Tensor], iou_min: float = IOU_MIN, score_tol: float = SCORE_TOL
) -> dict[str, float]:
    """Order-insensitive agreement of two output tuples (boxes, scores, labels, masks, valid).

    Compiled kernels round differently from eager ones, so two detections with nearly equal scores
    may swap ranks, and an element-wise comparison would then report a box or label difference.
    Here valid detections are paired instead (same label, box IoU >= ``iou_min``, scores within
    ``score_tol``; :func:`mrcnn.parity.match_detections`), and their masks compared by IoU at 0.5.
    Returns matched (fraction of the larger set), counts, and the smallest mask IoU of a pair.
    """
    matched = n_expected = n_actual = 0
    min_mask_iou = 1.0
    fields = ((0, "boxes"), (1, "scores"), (2, "labels"), (3, "masks"))
    for i in range(expected[0].shape[0]):
        ref, other = ({name: out[k][i].cpu()[out[4][i].cpu()] for k, name in fields} for out in (expected, actual))
        parity = match_detections(ref, other, iou_min=iou_min, score_tol=score_tol)
        matched += parity.matched
        n_expected += parity.num_ref
        n_actual += parity.num_other
        min_mask_iou = min(min_mask_iou, parity.min_mask_iou)
    most = max(n_expected, n_actual)
    return {"matched": matched / most if most else 1.0, "expected": n_expected, "actual": n_actual,
            "min_mask_iou": min_mask_iou}


def check_images(canvas: Canvas, batch_size: int, seed: int = 0, ppm: str | Path | None = None) -> list[Tensor]:
    """``batch_size`` [3, h, w] images to compare on: the PPM at ``ppm`` (uint8), repeated, or else a
    generated float image of (3H/4) x H pixels, H the canvas height (``seed`` picks it)."""
    images = [read_ppm(ppm)] if ppm is not None else textured_images(((canvas[0] * 3 // 4, canvas[0]),), seed=seed)
    return (images * batch_size)[:batch_size]


def _cpu(outputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
    return tuple(t.cpu() for t in outputs)


def check_outputs(model: nn.Module, packages: Mapping[str, DeployedModel], images: list[Tensor]) -> dict[str, Any]:
    """Outputs of each package (name -> loaded package) against eager on ``images``.

    The images go through the first package's transform (its canvas, padded to its batch size);
    every package and eager get that same batch, each on its own device. Returns, per package name, ``max_abs_diff``
    (:func:`max_abs_diff`), ``valid_equal`` (same valid [B, K] flags) and ``matched``
    (:func:`match_outputs`); and ``num_valid``, the eager model's number of valid detections.
    """
    first = next(iter(packages.values()))
    batch = first.image_batch(images[: first.meta.batch_size])
    args = (batch.tensors, batch.image_sizes)
    report: dict[str, Any] = {"max_abs_diff": {}, "valid_equal": {}, "matched": {}}
    model_device = next(model.parameters()).device
    with torch.no_grad():  # compared on the CPU: the model and a package may sit on different devices
        eager = _cpu(DeployableMaskRCNN(tensor_ops_model(model.eval()))(*(a.to(model_device) for a in args)))
        for name, deployed in packages.items():
            out = _cpu(deployed(*args))
            report["max_abs_diff"][name] = max_abs_diff(eager, out)
            report["valid_equal"][name] = bool(torch.equal(eager[4], out[4]))
            report["matched"][name] = match_outputs(eager, out)
    report["num_valid"] = int(eager[4].sum())
    return report


def describe_check(report: dict[str, Any]) -> list[str]:
    """Log lines of a :func:`check_outputs` report: one for eager, one per package (pairing as by default)."""
    lines = [f"valid detections (eager): {report['num_valid']}"]
    for name, diff in report["max_abs_diff"].items():
        m = report["matched"][name]
        lines.append(
            f"{name} vs eager: {m['matched']:.1%} of detections paired (label, box IoU >= 0.99, score +-1e-3), "
            f"min mask IoU {m['min_mask_iou']:.3f}; element-wise max |diff| (rank swaps of "
            "near-equal scores show up here): " + ", ".join(f"{k} {v:.2e}" for k, v in diff.items())
        )
    return lines


def mismatches(report: dict[str, Any], min_mask_iou: float = MIN_MASK_IOU) -> list[str]:
    """Packages of a :func:`check_outputs` report whose outputs do not match eager, each with why.

    A package matches when every valid detection of either side has a partner in the other
    (:func:`match_outputs`) and no partner's mask IoU is below ``min_mask_iou``.
    """
    problems = []
    for name, m in report["matched"].items():
        if m["matched"] < 1.0 or m["min_mask_iou"] < min_mask_iou:
            problems.append(
                f"{name}: {m['matched']:.1%} of detections paired ({m['expected']} eager, {m['actual']} "
                f"package), min mask IoU {m['min_mask_iou']:.3f} (at least {min_mask_iou} needed)"
            )
    return problems
