"""What a run measures of its rows besides time, after the rounds: FLOPs per call and COCO AP.

Neither is timed, so both run here in the run's own process: a row timed in a worker is evaluated
by a pipeline built here (:func:`evaluate_rows`), and FLOPs are counted once per (implementation,
phase, variant) on the eager CPU model (:func:`count_row_flops`).
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import traceback
from collections.abc import Callable

from mrcnn.data.coco import CocoDataset
from mrcnn.data.synthetic import generate
from mrcnn.evaluate import CocoEvaluator
from mrcnn_bench.running.cases import Variant
from mrcnn_bench.running.context import Context
from mrcnn_bench.running.execution import InProcessRow, RowRunner
from mrcnn_bench.running.pipelines import Pipeline
from mrcnn_bench.running.probes import auto_staged, case_flops
from mrcnn_bench.running.records import RowResult

Log = Callable[[str], None]  # the run's log line (mrcnn_bench.running.runner.log)


def count_row_flops(results: list[RowResult], ctx: Context, log: Log) -> None:
    """FLOPs per call, counted once per (implementation, phase, config overrides, variant, staged or
    not) on the eager CPU model: a case's overrides (mask buckets) change the work a call does, and
    so does whether "auto" mask buckets stage the row (eager CPU rows) or not (compiled rows)."""
    cache: dict[tuple, float] = {}
    for r in results:
        if r.row.variant.code is not None or r.status != "ok":
            continue  # other code is counted in its own process only
        key = (r.row.case.impl, r.row.case.phase, r.row.case.overrides, r.row.variant, auto_staged(r.row, ctx))
        if key not in cache:
            try:
                cache[key] = case_flops(r.row, ctx)
            except Exception:
                log(f"FLOP count of {r.row.name} failed:\n{traceback.format_exc()}")
                cache[key] = math.nan
        r.flops = cache[key]


EVAL_CASES = ("static/eager", "torchvision/eager")


def evaluate_rows(results: list[RowResult], runners: dict[str, RowRunner], ctx: Context, images: int,
                  root: str | None, split: str, log: Log) -> None:
    """COCO box and mask AP (pycocotools) of the eager inference rows on ``images`` images of the COCO-layout
    ``root``'s ``split`` (None: a synthetic val split generated for the run)."""
    with contextlib.ExitStack() as stack:
        if root is None:
            root, split = stack.enter_context(tempfile.TemporaryDirectory(prefix="mrcnn_bench_val_")), "val"
            generate(root, images, seed=10_000 + ctx.seed, split=split, progress=False)
        dataset = CocoDataset.from_config(root, split, ctx.config(Variant()))
        count = min(images, len(dataset))
        for r in results:
            if r.row.case.name not in EVAL_CASES or r.row.variant.code is not None:
                continue
            runner = runners[r.row.name]
            # Accuracy is not timed: a row in a worker is evaluated by a pipeline built here.
            pipeline = runner.pipeline if isinstance(runner, InProcessRow) else Pipeline(r.row, ctx)
            if not isinstance(runner, InProcessRow):
                pipeline.setup()
            log(f"{r.row.name}: COCO evaluation on {count} images of {root} ({split})")
            evaluator = CocoEvaluator(dataset.coco, dataset.label_to_category_id)
            for i in range(count):
                image, target = dataset[i]
                evaluator.update(pipeline.infer([image.float() / 255]), [int(target["image_id"])])
            metrics = evaluator.summarize()
            r.accuracy = {"box_ap": metrics["bbox/AP"], "mask_ap": metrics["segm/AP"], "eval_images": count}
