"""Reading ``torch.save`` files that come from outside: weights, checkpoints.

Always ``weights_only=True`` (no code runs from the file). A file that is not one a ``torch.save``
wrote can make torch's unpickler raise almost anything (KeyError, EOFError, RuntimeError,
UnpicklingError...); here every such failure becomes one ValueError naming the file.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from mrcnn.exits import UsageError


def read_torch_file(path: str | os.PathLike, what: str = "file") -> Any:
    """``torch.load(path, map_location="cpu", weights_only=True)``; ValueError naming ``path`` (and
    ``what`` it was meant to be) when it cannot be read as one."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {path}") from None
    except MemoryError:
        raise
    except Exception as e:  # the unpickler's errors on a foreign file have no common type
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise UsageError(f"{path}: not a {what} that torch.save wrote, or one holding more than tensors and "
                         f"plain values ({type(e).__name__}: {first})") from None
