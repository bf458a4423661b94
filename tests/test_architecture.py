"""The line between the library and everything that measures, checked on the source tree.

- no import cycle among the project's modules, counting imports inside functions too;
- the harness is a house of rooms (subpackages): every module in exactly one, and each room imports only
  the rooms its ``__init__`` allows (its ``May import:`` line, read by ``tests.helpers.module_map``);
- ``mrcnn`` never imports the harness, carries no benchmark knobs and names no results folder;
- an import inside a function says why (a comment on its line or the line above);
- the library installs and runs without the harness's and XLA's packages.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.module_map import loose_modules, may_import, rooms

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"mrcnn": REPO / "mrcnn", "mrcnn_bench": REPO / "bench" / "mrcnn_bench"}
# What a plain `pip install mrcnn` must do without: the XLA backend and the harness's libraries.
OPTIONAL = ("torch_xla", "pandas", "scipy", "matplotlib", "tabulate", "asv", "mrcnn_bench")
MAX_LINES = 450  # "about 400" per source file


def _modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of both packages."""
    found = {}
    for package, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, int, bool]]:
    """(imported project module, line, inside a function) for each import statement of a module."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nested = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
              for n in ast.walk(f) if n is not f}  # fmt: skip
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            # `from pkg import mod` imports pkg.mod when that is a module, else a name of pkg.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES and "." in target:
                target = target.rpartition(".")[0]
            out.append((target, node.lineno, id(node) in nested))
    return out


def _graph() -> dict[str, set[str]]:
    return {name: {t for t, _, _ in _imports(name, path) if t in MODULES and t != name}
            for name, path in MODULES.items()}  # fmt: skip


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert len(MODULES) > 40, "the module walk found too few modules"
    assert _cycles(_graph()) == []


def test_nothing_imports_the_command_lines():
    """The CLI modules read argv and call commands through typed options; no command calls back into them."""
    graph = _graph()
    clis = {name for name in graph if name.startswith("mrcnn_bench.cli.")} | {"mrcnn.cli"}
    assert {"mrcnn_bench.cli.commands", "mrcnn_bench.running.runner", "mrcnn_bench.running.records"} <= set(graph)
    callers = {name for name, deps in graph.items() if deps & clis}
    assert sorted(c for c in callers if c not in clis and c != "mrcnn_bench.__main__") == []


def _room(module: str) -> str | None:
    """The room of a harness module (``mrcnn_bench.<room>[.<module>]``); None outside the harness's rooms."""
    parts = module.split(".")
    return parts[1] if parts[0] == "mrcnn_bench" and len(parts) > 1 and parts[1] != "__main__" else None


def room_violations(graph: dict[str, set[str]], allowed: dict[str, frozenset[str] | None]) -> list[str]:
    """``a imports b`` for each import from one room into another that ``allowed`` (room -> the rooms it
    may import; None: every room) does not permit."""
    found = []
    for name, deps in sorted(graph.items()):
        here = _room(name)
        if here is None:
            continue
        for dep in sorted(deps):
            there = _room(dep)
            if there is None or there == here:
                continue
            rule = allowed.get(here, frozenset())
            if rule is not None and there not in rule:
                found.append(f"{name} imports {dep}: room {here} may import {sorted(rule) or 'no room'}")
    return found


def test_room_rule_catches_an_import_it_does_not_allow():
    graph = {"mrcnn_bench.running.runner": {"mrcnn_bench.gates.stats", "mrcnn_bench.base.timing"},
             "mrcnn_bench.gates.stats": {"mrcnn_bench.base.defaults", "mrcnn_bench.gates.ab"},
             "mrcnn_bench.cli.commands": {"mrcnn_bench.changes.steps"}}  # fmt: skip
    allowed = {"running": frozenset({"base"}), "gates": frozenset({"base", "running"}), "cli": None}
    assert room_violations(graph, allowed) == [
        "mrcnn_bench.running.runner imports mrcnn_bench.gates.stats: room running may import ['base']"]
    assert may_import("What it is for.\n\nMay import: ``base``,\n``running``.\n") == {"base", "running"}
    assert may_import("For.\n\nMay import: every other room.") is None


