"""The one clock and the one interleaving loop of the harness: every timed call goes through here.

Comparing two things on a shared machine means calling them in the same process, round by round, so
that a drift of the machine's speed hits both alike; and the order within a round matters too (the
thing called second runs about 4% differently: bench/studies/compare_order_effect/), so the order is
part of the measurement and each caller keeps its own. An order is one of :data:`ORDERS`:

- ``"rotate"``: round ``r`` starts at item ``r mod n`` (A B C, B C A, C A B, ...): the run loop
  (:func:`mrcnn_bench.running.runner.timed_rounds`) and the export latency table;
- ``"alternate"``: the order reversed every other round (A B, B A, A B, ...): the one-lever studies
  (:func:`mrcnn_bench.onoff.run_rounds`) and the ruler (:func:`mrcnn_bench.history.interleaved.interleave`,
  ruler first on even rounds);
- ``"fixed"``: the same order every round.

:func:`schedule` yields each round's call order from a start round (a resumed run goes on where the
last one stopped, in the order it would have had); :func:`timed_rounds` times the calls of such a
schedule; :func:`timed` times one call; :class:`Stopwatch` times what is not a round (set-up, a
run's wall time, an evaluation). :data:`clock` is ``time.perf_counter``: the only module that reads
it, besides the probes of the machine's peak rate (``tests/bench/test_timing.py`` checks).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar

T = TypeVar("T")
Order = Literal["rotate", "alternate", "fixed"]
ORDERS: tuple[Order, ...] = ("rotate", "alternate", "fixed")

clock: Callable[[], float] = time.perf_counter  # monotonic, the finest resolution the platform has


def call_order(items: Sequence[T], rnd: int, order: Order) -> list[T]:
    """The items in the order they are called in round ``rnd`` (0-based) under ``order``."""
    if order == "rotate":
        k = rnd % len(items) if items else 0
        return list(items[k:]) + list(items[:k])
    if order == "alternate":
        return list(items) if rnd % 2 == 0 else list(items)[::-1]
    if order == "fixed":
        return list(items)
    raise ValueError(f"unknown order {order!r}; choose from {ORDERS}")


def schedule(items: Sequence[T], order: Order, rounds: int | Iterable[int], start: int = 0
             ) -> Iterator[tuple[int, list[T]]]:
    """(round, items in call order) for each round.

    ``rounds``: a count (rounds ``start`` .. ``rounds - 1``) or the round numbers themselves (e.g. a
    progress bar over them; ``start`` is then unused).
    """
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; choose from {ORDERS}")
    numbers = range(start, rounds) if isinstance(rounds, int) else rounds
    for rnd in numbers:
        yield rnd, call_order(items, rnd, order)


def timed(fn: Callable[..., T], *args: Any) -> tuple[float, T]:
    """(seconds, result) of one call ``fn(*args)``."""
    t0 = clock()
    result = fn(*args)
    return clock() - t0, result


def timed_rounds(
    calls: Mapping[str, Callable[..., Any]],
    order: Order,
    rounds: int | Iterable[int],
    start: int = 0,
    skip: Callable[[int, str], bool] | None = None,
    pass_round: bool = False,
) -> Iterator[tuple[int, str, float, Any]]:
    """(round, name, seconds, result) of each call of ``calls`` (name -> call), round by round in
    ``order`` (:func:`schedule`).

    ``skip(round, name)``: true for a call not to make (already measured, e.g. by an interrupted
    run). ``pass_round``: call ``fn(round)`` instead of ``fn()``. The caller's work between two
    calls (writing a line) happens at each yield, outside the timed span.
    """
    for rnd, names in schedule(list(calls), order, rounds, start):
        for name in names:
            if skip is not None and skip(rnd, name):
                continue
            seconds, result = timed(calls[name], rnd) if pass_round else timed(calls[name])
            yield rnd, name, seconds, result


class Stopwatch:
    """Seconds since it was made (or :meth:`restart`\\ ed): for durations that are not rounds.

    ``with Stopwatch() as w: ...`` leaves the block's seconds in ``w.seconds``; otherwise read
    :meth:`elapsed` whenever needed (e.g. on each of several ways out of a function).
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self._t0 = clock()

    def restart(self) -> None:
        self._t0 = clock()

    def elapsed(self) -> float:
        return clock() - self._t0

    def __enter__(self) -> Stopwatch:
        self.restart()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = self.elapsed()
