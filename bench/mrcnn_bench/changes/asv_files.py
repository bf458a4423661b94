"""One asv machine's result files, checked before any figure is used, with the files left out named.

asv's own reader skips a file it cannot load with one log line, and takes a file it can load at its
word: a value that is a string or a dict, a ``commit_hash`` that is a number, or more values than
the benchmark's parameters have combinations (asv then keeps the first and drops the rest) go on to
fail later, or worse, to change a figure in silence. :func:`read` checks each file's layout first,
then loads it through asv, and returns the results it can use and a :class:`Skipped` for each file
it cannot, so that ``asv table``, ``steps`` and the regression report say which commits are
missing and why instead of carrying on without them.

A damaged ``machine.json`` is a usage error (exit 2, naming the file): asv would read it as a
machine with no results.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asv import util
from asv.machine import Machine
from asv.results import Results, iter_results_paths

from mrcnn_bench.base.errors import UsageError

HASH = re.compile(r"[0-9a-f]{7,64}")
LAST_DATE_MS = 253_402_300_799_999  # 9999-12-31 23:59:59.999 UTC: the last moment datetime can show
COLUMNS = ("result", "params")  # the result columns the readers use; asv writes more (samples, stats)


@dataclass(frozen=True)
class Skipped:
    """A result file left out: its name, the commit its name gives (asv names them ``<hash8>-<env>.json``)
    and why."""

    file: str
    reason: str

    @property
    def commit(self) -> str:
        return self.file.split("-", 1)[0] if "-" in self.file else ""

    def text(self) -> str:
        return f"{self.file} (commit {self.commit or '?'}): {self.reason}"


@dataclass
class MachineResults:
    """The loaded results of one machine (asv's ``Results``), and the files left out."""

    results: list[Results]
    skipped: list[Skipped]


def check_machine(folder: Path) -> None:
    """UsageError naming ``folder/machine.json`` unless asv reads it as a machine: a JSON object of
    asv's version with a ``machine`` name (asv skips every result beside any other)."""
    path = folder / "machine.json"
    hint = "rewrite it with `mrcnn-bench asv machine`"
    if not path.is_file():
        raise UsageError(f"no asv machine here: {path} does not exist")
    try:
        data = util.load_json(str(path), api_version=Machine.api_version)
    except util.UserError as e:
        raise UsageError(f"{path}: not asv's machine.json ({str(e).splitlines()[0][:120]}); {hint}") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise UsageError(f"{path}: not asv's machine.json ({type(e).__name__}); {hint}") from None
    if not isinstance(data, dict) or not isinstance(data.get("machine"), str):
        raise UsageError(f"{path}: not asv's machine.json (no 'machine' name); {hint}")


def _number_or_none(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isinf(v))


def problem(data: Any) -> str:
    """Why the parsed result file ``data`` cannot be used, or "" when its layout is asv's."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    if not isinstance(data.get("commit_hash"), str) or not HASH.fullmatch(data["commit_hash"]):
        return f"commit_hash {data.get('commit_hash')!r} is not a hexadecimal commit hash"
    date = data.get("date")
    if not isinstance(date, (int, float)) or isinstance(date, bool) or not 0 <= date <= LAST_DATE_MS:
        return f"date {date!r} is not a time in milliseconds since 1970 (up to the year 9999)"
    columns, results = data.get("result_columns"), data.get("results")
    if not isinstance(columns, list) or not all(c in columns for c in COLUMNS) or not isinstance(results, dict):
        return "no 'results' with asv's 'result_columns' (result, params)"
    at = {c: columns.index(c) for c in COLUMNS}
    for name, entry in results.items():
        if not isinstance(entry, list) or len(entry) <= max(at.values()):
            return f"benchmark {name}: not a row of {len(columns)} result columns"
        values, params = entry[at["result"]], entry[at["params"]]
        if not isinstance(params, list) or not all(isinstance(a, list) and all(isinstance(p, str) for p in a)
                                                   for a in params):
            return f"benchmark {name}: params are not lists of parameter strings"
        if values is None:
            continue  # asv's mark for a benchmark that failed as a whole
        combinations = math.prod(len(a) for a in params)
        if not isinstance(values, list) or not all(_number_or_none(v) for v in values):
            return f"benchmark {name}: values are not numbers (or null for a failed one)"
        if len(values) != combinations:
            return f"benchmark {name}: {len(values)} values for {combinations} parameter combination(s)"
    return ""


def read(results: Path, machine: str) -> MachineResults:
    """Every result file of ``machine`` under ``results`` that can be used, oldest date first, and a
    :class:`Skipped` for each that cannot; UsageError for a missing or damaged ``machine.json``."""
    folder = results / machine
    check_machine(folder)
    loaded, skipped = [], []
    for root, name, _ in iter_results_paths(str(folder)):
        path = Path(root) / name
        try:
            why = problem(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            why = f"not JSON ({type(e).__name__})"
        except RecursionError:
            why = "JSON nested too deeply to read"
        if not why:
            try:
                loaded.append(Results.load(str(path), machine_name=machine))
            except (util.UserError, KeyError, TypeError, ValueError) as e:
                why = f"asv cannot load it: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        if why:
            skipped.append(Skipped(str(path.relative_to(folder)), why))
    return MachineResults(sorted(loaded, key=lambda r: r.date), sorted(skipped, key=lambda s: s.file))