def test_every_harness_module_is_in_exactly_one_room():
    assert loose_modules() == []
    found = rooms()
    assert len(found) >= 5, "the room walk found too few rooms"
    names = [f"{r.name}.{m}" for r in found for m, _ in r.modules]
    assert len(names) == len(set(names)) > 40
    assert {f"mrcnn_bench.{n}" for n in names} == {m for m in MODULES if _room(m) and m.count(".") == 2}
    assert not list((REPO / "bench" / "mrcnn_bench").glob("*/*/*.py")), "rooms hold modules, not rooms"


def test_each_room_imports_only_the_rooms_it_allows():
    allowed = {r.name: r.may_import for r in rooms()}
    unknown = {n: sorted(a - set(allowed)) for n, a in allowed.items() if a is not None and a - set(allowed)}
    assert unknown == {}, "a room allows a room that does not exist"
    assert room_violations(_graph(), allowed) == []


def test_library_never_imports_the_harness():
    offenders = [f"{name} imports {t}" for name, path in MODULES.items() if name.startswith("mrcnn.") or name == "mrcnn"
                 for t, _, _ in _imports(name, path) if t.startswith("mrcnn_bench")]  # fmt: skip
    assert offenders == []


def test_library_has_no_benchmark_knobs_or_results_paths():
    offenders = []
    for path in sorted(ROOTS["mrcnn"].rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"inject|results/", line):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert offenders == []


def _block_has_comment(lines: list[str], index: int) -> bool:
    """Whether the block of imports holding ``lines[index]`` is headed by a comment line.

    The block runs up over import lines, blank lines and calls such as ``matplotlib.use("Agg")``
    that must sit between two imports; a comment heads it when it stands right above.
    """
    while index > 0:
        above = lines[index - 1].strip()
        if above.startswith("#"):
            return True
        if not (above == "" or above.startswith(("import ", "from ")) or re.fullmatch(r"[\w.]+\(.*\)", above)):
            return False
        index -= 1
    return False


def test_block_comment_rule():
    lines = ["def f():", "    # lazy: optional", "    import a", "", "    a.use('x')", "    import b",
             "    y = 1", "    import c"]  # fmt: skip
    assert _block_has_comment(lines, 2) and _block_has_comment(lines, 5)
    assert not _block_has_comment(lines, 7)


def test_imports_inside_functions_say_why():
    """An import in a function body needs a comment (same line or the line above) saying why."""
    offenders = []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        for _, lineno, nested in _imports(name, path):
            if nested and "#" not in lines[lineno - 1] and not _block_has_comment(lines, lineno - 1):
                offenders.append(f"{path.relative_to(REPO)}:{lineno}: {lines[lineno - 1].strip()}")
    assert sorted(set(offenders)) == []


def _raised_names(path: Path) -> dict[str, list[int]]:
    """Exception name -> lines, for each ``raise Name(...)`` / ``raise Name`` in the module at ``path``."""
    found: dict[str, list[int]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name):
                found.setdefault(exc.id, []).append(node.lineno)
    return found


def test_the_command_lines_raise_usage_errors_not_plain_value_errors():
    """What the harness's command-line room checks is the user's input: a plain ``raise ValueError`` there
    would report the user's mistake as a bug (exit 3, :mod:`mrcnn.exits`). It raises UsageError, as it
    must in number for this check to mean something."""
    cli = {name: path for name, path in MODULES.items() if name.startswith("mrcnn_bench.cli.")}
    raised = {name: _raised_names(path) for name, path in cli.items()}
    assert {name: r["ValueError"] for name, r in raised.items() if "ValueError" in r} == {}
    assert sum(len(r.get("UsageError", [])) for r in raised.values()) >= 10, raised


