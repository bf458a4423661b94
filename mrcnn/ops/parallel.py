"""torchvision's single-threaded CPU kernels on several threads, one chunk of RoIs per thread.

torchvision's CPU ``roi_align`` kernels, forward and backward, loop over the RoIs on one thread.
The ``*_tv`` RoIAlign ops (:mod:`mrcnn.ops.roi_align`) deal each level's RoIs into
``torch.get_num_threads()`` chunks (:func:`deal`) and run the chunks' kernel calls concurrently
(:func:`run_groups`) on Python threads: a call through ``torch.ops`` releases the GIL while the C++
kernel runs. It happens inside the custom ops' real kernels, so eager calls and ``torch.compile``
(to which the ops are opaque nodes with fake kernels) both get it, and nothing of it is traced.

The same kernel pools each RoI whichever chunk holds it, so the threaded forward is bit-identical
to one call per level. In the backward every chunk scatters into a gradient map of its own and the
maps are summed: equal up to the order of the float additions.
"""

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

# Read by the *_tv ops at every call (inside their kernels, so torch.compile never guards on it):
# True splits CPU calls across torch.get_num_threads() threads; False makes one kernel call per
# level, on the calling thread. MRCNN_ROI_ALIGN_THREADS=0 in the environment sets it False at import.
THREADED = os.environ.get("MRCNN_ROI_ALIGN_THREADS", "1").strip().lower() not in ("0", "false", "off", "no")

Task = tuple[int, Tensor]  # (level, flat indices of the RoIs it pools)

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_key: tuple[int, int] = (0, 0)  # (pid, workers): a forked child (a DataLoader worker) makes its own


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_key
    with _pool_lock:
        key = (os.getpid(), workers)
        if _pool is None or _pool_key != key:
            if _pool is not None and _pool_key[0] == key[0]:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(workers, thread_name_prefix="mrcnn-roi-align")
            _pool_key = key
        return _pool


def num_chunks(device: torch.device) -> int:
    """How many concurrent kernel calls a level's RoIs are split into: 1 unless THREADED on the CPU."""
    return max(1, torch.get_num_threads()) if THREADED and device.type == "cpu" else 1


def deal(members: list[Tensor], n: int) -> list[list[Task]]:
    """Deal each level's RoIs (``members[level]``: flat indices) into ``n`` contiguous, near-equal
    chunks, one per group. Every RoI costs the kernel the same (fixed bins and samples), so equal
    counts balance the groups: a level's larger chunks go to the groups holding fewest RoIs so far.
    Empty chunks and groups are dropped."""
    groups: list[list[Task]] = [[] for _ in range(n)]
    loads = [0] * n
    for level, idx in enumerate(members):
        lightest_first = sorted(range(n), key=loads.__getitem__)
        for j, chunk in zip(lightest_first, idx.tensor_split(n)):  # tensor_split: larger chunks first
            if chunk.numel() > 0:
                groups[j].append((level, chunk))
                loads[j] += chunk.numel()
    return [g for g in groups if g]


def run_groups(fn: Callable[[int, Tensor], Tensor], groups: list[list[Task]]) -> list[list[Tensor]]:
    """``[[fn(*task) for task in group] for group in groups]``, the groups concurrently: group 0 on
    the calling thread, the others on a pool. Every group runs without autograd and in the caller's
    inference mode (both are thread-local, so a worker would not inherit them)."""
    inference = torch.is_inference_mode_enabled()

    def run(group: list[Task]) -> list[Tensor]:
        with torch.inference_mode(inference), torch.no_grad():
            return [fn(*task) for task in group]

    if len(groups) == 1:
        return [run(groups[0])]
    futures = [_executor(len(groups) - 1).submit(run, g) for g in groups[1:]]
    first = run(groups[0])
    return [first] + [f.result() for f in futures]
