"""The front page's claims, checked against the tree.

A newcomer reads README.md in five minutes only while it stays short, and trusts its layout table
only while the table names the folders that are there: a folder added without a row, or a row left
behind for a folder that moved, fails here. The long form lives in docs/, so its links are checked
too: a page that moves takes its links with it or this fails.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers.module_map import documented_map, render, rooms

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_README_LINES = 300
LAYOUT_HEADING = "## Layout"

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)  # a fenced code block, fences included
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target "title")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:: not a path in the tree


def layout_paths(markdown: str, heading: str = LAYOUT_HEADING) -> list[str]:
    """The paths the layout table names: every `code` span in the first column of the first table
    under ``heading``, in order, with a trailing ``/`` dropped. ValueError when there is no such heading."""
    lines = markdown.splitlines()
    try:
        start = [line.strip() for line in lines].index(heading)
    except ValueError:
        raise ValueError(f"no {heading!r} heading") from None
    paths: list[str] = []
    in_table = False
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break  # the next section: a table there belongs to it
        if line.lstrip().startswith("|"):
            in_table = True
            first = line.strip().strip("|").split("|")[0]
            paths += [span.rstrip("/") for span in re.findall(r"`([^`]+)`", first)]
        elif in_table:
            break  # the table ended; a later table in the same section is not the layout
    return paths


def relative_links(markdown: str) -> list[str]:
    """Link targets that name a file or folder of the tree: no URL scheme, no bare ``#anchor``,
    the anchor and query dropped. Code blocks and code spans are not read: their brackets are code."""
    prose = CODE_SPAN.sub("", FENCE.sub("", markdown))
    targets = []
    for target in LINK.findall(prose):
        if SCHEME.match(target) or target.startswith("#"):
            continue
        targets.append(re.split(r"[#?]", target, maxsplit=1)[0])
    return targets


def _tracked_files() -> list[str]:
    """Every file git tracks, relative to the repo; the test skips outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout, or no git: {e}")
    return [f for f in out.split("\0") if f]


def _folders(files: list[str], under: str = "") -> set[str]:
    """The folders directly under ``under`` ("" for the repo root) that hold a tracked file, as paths
    from the repo root; a tracked file whose folder is gone from the working tree does not count."""
    prefix = f"{under}/" if under else ""
    found = set()
    for f in files:
        if f.startswith(prefix) and "/" in f[len(prefix) :]:
            folder = prefix + f[len(prefix) :].split("/")[0]
            if (REPO / folder).is_dir():
                found.add(folder)
    return found


# The parsers first, on text made up here: a wrong parser would pass every check below.


def test_layout_paths_reads_the_first_column_of_the_first_table_under_the_heading():
    text = "\n".join(
        [
            "# Title",
            "| `not/this/` | a table before the heading |",
            "## Layout",
            "",
            "Some words with `code/` in them.",
            "",
            "| path | what |",
            "| --- | --- |",
            "| `a/` | first; `not/second/column/` |",
            "| `b/c/`, `d.txt` | two paths in one cell |",
            "| no code here | skipped |",
            "",
            "| `after/the/table/` | a second table in the section |",
            "## Next",
            "| `next/section/` | |",
        ]
    )
    assert layout_paths(text) == ["a", "b/c", "d.txt"]
    assert layout_paths(text, "## Next") == ["next/section"]
    with pytest.raises(ValueError, match="no '## Missing' heading"):
        layout_paths(text, "## Missing")


def test_relative_links_skips_urls_anchors_and_code():
    text = "\n".join(
        [
            'See [a](docs/a.md), [b](../b/#part), [c](c.md?x=1 "title") and [web](https://example.org).',
            "[top](#exit-codes), [mail](mailto:x@example.org), `[span](not/a/link.md)`.",
            "```",
            "[fenced](not/a/link/either.md)",
            "```",
            "[after](results/README.md)",
        ]
    )
    assert relative_links(text) == ["docs/a.md", "../b/", "c.md", "results/README.md"]


# The README and docs themselves.


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines (at most {MAX_README_LINES}): move the long form to docs/"
    )


