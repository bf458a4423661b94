"""``mrcnn_bench.base.timing``: every caller keeps the call order it had, and only it reads the clock.

The order within a round is part of a measurement (the thing called second runs about 4% differently),
so each caller's sequence is written out below as the code before the primitive produced it: a change
of order fails here, not silently in a figure.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from studies import onoff

from mrcnn_bench.base import timing
from mrcnn_bench.history import interleaved
from mrcnn_bench.running import export_timing, runner
from mrcnn_bench.running.cases import CASES, Row, Workload
from mrcnn_bench.running.records import RowResult

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------
# The primitive's orders


def test_orders_written_out():
    rotate = [names for _, names in timing.schedule("ABC", "rotate", 4)]
    assert rotate == [list("ABC"), list("BCA"), list("CAB"), list("ABC")]
    alternate = [names for _, names in timing.schedule("ABC", "alternate", 4)]
    assert alternate == [list("ABC"), list("CBA"), list("ABC"), list("CBA")]
    assert [names for _, names in timing.schedule("AB", "fixed", 3)] == [list("AB")] * 3
    # From a start round, each round in the order it would have had in a run from round 0.
    assert list(timing.schedule("ABC", "rotate", 5, start=2)) == [(2, list("CAB")), (3, list("ABC")), (4, list("BCA"))]
    assert list(timing.schedule("AB", "alternate", iter([3, 4]))) == [(3, list("BA")), (4, list("AB"))]
    assert list(timing.schedule([], "rotate", 2)) == [(0, []), (1, [])]
    with pytest.raises(ValueError, match="unknown order"):
        list(timing.schedule("AB", "shuffle", 2))


def test_timed_rounds_skips_and_passes_the_round():
    calls: list[tuple[str, int]] = []
    fns = {n: (lambda r, n=n: calls.append((n, r)) or n) for n in ("a", "b")}
    got = list(timing.timed_rounds(fns, "alternate", 3, skip=lambda r, n: (r, n) == (1, "a"), pass_round=True))
    assert calls == [("a", 0), ("b", 0), ("b", 1), ("a", 2), ("b", 2)]
    assert [(r, n, result) for r, n, _, result in got] == [(0, "a", "a"), (0, "b", "b"), (1, "b", "b"),
                                                           (2, "a", "a"), (2, "b", "b")]
    assert all(s >= 0 for _, _, s, _ in got)


def test_stopwatch_and_timed_measure_with_the_clock(monkeypatch):
    ticks = iter([10.0, 10.5, 20.0, 21.25, 30.0, 40.0, 42.5])
    monkeypatch.setattr(timing, "clock", lambda: next(ticks))
    assert timing.timed(lambda x: x * 2, 4) == (0.5, 8)
    with timing.Stopwatch() as w:  # made at 20.0, restarted on entry: 21.25 .. 30.0
        pass
    assert w.seconds == 8.75
    assert timing.Stopwatch().elapsed() == 2.5  # 40.0 .. 42.5


# ------------------------------------------------------------------------------------------------
# Each caller's sequence, as the code before the primitive produced it


class _RecordingRow:
    """A row runner that appends (row name, call index) to a shared log."""

    def __init__(self, name: str, log: list[tuple[str, int]]) -> None:
        self.name, self.log = name, log

    def setup(self) -> None:
        pass

    def call(self, index: int, first: bool = False) -> tuple[float, dict[str, float], float, float]:
        self.log.append((self.name, index))
        return 0.01, {"loss": 1.0}, 0.0, 0.0

    def counters(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


def _run_rounds(rounds: int, start: int = 0) -> list[tuple[str, int]]:
    # No torchvision inference row: the rows' parity would be checked against it.
    names = ("static/eager", "static/train", "torchvision/train")
    opts = runner.RunOptions(Workload(images=3, batch_size=1), rows=[], rounds=rounds, warmup=1, progress=False)
    results = [RowResult(Row(CASES[n])) for n in names]
    for r in results:
        r.status = "ok"
    log: list[tuple[str, int]] = []
    runner.timed_rounds(results, {n: _RecordingRow(n, log) for n in names}, opts, start=start)
    return log


# Round r starts at row r mod 3; a call's index is the row's warm-up calls (3 inference, 2 training) + r.
RUNNER_4_ROUNDS = [
    ("static/eager", 3), ("static/train", 2), ("torchvision/train", 2),
    ("static/train", 3), ("torchvision/train", 3), ("static/eager", 4),
    ("torchvision/train", 4), ("static/eager", 5), ("static/train", 4),
    ("static/eager", 6), ("static/train", 5), ("torchvision/train", 5),
]


def test_runner_rotates_rows_every_round():
    assert _run_rounds(4) == RUNNER_4_ROUNDS


def test_runner_resumed_from_a_start_round_keeps_the_order_of_those_rounds():
    assert _run_rounds(4, start=2) == RUNNER_4_ROUNDS[6:]


def test_onoff_reverses_every_other_round_and_resumes_by_key(tmp_path: Path):
    out = tmp_path / "lever.jsonl"
    calls: list[str] = []
    variants = {v: (lambda v=v: calls.append(v)) for v in ("off", "mid", "on")}
    assert onoff.run_rounds(variants, 4, out) == 12
    assert calls == ["off", "mid", "on", "on", "mid", "off", "off", "mid", "on", "on", "mid", "off"]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["key"] for r in rows[:6]] == ["0:off", "0:mid", "0:on", "1:on", "1:mid", "1:off"]
    assert set(rows[0]) == {"key", "round", "variant", "seconds"}
    # Interrupted after "1:on": the rerun times the rest of round 1, then round 2, in their orders.
    resumed = tmp_path / "resumed.jsonl"
    resumed.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    calls.clear()
    assert onoff.run_rounds(variants, 3, resumed) == 5
    assert calls == ["mid", "off", "off", "mid", "on"]


def test_interleave_puts_the_ruler_first_on_even_rounds():
    calls: list[tuple[str, int]] = []
    case_s, ruler_s = interleaved.interleave(lambda i: calls.append(("case", i)), lambda i: calls.append(("ruler", i)),
                                             4)
    assert calls == [("ruler", 0), ("case", 0), ("case", 1), ("ruler", 1),
                     ("ruler", 2), ("case", 2), ("case", 3), ("ruler", 3)]
    assert len(case_s) == len(ruler_s) == 4


def test_export_latency_rotates_every_round():
    calls: list[str] = []
    fns = {n: (lambda n=n: calls.append(n)) for n in ("eager", "pt2", "aoti")}
    table = export_timing.time_interleaved(fns, 4)
    assert calls == ["eager", "pt2", "aoti", "pt2", "aoti", "eager", "aoti", "eager", "pt2", "eager", "pt2", "aoti"]
    assert list(table) == ["eager", "pt2", "aoti"] and all(row["rounds"] == 4 for row in table.values())


# ------------------------------------------------------------------------------------------------
# Only the primitive reads the clock

# Files that may read a timer themselves, and why. The ceiling (bench/mrcnn_bench/running/ceiling.py) needs no
# entry: its loops time themselves in C (clock_gettime), so there is no Python clock in it to find.
ALLOWED = {
    "bench/mrcnn_bench/base/timing.py": "the primitive itself",
    "bench/mrcnn_bench/running/probes.py":
        "the machine's peak rate: the fastest of N calls of one kernel, no order to keep",
    "bench/studies/first_result/first_result.py": "a new process from its launch: the clock crosses processes",
}
TIMER_ATTRS = {"perf_counter", "perf_counter_ns"}


def timer_uses(source: str) -> list[int]:
    """Lines that read a timer: ``time.perf_counter`` / ``perf_counter_ns`` (called or passed on,
    however imported), ``timeit``, and ``time.time()`` used as a timer: subtracted, itself or through
    a name it was assigned to (a date, ``round(time.time())`` or ``"started": t0``, is not a timer)."""
    tree = ast.parse(source)
    lines = set()

    def is_time_time(node: ast.AST) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "time"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "time")

    dates = set()  # names assigned time.time(), alone or in a tuple: a timer once one is subtracted
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
            pairs += [(t, v) for tup in node.targets if isinstance(tup, ast.Tuple) and isinstance(node.value, ast.Tuple)
                      for t, v in zip(tup.elts, node.value.elts, strict=False)]
            dates |= {t.id for t, v in pairs if isinstance(t, ast.Name) and is_time_time(v)}

    def reads_time(node: ast.AST) -> bool:
        return is_time_time(node) or (isinstance(node, ast.Name) and node.id in dates)

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in TIMER_ATTRS:
            lines.add(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module in ("time", "timeit"):
            if node.module == "timeit" or any(a.name in TIMER_ATTRS for a in node.names):
                lines.add(node.lineno)
        elif isinstance(node, ast.Import) and any(a.name == "timeit" for a in node.names):
            lines.add(node.lineno)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            lines.update(side.lineno for side in (node.left, node.right) if reads_time(side))
    return sorted(lines)


def test_scanner_finds_each_kind_of_timer():
    assert timer_uses("import time\nt0 = time.perf_counter()\n") == [2]
    assert timer_uses("import time\nclock = time.perf_counter_ns\n") == [2]
    assert timer_uses("from time import perf_counter as pc\nx = pc()\n") == [1]
    assert timer_uses("import timeit\n") == [1] and timer_uses("from timeit import default_timer\n") == [1]
    assert timer_uses("import time\nt0, load = time.time(), 1\nprint(\n  time.time() - t0)\n") == [4]
    assert timer_uses("import time\na = time.time()\nb = time.time()\nd = b - a\n") == [4]
    assert timer_uses("import time\nt0, load = time.time(), 1\nd = 5.0 - t0\n") == [3]
    assert timer_uses("import time\nt0 = time.time()\nmeta = {'started': t0, 'unix_time': round(time.time())}\n"
                      "t = time.monotonic()\n") == []


def test_only_the_primitive_and_the_allow_list_read_a_timer():
    """Scans bench/ (the package, tools, studies, the pytest and asv suites, examples).

    Not mrcnn/: the library may not import the harness (tests/test_architecture.py), so it cannot use
    the primitive, and its few durations (the trainer's step time, the export's build and save times)
    are log lines and history fields of one run, never a comparison between things called in turn.
    """
    found = {}
    for path in sorted((REPO / "bench").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        lines = timer_uses(path.read_text())
        if lines and rel not in ALLOWED:
            found[rel] = lines
    assert found == {}, "time calls through mrcnn_bench.base.timing (timed, timed_rounds, Stopwatch)"
    stale = [rel for rel in ALLOWED if not timer_uses((REPO / rel).read_text())]
    assert stale == [], "an allow-list entry that reads no timer any more"
