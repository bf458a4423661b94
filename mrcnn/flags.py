"""argparse value types that check a number at the edge: its kind, that it is finite, and its range.

A flag's value is the user's input: ``--seed 1e30`` or ``--rounds -1`` must be argparse's one-line
usage error naming the flag (exit 2), not an overflow deep inside numpy or a run that measures
nothing. Every command line of the library and the harness takes its numbers through :func:`bounded`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

SEED_MAX = 2**32 - 1  # numpy's generators take seeds up to this
THREADS_MAX = 4096  # torch.set_num_threads of more overflows or starves the machine: a typo, not a wish


def bounded(kind: type, low: float, high: float = math.inf, low_open: bool = False,
            high_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite ``kind`` (int or float) in [low, high], the ends left out where
    ``low_open`` or ``high_open``; anything else is argparse's one-line usage error, naming the flag."""
    noun = "an integer" if kind is int else "a number"
    def shown(v: float) -> str:  # a seed's bound as 4294967295, not 4.29497e+09
        return str(int(v)) if kind is int and math.isfinite(v) else f"{v:g}"

    span = f"{'(' if low_open else '['}{shown(low)}, {shown(high)}{')' if high_open else ']'}"

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not math.isfinite(value) or value < low or (low_open and value == low) or value > high or (
                high_open and value == high):
            raise argparse.ArgumentTypeError(f"{text!r} is not in {span}")
        return value

    return parse
