"""The ``--inject-slowdown`` fraction that a measurement reads as a given slowdown.

``--inject-slowdown`` sizes its extra work from an assumed share of the call
(:data:`mrcnn_bench.running.slowdown.PASS_SHARE`), so the slowdown a compare or a check measures is
not the fraction asked for, and it differs by host kind. The teeth studies
(``latency_check/trials.py``, ``compare_pairs/teeth.py``) therefore measure a few checks at a
fraction first and inject, in their slowed trials, the fraction this line puts at their target.
A check and a calibration name the extra work they were made with
(:data:`mrcnn_bench.running.slowdown.INJECTION`): a fraction means nothing under another hook.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from mrcnn_bench.running.slowdown import INJECTION

# The extra work of a check or calibration recorded before they named it: the ResNet body over a
# strip of the image.
UNNAMED_INJECTION = "resnet-body"


def injection_of(record: dict) -> str:
    """The extra work a check or a calibration was made with."""
    return record.get("injection", UNNAMED_INJECTION)


def current_checks(records: Iterable[dict]) -> list[tuple[float, float]]:
    """(fraction, ratio B/A) of the checks made with this checkout's :data:`INJECTION`."""
    return [(r["injected"], r["ratio"]) for r in records if injection_of(r) == INJECTION]


def require_current(calibration: dict, where: str) -> None:
    """Exit, naming both, unless ``calibration`` was made with this checkout's :data:`INJECTION`."""
    if injection_of(calibration) != INJECTION:
        raise SystemExit(f"{where} was calibrated with the {injection_of(calibration)!r} injection and this checkout "
                         f"injects {INJECTION!r}: run the study from a checkout of its own commit, or calibrate again")


def calibrated_fraction(checks: list[tuple[float, float]], target: float) -> float:
    """The fraction measured as a slowdown of ``target`` (0.1 for 10%), from (fraction, ratio B/A) checks.

    The measured excess (ratio - 1) is fitted as a line in the fraction asked for, by least squares:
    through the origin when every check used one fraction (their mean excess over it), else with an
    intercept, since the extra work over a few rows of the canvas costs more than its share of rows
    (padding and per-operator costs). The fraction is the line's solution for ``target``, to 3 places.
    """
    f = np.array([c[0] for c in checks], dtype=float)
    excess = np.array([c[1] for c in checks], dtype=float) - 1.0
    if len(set(f.tolist())) == 1:
        slope, intercept = float(excess.mean() / f[0]), 0.0
    else:
        slope, intercept = (float(v) for v in np.polyfit(f, excess, 1))
    if slope <= 0:
        raise ValueError("the checks measured no slowdown growing with the fraction injected "
                         f"(excess = {intercept:.3f} + {slope:.3f} x fraction)")
    fraction = (target - intercept) / slope
    if not 0 < fraction < 1:
        raise ValueError(f"no fraction in (0, 1) gives {target:.0%}: excess = {intercept:.3f} + {slope:.3f} x fraction")
    return round(fraction, 3)
