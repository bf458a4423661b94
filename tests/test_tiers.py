"""``make test`` (CI) leaves out the tests marked ``extended``; each names the CI test that catches the
same fault more cheaply (``@pytest.mark.extended(ci="tests/...py::test_name")``), which must exist and
run in CI. ``make test-all`` runs both. The list of pairs: docs/testing.md."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "testing.md"


def _marker(decorator: ast.expr, name: str) -> ast.expr | None:
    """The decorator if it is ``pytest.mark.<name>``, called or not."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(target, ast.Attribute) and target.attr == name and ast.unparse(target.value) == "pytest.mark":
        return decorator
    return None


def extended_tests(root: Path = REPO / "tests") -> dict[str, str | None]:
    """Node id (``tests/x.py::test_y``) of each test marked extended -> its ``ci=`` node id (None if absent)."""
    found = {}
    for path in sorted(root.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef):
                continue
            for decorator in node.decorator_list:
                mark = _marker(decorator, "extended")
                if mark is None:
                    continue
                keywords = mark.keywords if isinstance(mark, ast.Call) else []
                ci = next((k.value.value for k in keywords if k.arg == "ci" and isinstance(k.value, ast.Constant)),
                          None)
                found[f"{path.relative_to(root.parent)}::{node.name}"] = ci
    return found


def test_every_extended_test_names_a_ci_test_that_exists_and_runs_in_ci():
    extended = extended_tests()
    assert extended, "no extended test: then this check and docs/testing.md's list are stale"
    for test, ci in extended.items():
        assert ci, f"{test} is marked extended without ci='tests/...::test_name'"
        path, _, name = ci.partition("::")
        assert (REPO / path).is_file(), f"{test}: its CI test's file {path} does not exist"
        tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
        assert name in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}, \
            f"{test}: {path} has no test {name}"
        assert ci not in extended, f"{test}: its CI test {ci} is itself left out of CI"


def test_the_docs_list_every_extended_test_with_its_ci_test():
    text = DOC.read_text(encoding="utf-8")
    for test, ci in extended_tests().items():
        line = next((ln for ln in text.splitlines() if f"`{test}`" in ln), None)
        assert line is not None, f"docs/testing.md does not list {test}"
        assert f"`{ci}`" in line, f"docs/testing.md lists {test} without its CI test {ci}"


def test_the_check_finds_a_marker_and_its_ci_test(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n@pytest.mark.slow\n@pytest.mark.extended(ci='tests/test_y.py::test_b')\n"
        "def test_a():\n    pass\n\n@pytest.mark.extended\ndef test_c():\n    pass\n\ndef test_d():\n    pass\n")
    found = extended_tests(tmp_path)
    assert {k.rsplit("::", 1)[1]: v for k, v in found.items()} == {"test_a": "tests/test_y.py::test_b", "test_c": None}
