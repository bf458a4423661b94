"""A commit's inference cases counted stage by stage: exact work counters, in a process that times nothing.

``python -m mrcnn_bench.history.stage_work OUT.json --cases A,B,...`` builds each case's eager fp32 CPU
stand-in on the ruler's workload and images (the same config: a compiled case's work is counted on its
eager model) and counts one call of the first image with :func:`mrcnn_bench.running.work_counters.case_work`:
FLOPs, aten operators and bytes written, per stage of :data:`mrcnn_bench.running.stages.STAGE_KEYS`.
Cases whose stand-ins are the same model share one count, so a commit pays for one call per distinct
implementation and config (static eager staged, static single graph, torchvision), seconds in all.

:func:`mrcnn_bench.history.commit.measure_commit` runs it after the timed processes, as a part of its
own: a count that fails leaves the timing alone (its benchmarks are skipped).

Output: a JSON object, ``"work"``: case name -> stage key -> counter -> count.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from mrcnn_bench.base.files import atomic_write
from mrcnn_bench.history.interleaved import check_request, ruler_context


def count_cases(case_names: Sequence[str], threads: int | None = None) -> dict[str, dict[str, dict[str, int]]]:
    """Case -> stage key -> counter -> count, on the ruler's workload (module docstring)."""
    # Imported here: it imports the commit's mrcnn, and `--help` should not wait for torch.
    from mrcnn_bench.running.work_counters import case_work

    check_request(case_names, None, phase="inference")
    _, _, ctx = ruler_context(threads, training=False)
    return case_work(case_names, ctx)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mrcnn_bench.history.stage_work",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="the counts are written here as JSON")
    parser.add_argument("--cases", required=True, help="comma-separated inference cases, e.g. static/eager,static/xla")
    parser.add_argument("--threads", type=int, default=None,
                        help="intra-op threads (default: the CPUs this process may use; no count depends on it)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    try:
        work = count_cases(names, args.threads)
    except (ValueError, NotImplementedError) as e:
        print(f"mrcnn_bench.history.stage_work: {e}", file=sys.stderr)
        return 2
    atomic_write(args.out, json.dumps({"work": work}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
