"""The ``--inject-slowdown`` fraction that a measurement reads as a given slowdown.

``--inject-slowdown`` sizes its extra work from an assumed share of the call
(:data:`mrcnn_bench.running.slowdown.BODY_SHARE`), so the slowdown a compare or a check measures is
not the fraction asked for, and it differs by host kind. The teeth studies
(``latency_check/trials.py``, ``compare_pairs/teeth.py``) therefore measure a few checks at a
fraction first and inject, in their slowed trials, the fraction this line puts at their target.
"""

from __future__ import annotations

import numpy as np


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
