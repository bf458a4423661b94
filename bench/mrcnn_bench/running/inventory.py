"""What ``mrcnn-bench list`` shows: every case, preset and backend, and which of them run on this machine."""

from __future__ import annotations

from typing import Any

from mrcnn.config import PRESETS
from mrcnn_bench.running.backends import BACKENDS, unavailable
from mrcnn_bench.running.cases import CASES, QUICK, TRACKED, default_time_limit, default_workload


def inventory() -> dict[str, Any]:
    """Cases (with why one cannot run here), presets and backends, as plain data (``list --json``)."""
    cases = [{"name": name, "phase": c.phase, "backend": c.backend, "compiler": c.compiler,
              "precision": c.precision, "quick": name in QUICK, "tracked_by_asv": name in TRACKED,
              "runs_here": c.skip_reason() is None, "why_not": c.skip_reason()} for name, c in CASES.items()]
    presets = [{"name": name, "image_size": list(default_workload(name).image_size),
                "time_limit_s": default_time_limit(name)} for name in sorted(PRESETS)]
    backends = [{"name": b, "runs_here": unavailable(b) is None, "why_not": unavailable(b)} for b in BACKENDS]
    return {"cases": cases, "presets": presets, "backends": backends}


def text(inv: dict[str, Any] | None = None) -> str:
    """The inventory as aligned lines for people."""
    inv = inventory() if inv is None else inv
    width = max(len(c["name"]) for c in inv["cases"])
    lines = ["cases (quick: timed in CI and by asv; asv: tracked across commits):"]
    for c in inv["cases"]:
        tags = ", ".join(t for t, on in (("quick", c["quick"]), ("asv", c["tracked_by_asv"])) if on)
        here = "runs here" if c["runs_here"] else f"not here: {c['why_not']}"
        lines.append(f"  {c['name']:<{width}}  {c['phase']:<9}  {here}{f'  [{tags}]' if tags else ''}")
    lines.append("presets (default image size, time limit of a bounded row):")
    for p in inv["presets"]:
        h, w = p["image_size"]
        lines.append(f"  {p['name']:<{width}}  {h}x{w}, {p['time_limit_s']:g} s")
    lines.append("backends:")
    for b in inv["backends"]:
        lines.append(f"  {b['name']:<{width}}  {'available' if b['runs_here'] else 'not here: ' + b['why_not']}")
    return "\n".join(lines)