def test_every_path_in_the_layout_table_exists():
    paths = layout_paths(README.read_text())
    assert paths, "the layout table names no paths"
    missing = [p for p in paths if not (REPO / p).exists()]
    assert not missing, f"the README's layout table names paths that are not in the tree: {missing}"


def test_every_top_level_folder_and_every_folder_of_bench_has_a_row():
    named = set(layout_paths(README.read_text()))
    files = _tracked_files()
    folders = _folders(files) | _folders(files, "bench")
    unnamed = sorted(folders - named)
    assert not unnamed, f"folders with no row in the README's layout table: {unnamed}"


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_into_the_tree(page: Path):
    broken = [t for t in relative_links(page.read_text()) if not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(REPO)} links to paths that do not exist: {broken}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(REPO / t).resolve() for t in relative_links(README.read_text())}
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link to: {unlinked}"


def test_the_module_map_in_the_docs_is_the_trees():
    """docs/harness.md's module map is the one written from the rooms and their modules' docstrings."""
    documented = documented_map()
    assert documented is not None, "docs/harness.md has lost its module map markers"
    assert documented == render(), "the module map is stale: rewrite it with `python -m tests.helpers.module_map`"
    assert all(f"    {m}.py" in documented for room in rooms() for m, _ in room.modules)


def test_the_package_docstring_names_every_room():
    doc = (REPO / "bench" / "mrcnn_bench" / "__init__.py").read_text()
    assert [r.name for r in rooms() if f"``{r.name}``" not in doc] == []


BENCH_README = REPO / "bench" / "README.md"


def test_bench_readme_names_every_way_in():
    """bench/README.md lists every subcommand, asv tool, make target, tool and study: a new one without a
    line there fails here, and so does a line left behind for one that is gone."""
    from mrcnn_bench.cli import asv, commands

    text = BENCH_README.read_text()
    subcommands = commands.build_parser()._subparsers._group_actions[0].choices
    targets = re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), re.M)
    tools = sorted(p.name for p in (REPO / "bench" / "tools").glob("*.py"))
    studies = sorted(p.parent.name for p in (REPO / "bench" / "studies").glob("*/README.md"))
    assert len(subcommands) >= 10 and len(targets) >= 15 and tools and len(studies) >= 20
    missing = [f"mrcnn-bench {c}" for c in subcommands if f"mrcnn-bench {c}" not in text]
    missing += [f"mrcnn-bench asv {t}" for t in asv.TOOLS if f"mrcnn-bench asv {t}" not in text]
    missing += [f"make {t}" for t in targets if not re.search(rf"(make |`){t}\b", text)]
    missing += [f"bench/tools/{t}" for t in tools if f"bench/tools/{t}" not in text]
    missing += [f"studies/{s}/README.md" for s in studies if f"(studies/{s}/README.md)" not in text]
    assert missing == []
    named_tools = set(re.findall(r"bench/tools/(\w+\.py)", text))
    named_studies = set(re.findall(r"\(studies/(\w+)/README\.md\)", text))
    named_targets = set(re.findall(r"^make ([a-z][\w-]*)", text, re.M))
    stale = (named_tools - set(tools)) | (named_studies - set(studies)) | (named_targets - set(targets))
    assert stale == set()


def test_every_harness_module_the_docs_name_exists():
    """A dotted name ``mrcnn_bench.<room>.<module>[.<attribute>]`` in the README, docs/ or bench/README.md
    names a module of the tree (a module that moved or went takes its mentions with it)."""
    pages = [README, BENCH_README, *sorted(DOCS.glob("*.md"))]
    package = REPO / "bench" / "mrcnn_bench"
    stale = []
    for page in pages:
        for room, module in re.findall(r"\bmrcnn_bench\.(\w+)\.(\w+)", page.read_text()):
            if (package / room).is_dir() and not (package / room / f"{module}.py").is_file():
                stale.append(f"{page.relative_to(REPO)}: mrcnn_bench.{room}.{module}")
            elif not (package / room).is_dir() and not (package / f"{room}.py").is_file():
                stale.append(f"{page.relative_to(REPO)}: mrcnn_bench.{room}")
    assert stale == []
