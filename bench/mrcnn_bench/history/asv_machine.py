"""The asv machine name for this host and its accuracy fixture: ``<cpu>-<N>c-fx<sha8>``.

    mrcnn-bench asv machine              # prints e.g. amd-epyc-f25m17-2c-fx021d390f
    mrcnn-bench asv machine --register   # and records it for asv run --machine

asv keeps one series per machine name and judges a commit only against the commits before it in
that series. Two things outside any commit move the tracked figures: the host (the ratios to the
ruler absorb part of a change of CPU, not all of it: ``results/asv/README.md``) and the fixed
checkpoint (``make asv-fixture`` on another host, or from a checkout whose training code differs,
trains other weights, so ``1 - AP`` would step at no commit; ``results/asv/README.md``). asv's
default name, the hostname, tells neither apart, so the name carries both: a history measured over
several runs joins one series only where host and fixture are the same. ``<cpu>`` is the model
name with the x86 family and model numbers (``f25m17``), because a virtual machine may report a
bare ``AMD EPYC`` for CPU generations whose speeds differ. The ``make asv-*`` targets register it
and pass it to ``asv run --machine``.

``--register`` records the name with the host's OS, CPU, cores and memory (asv's defaults for
them, ``os`` and ``ram`` coarsened: :func:`stable_fields`): ``asv machine --yes --machine NAME``
stores the name alone. asv draws one graph per combination of every machine field, not per name,
so a field that moves while the host's kind does not (the VM's kernel build, ``6.18.44-fc-v669``
then ``-v769``, and a few hundred kB of memory between two boots) would split one machine's series
in two, each with its own step detection. ``--register`` therefore also aligns the fields of the
results already stored under the name (:func:`align_results`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.base.files import atomic_write, read_json
from mrcnn_bench.history.fixed_accuracy import Fixture
from mrcnn_bench.running.store import cpu_label


def slug(text: str) -> str:
    """Lower case, runs of anything but letters and digits as one ``-`` (``Intel(R) Xeon(R)`` -> ``intel-r-xeon-r``)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "cpu"


def machine_name(fixture: Fixture, cpu: str | None = None, cores: int | None = None) -> str:
    """``<cpu>-<N>c-fx<first 8 hex digits of the fixture's weights>``, ``cpu`` by default
    :func:`cpu_label`; FileNotFoundError without a fixture."""
    reason = fixture.missing_reason()
    if reason:
        raise FileNotFoundError(reason)
    sha = read_json(fixture.meta, "the fixture's metadata", dict).get("model_sha256")
    if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise UsageError(f"{fixture.meta}: no model_sha256 of 64 hex digits (remake it: make asv-fixture)")
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    return f"{slug(cpu if cpu is not None else cpu_label())}-{cores}c-fx{sha[:8]}"


def stable_fields(fields: dict[str, str]) -> dict[str, str]:
    """asv's machine fields with ``os`` cut to the kernel's major.minor and ``ram`` to whole GiB.

    ``{"os": "Linux 6.18.44-fc-v769", "ram": "25276063744"}`` -> ``{"os": "Linux 6.18", "ram": "24 GiB"}``;
    other fields, and values that do not parse, are kept as they are.
    """
    out = dict(fields)
    release = re.fullmatch(r"(\S+) (\d+\.\d+)\S*", fields.get("os", ""))
    if release:
        out["os"] = f"{release[1]} {release[2]}"
    if fields.get("ram", "").isdigit():
        out["ram"] = f"{round(int(fields['ram']) / 2**30)} GiB"
    return out


def register(name: str) -> dict[str, str]:
    """Record ``name`` in asv's machine file with the host's stable fields; returns them."""
    # Imported here: printing the name needs no asv, and asv is only in the bench extra.
    from asv.machine import Machine, MachineCollection

    # Not `asv machine --yes --cpu ...`: asv passes on only the fields that differ from its
    # defaults, and with a name of its own and nothing else it stores the name alone.
    fields = stable_fields({**Machine.get_defaults(), "machine": name})
    MachineCollection.save(name, fields)
    return fields


def align_results(results: Path, fields: dict[str, str]) -> int:
    """Give every result stored for ``fields["machine"]`` under ``results`` those machine fields.

    ``results/<machine>/*.json`` (asv's result files: their ``params``, and ``machine.json``).
    Only the machine's own fields change, never a measured value. Returns how many files changed.
    """
    changed = 0
    for path in sorted((results / fields["machine"]).glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except ValueError as e:
            raise UsageError(f"{path} is not asv's JSON: {e}") from None
        if path.name == "machine.json":
            target = record
        elif isinstance(record.get("params"), dict):
            target = record["params"]
        else:
            continue  # not a result file
        if all(target.get(k) == v for k, v in fields.items()):
            continue
        target.update(fields)
        atomic_write(path, json.dumps(record, indent=4 if path.name == "machine.json" else None))
        changed += 1
    return changed


def build_parser(prog: str = "mrcnn-bench asv machine") -> argparse.ArgumentParser:
    """``mrcnn-bench asv machine``'s arguments."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--register", action="store_true",
                        help="also record the machine for asv run --machine, and align its stored results' fields")
    parser.add_argument("--results", type=Path, default=Path("results/asv"),
                        help="asv's results_dir, for --register (default: results/asv)")
    return parser


def main(argv: list[str] | None = None, prog: str = "mrcnn-bench asv machine") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        name = machine_name(Fixture.default())
        if args.register:
            changed = align_results(args.results, register(name))
            if changed:
                print(f"mrcnn_bench.history.asv_machine: {changed} stored result(s) of {name} given its registered "
                      "os and ram, so that they stay one series", file=sys.stderr)
    except (FileNotFoundError, UsageError) as e:
        print(f"mrcnn_bench.history.asv_machine: {e}", file=sys.stderr)
        return 2
    print(name)
    return 0

