"""Named training recipes: preset, config overrides, data and a :class:`TrainConfig`, as plain code.

A recipe pins everything a training run depends on except the training seed and the
implementation (static model or torchvision's), so ``mrcnn train --recipe tiny`` and the
harness's accuracy gate train the same thing. The data set is the deterministic synthetic one
(:mod:`mrcnn.data.synthetic`) generated with the recipe's own data seed, so every training seed
sees the same images: the spread across training seeds is the spread of the optimisation only.

Both recipes share one base (:data:`_BASE`): the ``tiny`` preset (ResNet-18 FPN, random init) with
fewer sampled RoIs and kept proposals, AdamW with gradient clipping, warm-up then one decay. They
differ in data and schedule:

``tiny``
    The convergence recipe: 400 training images at 224 px, evaluated on 100 held-out ones (what
    the model generalises to) every 200 steps. ``target_box_ap`` is where time to accuracy is
    measured.
``ci``
    A fitting test sized for CI: 48 images at 160 px, evaluated on those same images every 100
    steps, trained far enough up the curve that a broken box coder or misaligned mask targets cost
    more than the spread over training seeds and host kinds. Its stored baseline is what the
    accuracy gate checks on every change.

AdamW rather than torchvision's SGD: from random init the backbone's frozen batch norms are
identities and nothing normalises its activations, and SGD barely moves in this many steps.
``--optimizer sgd`` (and every other flag) still overrides a recipe.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrcnn.config import Config, get_config
from mrcnn.engine.config import TrainConfig, TrainSetupError
from mrcnn.engine.data import ensure_synthetic

# TrainConfig fields a recipe pins, in the order Recipe.as_dict lists them (stored with a baseline).
_PINNED_SCHEDULE = ("steps", "batch_size", "lr", "warmup_iters", "warmup_factor", "lr_steps", "gamma", "momentum",
                    "weight_decay", "optimizer", "clip_grad_norm", "init")  # fmt: skip


@dataclass(frozen=True)
class Recipe:
    """Everything a training run of the recipe needs, besides the seed and the implementation."""

    name: str
    description: str
    preset: str
    overrides: tuple[tuple[str, Any], ...]  # Config field overrides, applied to the preset
    # Data: the synthetic set, ``train_images`` train and ``val_images`` val images.
    train_images: int
    val_images: int
    data_seed: int
    # Schedule and evaluation; ``train.batch_size`` is the global batch (divided among DDP ranks),
    # ``train.val_split`` the split evaluated ("train": a fitting test, see ``ci``).
    train: TrainConfig
    target_box_ap: float = 0.0  # time to accuracy is measured to this box AP

    def config(self, **extra: Any) -> Config:
        """The recipe's Config (``extra`` overrides on top of the recipe's)."""
        return get_config(self.preset, **{**dict(self.overrides), **extra})

    def data_root(self, base: str | Path = "data") -> Path:
        """Where the recipe's data set lives under ``base`` (one folder per size and data seed)."""
        return Path(base) / f"synth-{self.train_images}-{self.val_images}-s{self.data_seed}"

    def prepare_data(self, base: str | Path = "data") -> Path:
        """Generate the recipe's synthetic train and val splits under ``base`` unless present."""
        root = self.data_root(base)
        ensure_synthetic(root, "train", self.train_images, self.data_seed)
        if self.val_images:
            ensure_synthetic(root, "val", self.val_images, self.data_seed + 1)
        return root

    def train_config(self, world_size: int = 1, **changes: Any) -> TrainConfig:
        """The recipe's :class:`TrainConfig` for one of ``world_size`` ranks (its share of the batch).

        ``changes``: other TrainConfig fields (seed, device, ...) on top.
        """
        if self.train.batch_size % world_size:
            raise TrainSetupError(
                f"recipe {self.name!r}: batch size {self.train.batch_size} does not split over {world_size}"
            )
        return self.train.replace(batch_size=self.train.batch_size // world_size, **changes)

    def as_dict(self) -> dict[str, Any]:
        """The settings a baseline stores: data, pinned schedule, ``eval_split``, ``eval_every``."""
        skipped = ("train", "target_box_ap")
        head = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skipped}
        head["overrides"] = dict(self.overrides)
        schedule = {name: getattr(self.train, name) for name in _PINNED_SCHEDULE}
        evaluation = {"eval_split": self.train.val_split, "eval_every": self.train.eval_every}
        return {**head, **schedule, **evaluation, "target_box_ap": self.target_box_ap}


# Shared by both recipes: the tiny preset's heads sample fewer RoIs and keep fewer proposals, which
# makes a step cheaper without changing what is learned much at this scale.
_FEWER_ROIS: tuple[tuple[str, Any], ...] = (
    ("box_batch_size_per_image", 64),
    ("rpn_post_nms_top_n_train", 300),
)

# The tiny recipe's images: short side 224, long side at most 352 (about half the pixels of 320/512).
_SMALL_IMAGES: tuple[tuple[str, Any], ...] = (
    ("min_size", 224),
    ("max_size", 352),
    ("canvases", ((224, 224), (224, 320), (224, 352), (320, 224), (352, 224))),
)

# The ci recipe's: short side 160, long side at most 256.
_CI_IMAGES: tuple[tuple[str, Any], ...] = (
    ("min_size", 160),
    ("max_size", 256),
    ("canvases", ((160, 160), (160, 224), (160, 256), (224, 160), (256, 160))),
)

_BASE = Recipe(
    name="",
    description="",
    preset="tiny",
    overrides=_FEWER_ROIS + _SMALL_IMAGES,
    train_images=0,
    val_images=0,
    data_seed=0,
    train=TrainConfig(
        steps=1200,
        batch_size=4,
        lr=1e-3,
        warmup_iters=50,
        warmup_factor=0.001,
        lr_steps=(1000,),
        optimizer="adamw",
        clip_grad_norm=10.0,
        eval_every=200,
    ),
    target_box_ap=0.5,  # the aim of time-to-accuracy measurements
)

RECIPES: dict[str, Recipe] = {
    "tiny": dataclasses.replace(
        _BASE,
        name="tiny",
        description="tiny preset from scratch on 400 synthetic images at 224 px, evaluated on 100 held-out ones",
        train_images=400,
        val_images=100,
    ),
    # Smaller images than tiny's and fewer steps: a step at 160 px is cheaper and AP rises faster per
    # step there, so CI's training costs well under half of tiny's schedule while each of the gate's
    # faults still costs several tolerances (the accuracy gate's results say by how much).
    "ci": dataclasses.replace(
        _BASE,
        name="ci",
        description="CI-sized fitting test: 48 images at 160 px, trained for 800 steps and evaluated on themselves",
        overrides=_FEWER_ROIS + _CI_IMAGES,
        train_images=48,
        train=_BASE.train.replace(val_split="train", steps=800, lr_steps=(650,), eval_every=100),
    ),
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise TrainSetupError(f"unknown recipe {name!r}; choose one of {sorted(RECIPES)}")
    return RECIPES[name]
