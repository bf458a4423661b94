"""``mrcnn-bench asv TOOL ...``: the tools around asv's history of commits, one subcommand each.

Each tool is the ``build_parser(prog)`` and ``main(argv, prog)`` of the module that does the work,
imported when it runs (they pull in pandas, git and Chromium's driver); ``mrcnn-bench asv TOOL
--help`` lists its flags. The make targets ``asv-*`` call these (bench/README.md lists them by job).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

# The checkout this package lies in: the scratch ranges are built in it unless --repo says otherwise.
CHECKOUT = Path(__file__).resolve().parents[3]

# tool -> (module, what it does); in the order a history is made, read and published.
TOOLS = {
    "machine": ("mrcnn_bench.history.asv_machine", "this host's asv machine name; --register records it for asv"),
    "fixture": ("mrcnn_bench.history.fixed_accuracy",
                "make the fixed checkpoint once per machine, or evaluate this checkout's AP on it"),
    "scratch": ("mrcnn_bench.history.scratch_range", "build or check the scratch and steps commit ranges"),
    "spread": ("mrcnn_bench.history.aa_spread", "the same commit measured N times: the A/A spread of every figure"),
    "table": ("mrcnn_bench.changes.asv_results_table", "the held figures of one asv machine's commits, one table"),
    "flags": ("mrcnn_bench.changes.asv_regressions", "every regression asv flagged, and the scratch range's verdict"),
    "report": ("mrcnn_bench.changes.regression_report", "each regression change point, as a block ready to file"),
    "offline-html": ("mrcnn_bench.publish.offline_html", "make asv's published pages load with no network"),
    "screenshots": ("mrcnn_bench.publish.screenshots", "the published dashboard or a report in headless Chromium"),
}


def usage(prog: str) -> str:
    width = max(map(len, TOOLS))
    lines = [f"usage: {prog} TOOL [options]  ({prog} TOOL --help for a tool's options)", "", "tools:"]
    return "\n".join(lines + [f"  {name:<{width}}  {about}" for name, (_, about) in TOOLS.items()])


def parsers(prog: str) -> dict[str, argparse.ArgumentParser]:
    """Every tool's parser, by tool (the modules imported now)."""
    return {tool: importlib.import_module(module).build_parser(f"{prog} {tool}", **_extra(tool))
            for tool, (module, _) in TOOLS.items()}  # fmt: skip


def _extra(tool: str) -> dict[str, Path]:
    """What a tool is given beside its arguments: the scratch ranges are built in this checkout."""
    return {"default_repo": CHECKOUT} if tool == "scratch" else {}


def run_argv(prog: str, argv: list[str]) -> int:
    """Run the tool ``argv[0]`` names with the rest of ``argv``; its exit code (2 for an unknown tool)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(prog), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    tool, rest = argv[0], argv[1:]
    if tool not in TOOLS:
        print(f"{prog}: unknown tool {tool!r}; one of: {', '.join(TOOLS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(TOOLS[tool][0])
    return int(module.main(rest, prog=f"{prog} {tool}", **_extra(tool)) or 0)
