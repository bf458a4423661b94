"""Accuracy across commits without training at each: one fixed checkpoint, each commit's inference.

The fixture is made once per machine (``make asv-fixture``, i.e. ``mrcnn-bench asv fixture
make``): torchvision's Mask R-CNN trained on the ``ci`` recipe by ``python -m mrcnn.train --impl
torchvision``, its weights saved as ``model.pt``, beside the recipe's generated images and their
COCO annotations. torchvision is pinned, so the file does not depend on the commit being measured;
it lives outside git (``.asv/fixtures`` by default, ``$MRCNN_ASV_FIXTURE`` to move it).

Each commit then loads those weights into its own static model (torchvision's names load strictly)
and scores the fixed images with its own inference, box decoding and mask pasting: a commit that
breaks any of them shows as a step in ``1 - AP``. Faults that only change training targets (the
box-coder fault of the accuracy gate) cannot move this figure; the training gate is for those.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrcnn_bench.base import timing
from mrcnn_bench.base.files import atomic_write, read_json

FIXTURE_ENV = "MRCNN_ASV_FIXTURE"
DEFAULT_ROOT = Path(".asv/fixtures")
RECIPE = "ci"
IMPL = "torchvision"


@dataclass(frozen=True)
class Fixture:
    """Where the fixture's files are: ``model.pt``, ``fixture.json``, ``data/`` and ``train/``."""

    root: Path

    @classmethod
    def default(cls) -> Fixture:
        return cls(Path(os.environ.get(FIXTURE_ENV) or DEFAULT_ROOT).resolve())

    @property
    def model(self) -> Path:
        return self.root / "model.pt"

    @property
    def meta(self) -> Path:
        return self.root / "fixture.json"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def train(self) -> Path:
        return self.root / "train"

    def ready(self) -> bool:
        return self.model.is_file() and self.meta.is_file()

    def missing_reason(self) -> str | None:
        if self.ready():
            return None
        return f"no accuracy fixture in {self.root}: run `make asv-fixture` once (trains for about 15-20 minutes)"


@dataclass(frozen=True)
class AccuracyRecord:
    """COCO AP of one commit's static model on the fixture's images (pycocotools, AP@[.5:.95])."""

    box_ap: float
    mask_ap: float
    images: int
    seconds: float  # model build + inference + scoring, for the budget; not a tracked metric
    model_sha256: str  # the weights scored, so a changed fixture is never mistaken for a commit's effect

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_fixture(fixture: Fixture, progress: bool = True) -> dict[str, Any]:
    """Train once (unless ``model.pt`` exists) and write ``model.pt`` and ``fixture.json``; returns the metadata."""
    if fixture.ready():
        return read_json(fixture.meta, "the fixture's metadata", dict)
    # Imported here: `--help` and the asv suite's import of this module should not wait for torch.
    import torch

    # The library as installed for this commit.
    from mrcnn.engine.checkpoint import latest_checkpoint
    from mrcnn.recipes import get_recipe

    recipe = get_recipe(RECIPE)
    command = [
        sys.executable,
        "-m",
        "mrcnn.train",
        "--recipe",
        RECIPE,
        "--impl",
        IMPL,
        "--data",
        str(fixture.data),
        "--out",
        str(fixture.train),
    ]
    latest = latest_checkpoint(fixture.train)
    if latest is None or _last_step(fixture.train) < recipe.train.steps:
        if latest is not None:
            command += ["--resume", str(fixture.train)]
        print("making the accuracy fixture:", " ".join(command), file=sys.stderr, flush=True)
        subprocess.run(command + ([] if progress else ["--no-progress"]), check=True)
        latest = latest_checkpoint(fixture.train)
    checkpoint = torch.load(latest, map_location="cpu", weights_only=True)
    torch.save(checkpoint["model"], fixture.model)
    meta = {
        "recipe": RECIPE,
        "impl": IMPL,
        "data_root": str(recipe.data_root(fixture.data).relative_to(fixture.root)),
        "split": recipe.train.val_split,
        "steps": checkpoint.get("step"),
        "torchvision_metrics": _final_metrics(fixture.train),
        "command": " ".join(command),
        "model_sha256": _sha256(fixture.model),
        "torch": torch.__version__,
    }
    atomic_write(fixture.meta, json.dumps(meta, indent=1))
    return meta


