"""The asv machine name for this host and its accuracy fixture: ``<cpu>-<N>c-fx<sha8>``.

    PYTHONPATH=bench python -m mrcnn_bench.asv_machine              # prints e.g. amd-epyc-f25m17-2c-fx021d390f
    PYTHONPATH=bench python -m mrcnn_bench.asv_machine --register   # and records it for asv run --machine

asv keeps one series per machine name and judges a commit only against the commits before it in
that series. Two things outside any commit move the tracked figures: the host (the ratios to the
ruler absorb part of a change of CPU, not all of it: ``results/asv/README.md``) and the fixed
checkpoint (``make asv-fixture`` on another host, or from a checkout whose training code differs,
trains other weights, so ``1 - AP`` would step at no commit; ``results/asv/README.md``). asv's
default name, the hostname, tells neither apart, so the name carries both: a history measured over
several sittings joins one series only where host and fixture are the same. ``<cpu>`` is the model
name with the x86 family and model numbers (``f25m17``), because a virtual machine may report a
bare ``AMD EPYC`` for CPU generations whose speeds differ. The ``make asv-*`` targets register it
and pass it to ``asv run --machine``.

``--register`` records the name with the host's OS, CPU, cores and memory (asv's defaults for
them): ``asv machine --yes --machine NAME`` stores the name alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from mrcnn_bench.fixed_accuracy import Fixture
from mrcnn_bench.store import cpu_model, cpuinfo_fields


def slug(text: str) -> str:
    """Lower case, runs of anything but letters and digits as one ``-`` (``Intel(R) Xeon(R)`` -> ``intel-r-xeon-r``)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "cpu"


def cpu_label(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The model name, and ``f<family>m<model>`` where ``cpuinfo`` has them: ``AMD EPYC f25m17``."""
    fields = cpuinfo_fields(cpuinfo)
    family, model = fields.get("cpu family"), fields.get("model")
    generation = f"f{family}m{model}" if family and model else ""
    return f"{fields.get('model name') or cpu_model(cpuinfo) or 'cpu'} {generation}".strip()


def machine_name(fixture: Fixture, cpu: str | None = None, cores: int | None = None) -> str:
    """``<cpu>-<N>c-fx<first 8 hex digits of the fixture's weights>``, ``cpu`` by default
    :func:`cpu_label`; FileNotFoundError without a fixture."""
    reason = fixture.missing_reason()
    if reason:
        raise FileNotFoundError(reason)
    sha = json.loads(fixture.meta.read_text())["model_sha256"]
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    return f"{slug(cpu if cpu is not None else cpu_label())}-{cores}c-fx{sha[:8]}"


def register(name: str) -> None:
    """Record ``name`` in asv's machine file with the host's fields (asv's own defaults for them)."""
    # Imported here: printing the name needs no asv, and asv is only in the bench extra.
    from asv.machine import Machine, MachineCollection

    # Not `asv machine --yes --cpu ...`: asv passes on only the fields that differ from its
    # defaults, and with a name of its own and nothing else it stores the name alone.
    MachineCollection.save(name, {**Machine.get_defaults(), "machine": name})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mrcnn_bench.asv_machine", description=__doc__.split("\n")[0])
    parser.add_argument("--register", action="store_true", help="also record the machine for asv run --machine")
    args = parser.parse_args(argv)
    try:
        name = machine_name(Fixture.default())
        if args.register:
            register(name)
    except FileNotFoundError as e:
        print(f"mrcnn_bench.asv_machine: {e}", file=sys.stderr)
        return 2
    print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