def test_every_value_error_subclass_is_a_usage_error():
    """An exception class of its own that subclasses ValueError names bad input (a file, a ref, a baseline):
    it subclasses :class:`mrcnn.exits.UsageError`, or the command lines would call it a bug."""
    bases: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id.endswith("Error")
                                                      for b in node.bases):
                bases[f"{name}.{node.name}"] = [b.id for b in node.bases if isinstance(b, ast.Name)]
    assert bases["mrcnn.exits.UsageError"] == ["ValueError"]
    assert {c: b for c, b in bases.items() if "ValueError" in b} == {"mrcnn.exits.UsageError": ["ValueError"]}
    assert len([c for c, b in bases.items() if "UsageError" in b]) >= 5, bases


def test_source_files_stay_small():
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in MODULES.values()}
    assert {p: n for p, n in sizes.items() if n > MAX_LINES} == {}


def test_install_requirements_leave_out_the_optional_stacks():
    """`pip install mrcnn` (no extras) needs none of the optional packages; `dev` brings them all."""
    try:
        requires = importlib.metadata.requires("mrcnn") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("mrcnn is not installed (make test installs it)")
    names = [re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r]
    base = {n.lower().replace("-", "_") for n in names}
    assert base == {"torch", "torchvision", "numpy", "pillow", "pycocotools", "tqdm"}
    extras = " ".join(r for r in requires if "extra ==" in r)
    for name in ("torch_xla", "pandas", "scipy", "matplotlib"):
        assert name in extras.replace("-", "_")


_BLOCKED_RUN = textwrap.dedent(
    """
    import importlib, pkgutil, sys, tempfile

    BLOCKED = {blocked!r}
    for name in BLOCKED:  # None in sys.modules: `import name` raises ImportError, find_spec says absent
        sys.modules[name] = None
    import torch
    import mrcnn

    for info in pkgutil.walk_packages(mrcnn.__path__, "mrcnn."):
        importlib.import_module(info.name)

    from mrcnn.config import get_config
    from mrcnn.data.coco import CocoDataset
    from mrcnn.data.synthetic import generate
    from mrcnn.evaluate import CocoEvaluator
    from mrcnn.model import MaskRCNN
    from mrcnn.weights import synthetic_weights

    cfg = get_config("tiny")
    model = MaskRCNN(cfg).eval()
    model.load_state_dict(synthetic_weights(cfg, seed=0))
    with tempfile.TemporaryDirectory() as root:
        generate(root, 2, seed=0, split="val", progress=False)
        dataset = CocoDataset(root, "val")
        evaluator = CocoEvaluator(dataset.coco, dataset.label_to_category_id)
        for i in range(len(dataset)):
            image, target = dataset[i]
            out = model.predict([image.float() / 255])
            evaluator.update(out, [int(target["image_id"])])
        metrics = evaluator.summarize()
    assert "bbox/AP" in metrics and "segm/AP" in metrics, metrics
    loaded = sorted(m for m, mod in sys.modules.items() if mod is not None and m.split(".")[0] in BLOCKED)
    assert not loaded, loaded
    print("ok", len(out[0]["scores"]), metrics["bbox/AP"])
    """
)


def test_library_runs_with_optional_packages_blocked():
    """Import every mrcnn module, run MaskRCNN.predict and CocoEvaluator with the optional stacks blocked."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _BLOCKED_RUN.format(blocked=OPTIONAL)],
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok"), proc.stdout


def test_the_harness_takes_new_library_basics_through_base():
    """A harness module runs beside another checkout's mrcnn (worker rows, asv's old commits), which may
    lack mrcnn.files and mrcnn.exits.UsageError: only ``mrcnn_bench.base`` imports them, with a fallback."""
    offenders = []
    for name, path in MODULES.items():
        if not name.startswith("mrcnn_bench") or name.startswith("mrcnn_bench.base"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "mrcnn.files":
                offenders.append(f"{name}:{node.lineno} imports mrcnn.files")
            if isinstance(node, ast.ImportFrom) and node.module == "mrcnn.exits" and any(
                    a.name == "UsageError" for a in node.names):
                offenders.append(f"{name}:{node.lineno} imports mrcnn.exits.UsageError")
    assert offenders == []
