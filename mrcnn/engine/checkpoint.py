"""Checkpoint files and RNG state: what exact resume needs.

A checkpoint is ``out_dir/checkpoint_<step:07d>.pt``, written atomically (temporary file, then
rename), holding the model, optimiser, scheduler and GradScaler states, the step, the loader
position (epoch and batches consumed in it), every rank's RNG states (torch, CUDA, numpy, python
``random``), the world size, the model config and the implementation. Everything in it loads with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mrcnn.exits import UsageError
from mrcnn.files import atomic_open
from mrcnn.torch_files import read_torch_file

_CHECKPOINT_RE = re.compile(r"checkpoint_(\d+)\.pt$")


def checkpoint_path(out_dir: str | Path, step: int) -> Path:
    return Path(out_dir) / f"checkpoint_{step:07d}.pt"


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The checkpoint with the highest step in ``out_dir``, or None."""
    found = [
        (int(m.group(1)), p) for p in Path(out_dir).glob("checkpoint_*.pt") if (m := _CHECKPOINT_RE.search(p.name))
    ]
    return max(found)[1] if found else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or a folder's latest checkpoint; FileNotFoundError when there is none."""
    path = Path(path)
    if path.is_dir():
        found = latest_checkpoint(path)
        if found is None:
            raise FileNotFoundError(f"no checkpoint_*.pt in {path} to resume from")
        path = found
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The contents of a checkpoint file, or of a folder's latest checkpoint (on the CPU)."""
    path = resolve_checkpoint(path)
    state = read_torch_file(path, "checkpoint")
    if not isinstance(state, dict):
        raise UsageError(f"{path}: not a checkpoint (a dict written by mrcnn train), got {type(state).__name__}")
    return state


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` to a temporary file, then rename: a crash never leaves a half-written checkpoint."""
    with atomic_open(path, "wb") as f:
        torch.save(obj, f)


def rng_state() -> dict[str, Any]:
    """This process's RNG states, in types ``torch.load(weights_only=True)`` accepts."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
