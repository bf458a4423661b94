"""``mrcnn`` command line: one subcommand per job, each defined next to the code it runs.

Each command module exposes ``add_arguments(parser)`` and ``run(args) -> int``. The modules are
imported when the parser is built so that ``--help`` lists every flag; that costs one import of
each, which is what every subcommand pays anyway.
"""

from __future__ import annotations

import argparse
import importlib
import sys

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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in MOVED:
        print(f"mrcnn: '{argv[0]}' moved to the benchmark harness: run `{MOVED[argv[0]]}`", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="mrcnn", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_, description=help_)
        sub_parser.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(sub_parser)
    args = parser.parse_args(argv)
    result = importlib.import_module(args._module).run(args)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
