"""``mrcnn`` command line: one subcommand per job, each defined next to the code it runs.

Each command module exposes ``add_arguments(parser)`` and ``run(args) -> int``. A module is imported
only when its subcommand is named, so ``mrcnn --help`` and ``mrcnn --version`` do not load torch.
Exit codes: the table in :mod:`mrcnn.exits` (0 done, 1 failed, 2 bad input, 3 internal error).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from mrcnn.exits import UNDECIDED, guarded, version_text

PROG = "mrcnn"

# name -> (module with add_arguments(parser) and run(args), one-line help)
COMMANDS = {
    "synth": ("mrcnn.data.synthetic", "write the synthetic COCO-format data set"),
    "train": ("mrcnn.train", "train the static model: SGD + warm-up, AMP, DDP (torchrun), exact resume, COCO eval"),
    "export": ("mrcnn.export.cli", "torch.export / AOTInductor package of the static model for one canvas"),
}

# Commands that moved to the benchmark harness (they measure): old name -> new spelling.
MOVED = {
    "accuracy-gate": "mrcnn-bench accuracy-gate",
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: subcommand names and help only (their own flags load with them)."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=version_text(PROG))
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, (_, help_) in COMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    return parser


def run_command(name: str, argv: list[str]) -> int:
    """Import the subcommand's module, parse ``argv`` with its flags, run it."""
    module_name, help_ = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"{PROG} {name}", description=help_)
    module.add_arguments(parser)
    result = module.run(parser.parse_args(argv))
    return result if isinstance(result, int) else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in MOVED:
        print(f"{PROG}: '{argv[0]}' moved to the benchmark harness: run `{MOVED[argv[0]]}`", file=sys.stderr)
        return UNDECIDED
    command = argv[0] if argv and argv[0] in COMMANDS else ""

    def run() -> int:
        if not command:  # --help, --version, or a usage error: argparse prints and exits
            build_parser().parse_args(argv)
        return run_command(command, argv[1:])

    return guarded(PROG, run, lambda: command)


if __name__ == "__main__":
    sys.exit(main())
