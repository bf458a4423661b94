"""Mixed precision: the autocast context and GradScaler of an ``amp`` mode ("none", "bf16", "fp16")."""

from __future__ import annotations

import contextlib

import torch


def autocast(amp: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast to bf16 or fp16 on ``device``'s type; no-op for "none"."""
    if amp == "none":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def eval_autocast(amp: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Evaluation keeps bf16 but runs fp16 training's evaluation in fp32 (fp16 is for the scaled backward)."""
    return autocast(amp if amp == "bf16" else "none", device)


def grad_scaler(amp: str) -> torch.amp.GradScaler | None:
    """fp16 needs loss scaling (CUDA only); the other modes none."""
    return torch.amp.GradScaler("cuda") if amp == "fp16" else None
