"""Confirming the report's regression blocks live, on request: ``mrcnn-bench asv report --confirm``.

The report is a screen: change points at p < 0.001 over noisy per-commit ratios, some of them a VM's
level rather than the code's. Each block already carries the compare that confirms it
(:mod:`mrcnn_bench.changes.confirm_command`: the commit against its parent, or against the last
commit measured before it, in process pairs sized for the step). ``--confirm`` runs that compare
for each block of a timed figure, in the repository, and writes its verdict into the block: the
screen-then-confirm pattern of Chromium's Pinpoint. Compile counts and ``1 - AP`` are exact in the
history already and are not re-run. A compare that cannot decide (a commit that does not build, a
case that errors) says so in the block; the report is still written.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """What one live compare gave: its exit status, its ``--out`` document (None when it wrote none),
    the last line it wrote to stderr, and its wall time."""

    code: int
    doc: dict[str, Any] | None
    stderr: str
    seconds: float


Runner = Callable[[list[str], Path], Outcome]


def compare_args(command: str, pairs: int | None) -> list[str] | None:
    """``mrcnn-bench``'s arguments in a block's confirm command (:func:`confirm_command.confirm`), when it
    is a compare in process pairs; None for the exact figures (compile counts, ``1 - AP``), whose
    commands measure nothing the history does not hold already."""
    words = shlex.split(command)
    if pairs is None or words[:2] != ["mrcnn-bench", "compare"]:
        return None
    return [*words[1:], "--no-progress"]


def run_compare(args: list[str], repo: Path) -> Outcome:
    """Run ``python -m mrcnn_bench ARGS --out TMP`` in ``repo``; its :class:`Outcome`."""
    with tempfile.TemporaryDirectory(prefix="mrcnn-confirm-") as tmp:
        out = Path(tmp) / "compare.json"
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "mrcnn_bench", *args, "--out", str(out)], cwd=repo,
                              capture_output=True, text=True, check=False)
        seconds = time.monotonic() - start
        doc = json.loads(out.read_text()) if out.is_file() else None
    tail = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "")
    return Outcome(done.returncode, doc, tail, seconds)


def verdict(outcome: Outcome) -> str:
    """One line for the block: the compare's ratio, interval and decision, with what it rested on."""
    minutes = f"{outcome.seconds / 60:.1f} min"
    rows = (outcome.doc or {}).get("comparison") or []
    if outcome.code not in (0, 1) or not rows:
        why = outcome.stderr[:200] or f"exit {outcome.code}"
        return f"could not decide (exit {outcome.code}, {minutes}): {why}"
    row = rows[0]
    decided = "confirmed slower" if outcome.code == 1 else "not confirmed (no slowdown shown)"
    return (f"{decided}: B/A {_number(row.get('ratio_b_over_a'), '.4f')} (95% CI {row.get('ci95') or '-'}, "
            f"p {_number(row.get('p_value'), '.2g')}), {row.get('pairs') or '?'} pairs x {row.get('n') or '?'} "
            f"rounds, {minutes}")


def _number(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def confirm_each(blocks: list[tuple[str, int | None]], repo: Path, run: Runner = run_compare,
                 log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> list[str]:
    """The verdict of each (confirm command, process pairs) block, "" for one that is not re-run; each
    compare's line is logged as it finishes."""
    out = []
    for k, (command, pairs) in enumerate(blocks, 1):
        args = compare_args(command, pairs)
        if args is None:
            out.append("")
            continue
        log(f"confirm {k}/{len(blocks)}: mrcnn-bench {' '.join(args)}")
        out.append(verdict(run(args, repo)))
        log(f"  {out[-1]}")
    return out
