"""The asv machine name for this host and its accuracy fixture: ``<cpu>-<N>c-fx<sha8>``.

    PYTHONPATH=bench python -m mrcnn_bench.asv_machine     # prints e.g. amd-epyc-2c-fx37278115

asv keeps one series per machine name and judges a commit only against the commits before it in
that series. Two things outside any commit move the tracked figures: the host (the ratios to the
ruler absorb part of a change of CPU, not all of it: ``results/asv/README.md``) and the fixed
checkpoint (``make asv-fixture`` on another host, or from a checkout whose training code differs,
trains other weights, so ``1 - AP`` would step at no commit; ``results/asv/README.md``). asv's
default name, the hostname, tells neither apart, so the name carries both: a history measured over
several sittings joins one series only where host and fixture are the same. The ``make asv-*``
targets pass this name to ``asv machine`` and ``asv run``.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
from pathlib import Path

from mrcnn_bench.fixed_accuracy import Fixture


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name as the kernel reports it (``platform.processor()`` where there is no /proc)."""
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "cpu"


def slug(text: str) -> str:
    """Lower case, runs of anything but letters and digits as one ``-`` (``Intel(R) Xeon(R)`` -> ``intel-r-xeon-r``)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "cpu"


def machine_name(fixture: Fixture, cpu: str | None = None, cores: int | None = None) -> str:
    """``<cpu>-<N>c-fx<first 8 hex digits of the fixture's weights>``; FileNotFoundError without a fixture."""
    reason = fixture.missing_reason()
    if reason:
        raise FileNotFoundError(reason)
    sha = json.loads(fixture.meta.read_text())["model_sha256"]
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    return f"{slug(cpu if cpu is not None else cpu_model())}-{cores}c-fx{sha[:8]}"


def main() -> int:
    try:
        print(machine_name(Fixture.default()))
    except FileNotFoundError as e:
        print(f"mrcnn_bench.asv_machine: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
