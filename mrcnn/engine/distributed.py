"""Process-group set-up and the few collectives the training loop needs.

Launched by ``torchrun`` (``WORLD_SIZE`` > 1 in the environment), the process group is initialised
from the environment: gloo on the CPU, nccl on CUDA (each rank on cuda:LOCAL_RANK). A single
process needs no group, and every helper here is then a no-op.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
import torch.distributed as dist

from mrcnn.exits import UsageError


@dataclasses.dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # this module initialised the process group (and destroys it)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def env_world_size() -> int:
    """Ranks torchrun launched (1 outside torchrun); readable before the group exists."""
    return _env_int("WORLD_SIZE", 1)


def env_rank() -> int:
    return _env_int("RANK", 0)


def _env_int(name: str, default: int) -> int:
    """``$name`` as an int (``default`` when unset); UsageError naming the variable otherwise."""
    text = os.environ.get(name, str(default))
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"${name} must be an integer, got {text!r}") from None


def init_distributed(device: str) -> DistInfo:
    """Join the process group torchrun describes (WORLD_SIZE > 1 in the environment); else single process."""
    world_size = env_world_size()
    if world_size <= 1:
        return DistInfo()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    owns = False
    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if device.startswith("cuda"):
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend=backend)
        owns = True
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, owns)


def shutdown(info: DistInfo) -> None:
    """Destroy the process group if :func:`init_distributed` created it."""
    if info.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


def all_gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    """Every rank's ``obj``, in rank order (``[obj]`` in a single process)."""
    if not info.distributed:
        return [obj]
    gathered: list[Any] = [None] * info.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def mean_over_ranks(values: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """[N] tensor -> its mean over ranks (the tensor itself in a single process)."""
    if not info.distributed:
        return values
    values = values.clone()
    dist.all_reduce(values)
    values /= info.world_size
    return values


def per_rank_counts(count: int, info: DistInfo, device: torch.device) -> list[int]:
    """Every rank's ``count``, in rank order ([world_size] float64 summed over ranks, each rank its slot)."""
    counts = torch.zeros(info.world_size, dtype=torch.float64, device=device)
    counts[info.rank] = count
    if info.distributed:
        dist.all_reduce(counts)
    return [int(c) for c in counts.tolist()]
