"""The house rules of the tree, checked on the files themselves (each detector tried first on a made-up snippet).

- names say what a thing answers: no ticket numbers ("issue" and a number) and no "sitting" in the code, the
  tests, the Makefile, the README or docs/ (the READMEs under results/ may keep provenance);
- every test file stays within the line cap that source files keep;
- no test module imports from another test module: shared helpers live in ``tests/helpers``, shared
  fixtures in a ``conftest.py``.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 450  # the cap of tests/test_architecture.py, for tests too
# Where the rule on ticket numbers holds: the code, the tests, and what a reader is pointed to.
NAMED_BY_QUESTION = ("mrcnn", "bench", "tests", "Makefile", "README.md", "docs")
# A ticket reference: "issue" or "ticket", singular or plural, then numbers ("#" optional); and "sitting".
TICKET = re.compile(r"\b(?:issues?|tickets?)\s*#?\s*\d+(?:\s*(?:,|and|&)\s*#?\s*\d+)*|\bsittings?\b", re.IGNORECASE)


def _files(*roots: str) -> list[Path]:
    """The files git tracks or would track (not ignored) under ``roots``, that exist in the tree."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *roots],
            cwd=REPO, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        paths = [REPO / line for line in out.splitlines()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an unpacked archive)
        paths = [p for r in roots for p in ([REPO / r] if (REPO / r).is_file() else (REPO / r).rglob("*"))]
        paths = [p for p in paths if not any(part.startswith(".") or part == "__pycache__" for part in p.parts)]
    return sorted(p for p in set(paths) if p.is_file())


def _text(path: Path) -> str | None:
    """The file's text, or None for a binary file (images, archives)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\0" in text else text


def ticket_references(text: str) -> list[tuple[int, str]]:
    """(line number, matched text) of every ticket reference or "sitting" in ``text``."""
    return [(i, m.group(0)) for i, line in enumerate(text.splitlines(), 1) for m in TICKET.finditer(line)]


def too_long(text: str, limit: int = MAX_LINES) -> int | None:
    """The line count of ``text`` when it exceeds ``limit``, else None."""
    lines = len(text.splitlines())
    return lines if lines > limit else None


def _is_test_module(dotted: str) -> bool:
    return any(part.startswith("test_") for part in dotted.split("."))


def imports_of_test_modules(source: str) -> list[tuple[int, str]]:
    """(line, imported module) of each import of a test module (``test_*``) in ``source``.

    Caught: ``import tests.x.test_y``, ``from tests.x.test_y import a``, ``from test_y import a``,
    ``from .test_y import a`` and ``from tests.x import test_y`` (a module, or a test function that
    pytest would then collect twice).
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if _is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if _is_test_module(module):
                found.append((node.lineno, module))
            else:
                found += [(node.lineno, f"{module}.{a.name}") for a in node.names if a.name.startswith("test_")]
    return found


# ------------------------------------------------------------------------------------------------
# The detectors, on made-up snippets


def test_ticket_detector_finds_ticket_numbers_and_sitting():
    # Built from parts, so that the repository itself never names a ticket in code.
    one, many = "Issue", "issues"
    snippet = (
        f'"""{one} 14, defects 5 and 6."""\n'
        "# see issue #3 and Issue#12\n"
        f"x = 1  # from {many} 13 and 14, {many} 4, 5 & 6\n"
        "The sitting's run; two sittings. Ticket 7.\n"
    )
    found = [m for _, m in ticket_references(snippet)]
    assert found == [
        f"{one} 14", "issue #3", "Issue#12", f"{many} 13 and 14", f"{many} 4, 5 & 6", "sitting", "sittings", "Ticket 7",
    ]  # fmt: skip
    assert [line for line, _ in ticket_references(snippet)] == [1, 2, 2, 3, 3, 4, 4, 4]
    innocent = "The issue it fixes; issues with padding; position 14; tis" "sue 3; a babysitting job; misissue\n"
    assert ticket_references(innocent) == []


def test_line_cap_detector_counts_lines():
    assert too_long("a\n" * MAX_LINES) is None
    assert too_long("a\n" * (MAX_LINES + 1)) == MAX_LINES + 1
    assert too_long("a\nb\nc", limit=2) == 3


def test_test_import_detector_finds_imports_of_test_modules():
    snippet = (
        "import os\n"
        "import tests.mrcnn.test_training\n"
        "from tests.mrcnn.test_padding_parity import _check\n"
        "from test_training import small_cfg\n"
        "from .test_ops import pyramid\n"
        "from tests.mrcnn import test_cuda\n"
        "from tests.helpers.training import small_cfg, pad_targets\n"
        "from tests.fixtures.coco_quirks import SPLIT\n"
        "from mrcnn_bench import testing_tools\n"
    )
    assert imports_of_test_modules(snippet) == [
        (2, "tests.mrcnn.test_training"),
        (3, "tests.mrcnn.test_padding_parity"),
        (4, "test_training"),
        (5, ".test_ops"),
        (6, "tests.mrcnn.test_cuda"),
    ]


# ------------------------------------------------------------------------------------------------
# The tree


def test_no_ticket_numbers_in_code_tests_or_docs():
    found = []
    for path in _files(*NAMED_BY_QUESTION):
        text = None if path == Path(__file__).resolve() else _text(path)  # this file's snippets hold examples
        found += [f"{path.relative_to(REPO)}:{line}: {m!r}" for line, m in ticket_references(text or "")]
    assert not found, "name things by the question they answer, not the ticket:\n" + "\n".join(found)


def test_test_files_stay_small():
    found = [
        f"{path.relative_to(REPO)}: {lines} lines"
        for path in _files("tests")
        if path.suffix == ".py" and (lines := too_long(path.read_text())) is not None
    ]
    assert not found, f"over {MAX_LINES} lines, split by subject:\n" + "\n".join(found)


def test_no_test_module_imports_another():
    found = [
        f"{path.relative_to(REPO)}:{line}: imports {module}"
        for path in _files("tests")
        if path.suffix == ".py"
        for line, module in imports_of_test_modules(path.read_text())
    ]
    assert not found, "share helpers through tests/helpers and fixtures through conftest.py:\n" + "\n".join(found)