def _metrics_lines(train_dir: Path) -> list[dict[str, Any]]:
    path = train_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _last_step(train_dir: Path) -> int:
    lines = _metrics_lines(train_dir)
    return int(lines[-1]["step"]) if lines else 0


def _final_metrics(train_dir: Path) -> dict[str, float]:
    """The last evaluation torchvision's own model got in training (``bbox/*``, ``segm/*``)."""
    for line in reversed(_metrics_lines(train_dir)):
        if "bbox/AP" in line:
            return {k: v for k, v in line.items() if k.startswith(("bbox/", "segm/"))}
    return {}


def evaluate_fixture(fixture: Fixture, threads: int | None = None) -> AccuracyRecord:
    """Score this process's ``mrcnn`` static model, loaded with the fixture's weights, on its images."""
    reason = fixture.missing_reason()
    if reason:
        raise FileNotFoundError(reason)
    # Imported here, as in make_fixture; and mrcnn is the commit's, which only this part needs.
    import torch

    # The commit's own inference and scoring: what this figure follows across commits.
    from mrcnn.data.coco import CocoDataset
    from mrcnn.engine.evaluation import evaluate
    from mrcnn.model import MaskRCNN
    from mrcnn.recipes import get_recipe
    from mrcnn.weights import load_torchvision_weights

    wall = timing.Stopwatch()
    torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
    meta = read_json(fixture.meta, "the fixture's metadata", dict)
    cfg = get_recipe(meta["recipe"]).config()  # the commit's own settings for the recipe
    state = torch.load(fixture.model, map_location="cpu", weights_only=True)
    model = load_torchvision_weights(MaskRCNN(cfg), state)
    dataset = CocoDataset(fixture.root / meta["data_root"], meta["split"])
    metrics = evaluate(model, dataset, cfg, batch_size=2, device=torch.device("cpu"))
    return AccuracyRecord(
        metrics["bbox/AP"], metrics["segm/AP"], len(dataset), wall.elapsed(), meta["model_sha256"]
    )


def build_parser(prog: str = "mrcnn-bench asv fixture") -> argparse.ArgumentParser:
    """``mrcnn-bench asv fixture``'s arguments."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make", help="train the fixed checkpoint once (about 15-20 minutes on 2 cores)")
    # Spelled out rather than mrcnn.progress.add_progress_flag: asv imports this module beside older
    # commits' mrcnn, which lack mrcnn.progress.
    make.add_argument("--no-progress", "--quiet", dest="no_progress", action="store_true",
                      help="no progress output from the training run")
    ev = sub.add_parser("evaluate", help="AP of this checkout's static model on the fixture, as JSON")
    ev.add_argument("out", type=Path, help="the record is written here")
    for p in (make, ev):
        p.add_argument(
            "--root", type=Path, default=None, help=f"fixture folder (default ${FIXTURE_ENV} or {DEFAULT_ROOT})"
        )
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "mrcnn-bench asv fixture") -> int:
    args = build_parser(prog).parse_args(argv)
    fixture = Fixture(args.root.resolve()) if args.root else Fixture.default()
    try:
        if args.command == "make":
            print(json.dumps(make_fixture(fixture, progress=not args.no_progress), indent=1))
        else:
            atomic_write(args.out, json.dumps(evaluate_fixture(fixture).to_dict(), indent=1))
    except (FileNotFoundError, subprocess.CalledProcessError) as e:
        print(f"mrcnn_bench.history.fixed_accuracy: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
