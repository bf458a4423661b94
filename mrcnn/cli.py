"""``mrcnn`` command line: one subcommand per job, each defined next to the code it runs."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module with add_arguments(parser) and run(args), one-line help)
COMMANDS = {
    "synth": ("mrcnn.data.synthetic", "write the synthetic COCO-format data set"),
    "train": ("mrcnn.train", "train the static model: SGD + warm-up, AMP, DDP (torchrun), exact resume, COCO eval"),
    "accuracy-gate": (
        "mrcnn.accuracy",
        "train the ci recipe (or evaluate a checkpoint) and fail when box or mask AP is below the stored baseline",
    ),
    "export": ("mrcnn.export", "torch.export / AOTInductor package of the static model for one canvas"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mrcnn", description=__doc__)
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
