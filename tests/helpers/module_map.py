"""The harness's rooms read from the tree: each room's purpose and allowed imports, and its modules.

Each subpackage of ``mrcnn_bench`` (a room) says in its ``__init__`` docstring what it is for and, on a
line ``May import: ...``, which rooms it may import (double-backquoted names, or ``every other room``).
The architecture test checks the imports against those lines; the docs test checks that the module map
in ``docs/harness.md`` is the one :func:`render` writes. After adding, moving or redocumenting a
module, rewrite the map with ``python -m tests.helpers.module_map``.
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "bench" / "mrcnn_bench"
DOC = REPO / "docs" / "harness.md"
BEGIN = "<!-- module map: written by `python -m tests.helpers.module_map` from the tree; do not edit by hand -->"
END = "<!-- end of the module map -->"
# Files of the package that belong to no room: the package itself and `python -m mrcnn_bench`.
ENTRANCE = ("__init__.py", "__main__.py")
SUMMARY_WIDTH = 96


@dataclass(frozen=True)
class Room:
    """One subpackage of the harness: its name, purpose, the rooms it may import, its modules."""

    name: str
    purpose: str
    may_import: frozenset[str] | None  # None: every other room
    modules: tuple[tuple[str, str], ...]  # (module name, first line of its docstring)


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""


def may_import(doc: str) -> frozenset[str] | None:
    """The rooms a room's docstring allows (its ``May import:`` line); None for every other room."""
    match = re.search(r"^May import:(.*?)(?:\n\n|\Z)", doc, re.M | re.S)
    if match is None:
        raise ValueError("no 'May import:' line")
    text = " ".join(match.group(1).split())
    return None if "every other room" in text else frozenset(re.findall(r"``(\w+)``", text))


def _summary(doc: str) -> str:
    """The docstring's first paragraph on one line, cut at a word boundary to fit the map."""
    line = " ".join(doc.split("\n\n", 1)[0].split())
    return line if len(line) <= SUMMARY_WIDTH else textwrap.shorten(line, SUMMARY_WIDTH, placeholder=" ...")


def rooms(package: Path = PACKAGE) -> list[Room]:
    """Every room of the package, each after the rooms it may import (by name among equals)."""
    found = []
    for init in sorted(package.glob("*/__init__.py")):
        doc = _docstring(init)
        modules = tuple((p.stem, _summary(_docstring(p))) for p in sorted(init.parent.glob("*.py"))
                        if p.name != "__init__.py")  # fmt: skip
        found.append(Room(init.parent.name, " ".join(doc.split("\n\n", 1)[0].split()), may_import(doc), modules))
    ordered: list[Room] = []
    while found:
        placed = {r.name for r in ordered}
        ready = [r for r in found if r.may_import is not None and r.may_import <= placed] or found
        ordered.append(ready[0])
        found.remove(ready[0])
    return ordered


def loose_modules(package: Path = PACKAGE) -> list[str]:
    """Modules directly in the package, outside every room (only the entrance files may be)."""
    return sorted(p.name for p in package.glob("*.py") if p.name not in ENTRANCE)


def render(package: Path = PACKAGE) -> str:
    """The module map as it belongs in docs/harness.md, between its markers."""
    lines = []
    for room in rooms(package):
        allowed = "every other room" if room.may_import is None else ", ".join(sorted(room.may_import)) or "no room"
        lines += ["", f"mrcnn_bench/{room.name}/  (may import: {allowed})"]
        lines += textwrap.wrap(room.purpose, 110, initial_indent="  ", subsequent_indent="  ")
        lines += [f"    {name + '.py':22s}{summary}" for name, summary in room.modules]
    return "\n".join([BEGIN, "```", *lines[1:], "```", END])


def documented_map(doc: Path = DOC) -> str | None:
    """The module map as docs/harness.md holds it, markers included; None without the markers."""
    text = doc.read_text()
    start, end = text.find(BEGIN), text.find(END)
    return None if start < 0 or end < start else text[start : end + len(END)]


def main() -> int:
    text = DOC.read_text()
    current = documented_map()
    if current is None:
        print(f"{DOC}: no module map markers ({BEGIN!r} ... {END!r})", file=sys.stderr)
        return 2
    DOC.write_text(text.replace(current, render()))
    print(f"module map written to {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
