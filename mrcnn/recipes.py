"""Named training recipes: preset, config overrides, data, schedule and target, as plain code.

A recipe pins everything a training run depends on except the training seed and the
implementation (static model or torchvision's), so ``mrcnn train --recipe tiny`` and the accuracy
gate (:mod:`mrcnn.accuracy`) train the same thing. The data set is the deterministic synthetic one
(:mod:`mrcnn.data.synthetic`) generated with the recipe's own data seed, so every training seed
sees the same images: the spread across training seeds is the spread of the optimisation only.

Recipes (measured numbers in ``results/training/`` and ``results/accuracy/``):

``tiny``
    The convergence recipe: the ``tiny`` preset (ResNet-18 FPN, random init) with fewer sampled
    RoIs and kept proposals, trained as ``ci`` is (same image sizes, optimiser and schedule) but on
    400 images and evaluated every 200 steps on 100 held-out ones: what the model generalises to in
    about 15 minutes of steps on 2 idle CPU cores (1200 steps at 0.73 s), plus 6 evaluations. It
    ends at held-out box AP 0.173 +- 0.014 / mask AP 0.168 +- 0.015 (3 seeds), torchvision's model
    at 0.173 / 0.175. ``target_box_ap``
    (the issue's aim, 0.5) is where time to accuracy is measured; held-out AP stays far below it.
``ci``
    A fitting test sized for CI: the same model on 224-px images, 1200 steps of 4 images (decay at
    1000) on 48 images, evaluated on those same images every 200 steps. AP takes off between steps
    400 and 800 and ends near box AP 0.81 / mask AP 0.67, where 5 seeds agree within 0.05 / 0.02:
    far enough up the curve that a broken box coder or misaligned mask targets cost more than the
    seed spread (``results/accuracy/teeth.md``). About 1000 CPU-seconds of steps at one thread;
    0.73 s per step at 2 threads, so about 15 minutes on 2 idle cores. Its baseline
    (``results/accuracy/ci.json``) is what the accuracy gate checks on every change. (At 600 steps,
    the first version of this recipe, AP was 0.14-0.21 and rising steeply, and neither fault failed
    the gate.) ``target_box_ap`` 0.5 is where time to accuracy is measured.

Both use AdamW with gradient clipping rather than torchvision's SGD: from random init the
backbone's frozen batch norms are identities and nothing normalises its activations. In 200
steps of the ``ci`` set-up SGD (lr 0.02, momentum 0.9, the reference's) ended at box and mask AP
0.0000 on all 3 seeds (lr 0.04 diverged at step 36), AdamW at 0.001-0.003: better, but far from
usable. These recipes are the best measured here, not a converged result. ``--optimizer sgd``
(and every other flag) still overrides a recipe.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrcnn.config import Config, get_config


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
    # Schedule (mrcnn.train.train arguments).
    steps: int
    batch_size: int  # images per step, over all ranks (divided among DDP ranks)
    lr: float
    warmup_iters: int
    warmup_factor: float
    lr_steps: tuple[int, ...]
    gamma: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    optimizer: str = "sgd"  # "sgd" or "adamw" (mrcnn.train.build_optimizer)
    clip_grad_norm: float = 0.0
    init: str = "default"  # "zero_residual": mrcnn.train.zero_residual_init
    eval_split: str = "val"  # "train": evaluate on the training images (a fitting test, see ``ci``)
    eval_every: int = 0  # evaluate the val split every this many steps (0: only at the end)
    target_box_ap: float = 0.0  # time to accuracy is measured to this box AP

    def config(self, **extra: Any) -> Config:
        """The recipe's Config (``extra`` overrides on top of the recipe's)."""
        return get_config(self.preset, **{**dict(self.overrides), **extra})

    def data_root(self, base: str | Path = "data") -> Path:
        """Where the recipe's data set lives under ``base`` (one folder per size and data seed)."""
        return Path(base) / f"synth-{self.train_images}-{self.val_images}-s{self.data_seed}"

    def prepare_data(self, base: str | Path = "data") -> Path:
        """Generate the recipe's synthetic train and val splits under ``base`` unless present."""
        from mrcnn.train import ensure_synthetic

        root = self.data_root(base)
        ensure_synthetic(root, "train", self.train_images, self.data_seed)
        if self.val_images:
            ensure_synthetic(root, "val", self.val_images, self.data_seed + 1)
        return root

    def train_kwargs(self, world_size: int = 1) -> dict[str, Any]:
        """Keyword arguments of :func:`mrcnn.train.train` (batch size per rank for ``world_size`` ranks)."""
        if self.batch_size % world_size:
            raise ValueError(f"recipe {self.name!r}: batch size {self.batch_size} does not split over {world_size}")
        return {
            "steps": self.steps,
            "batch_size": self.batch_size // world_size,
            "lr": self.lr,
            "momentum": self.momentum,
            "weight_decay": self.weight_decay,
            "optimizer": self.optimizer,
            "clip_grad_norm": self.clip_grad_norm,
            "init": self.init,
            "warmup_iters": self.warmup_iters,
            "warmup_factor": self.warmup_factor,
            "lr_steps": list(self.lr_steps),
            "gamma": self.gamma,
            "eval_every": self.eval_every,
            "val_split": self.eval_split,
        }

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["overrides"] = dict(self.overrides)
        return d


# Shared by both recipes: the tiny preset's heads sample fewer RoIs and keep fewer proposals, which
# makes a step cheaper without changing what is learned much at this scale.
_FEWER_ROIS: tuple[tuple[str, Any], ...] = (
    ("box_batch_size_per_image", 64),
    ("rpn_post_nms_top_n_train", 300),
)

# Both recipes' images: short side 224, long side at most 352 (about half the pixels of 320/512).
_SMALL_IMAGES: tuple[tuple[str, Any], ...] = (
    ("min_size", 224),
    ("max_size", 352),
    ("canvases", ((224, 224), (224, 320), (224, 352), (320, 224), (352, 224))),
)

RECIPES: dict[str, Recipe] = {
    "tiny": Recipe(
        name="tiny",
        description="tiny preset from scratch on 400 synthetic images at 224 px, evaluated on 100 held-out ones",
        preset="tiny",
        overrides=_FEWER_ROIS + _SMALL_IMAGES,
        train_images=400,
        val_images=100,
        data_seed=0,
        steps=1200,
        batch_size=4,
        lr=1e-3,
        warmup_iters=50,
        warmup_factor=0.001,
        lr_steps=(1000,),
        optimizer="adamw",
        clip_grad_norm=10.0,
        eval_every=200,
        target_box_ap=0.5,  # the aim; not reached on held-out images (results/training/README.md)
    ),
    "ci": Recipe(
        name="ci",
        description="CI-sized fitting test: 48 images at 224 px, trained for 1200 steps and evaluated on themselves",
        preset="tiny",
        overrides=_FEWER_ROIS + _SMALL_IMAGES,
        train_images=48,
        val_images=0,
        data_seed=0,
        steps=1200,
        batch_size=4,
        lr=1e-3,
        warmup_iters=50,
        warmup_factor=0.001,
        lr_steps=(1000,),
        optimizer="adamw",
        clip_grad_norm=10.0,
        eval_every=200,
        eval_split="train",
        target_box_ap=0.5,
    ),
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {sorted(RECIPES)}")
    return RECIPES[name]
