"""The loop's side jobs, run after every step in this order: progress bar, checkpoint, evaluation, metrics file.

Checkpointing and evaluation are collective (every rank calls them; rank 0 does the work and the
others wait at a barrier), so every rank must hold the same hooks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mrcnn.data.coco import CocoDataset
from mrcnn.engine.checkpoint import atomic_save, checkpoint_path, rng_state
from mrcnn.engine.distributed import all_gather_objects, barrier
from mrcnn.engine.trainer import Hook, Trainer
from mrcnn.exits import UsageError
from mrcnn.progress import progress

METRICS_FILE = "metrics.jsonl"


class ProgressBar(Hook):
    """Progress over the run's steps (rank 0, unless disabled), showing the loss and lr (:mod:`mrcnn.progress`)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.bar: Any = None

    def before_train(self, trainer: Trainer) -> None:
        enabled = self.enabled and trainer.info.main
        self.bar = progress(total=trainer.total, initial=trainer.state.step, desc="train", unit="step", enabled=enabled)

    def after_step(self, trainer: Trainer, record: dict[str, Any]) -> None:
        assert self.bar is not None
        self.bar.update(1)
        # Shown at the next redraw: a redraw per step would be a line per step in a CI log.
        self.bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.3g}", refresh=False)

    def after_train(self, trainer: Trainer) -> None:
        if self.bar is not None:
            self.bar.close()


class PeriodicCheckpointer(Hook):
    """``out_dir/checkpoint_<step>.pt`` every ``every`` steps (0: never) and after the last step.

    Every rank's RNG state goes in (gathered to rank 0, which writes the file atomically).
    """

    def __init__(self, out_dir: str | Path, every: int) -> None:
        self.out_dir, self.every = Path(out_dir), every

    def after_step(self, trainer: Trainer, record: dict[str, Any]) -> None:
        step = trainer.state.step
        if (self.every and step % self.every == 0) or step == trainer.total:
            trainer.state.last_checkpoint = self.save(trainer) or trainer.state.last_checkpoint

    def save(self, trainer: Trainer) -> Path | None:
        """Write the checkpoint of the current step; its path on rank 0, None elsewhere."""
        states = all_gather_objects(rng_state(), trainer.info)
        path = None
        if trainer.info.main:
            path = checkpoint_path(self.out_dir, trainer.state.step)
            atomic_save(trainer.state_dict(states), path)
        barrier(trainer.info)
        return path


class PeriodicEvaluator(Hook):
    """COCO metrics of ``dataset`` (rank 0) every ``every`` steps (0: never) and, if ``at_end``, after the last.

    The metrics go into the step's record; ``dataset`` None (no val split, or not rank 0) records none.
    """

    def __init__(self, dataset: CocoDataset | None, batch_size: int, every: int, at_end: bool) -> None:
        self.dataset, self.batch_size, self.every, self.at_end = dataset, batch_size, every, at_end

    def after_step(self, trainer: Trainer, record: dict[str, Any]) -> None:
        step = trainer.state.step
        if not ((self.every and step % self.every == 0) or (self.at_end and step == trainer.total)):
            return
        metrics: dict[str, float] = {}
        if trainer.info.main and self.dataset is not None:
            amp = trainer.options.amp
            metrics = trainer.adapter.evaluate(trainer.model, self.dataset, self.batch_size, trainer.device, amp)
            trainer.model.train()
        barrier(trainer.info)
        trainer.state.metrics = metrics
        record.update(metrics)


class MetricsWriter(Hook):
    """One JSON object per step in ``out_dir/metrics.jsonl`` (rank 0).

    Before the first step the file keeps only the records up to the start step: a resumed run
    rewrites what came after its checkpoint, and a fresh run into a used folder starts a fresh curve.
    """

    def __init__(self, out_dir: str | Path) -> None:
        self.path = Path(out_dir) / METRICS_FILE

    def before_train(self, trainer: Trainer) -> None:
        if trainer.info.main:
            truncate_metrics(self.path, trainer.state.step)

    def after_step(self, trainer: Trainer, record: dict[str, Any]) -> None:
        if trainer.info.main:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the records of ``path`` up to ``step``; UsageError for a file that does not hold metrics records."""
    if not path.is_file():
        return
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        kept = [line for line in lines if line and json.loads(line)["step"] <= step]
    except (ValueError, KeyError, TypeError) as e:  # a damaged or foreign file in --out
        raise UsageError(f"{path}: not the metrics of mrcnn train ({type(e).__name__}: {e})") from None
    path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
