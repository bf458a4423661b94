"""Wrong invocations of both command lines, as a new user would type them, and what each prints.

    python bench/studies/wrong_invocations/cli_errors.py --out results/cli/wrong_invocations.md

Each command runs in a fresh process from a scratch folder (so relative paths name nothing), with
``CI`` set (plain progress lines); ``VAR=value`` words before the command set its environment, and the
folder holds :data:`SCRATCH_FILES` (a user's case module that fails at import). The table keeps the
exit code and stderr as printed: one line naming the problem and exit 2 for bad input, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent
INVOCATIONS = [
    "mrcnn train --recipe nosuch --out out/x",
    "mrcnn train --out out/x",
    "mrcnn train --steps 1 --data missing/ --out out/x --no-progress",
    "mrcnn synth --out out/s --format gif",
    "mrcnn export --weights missing.pt --out out/e",
    "mrcnn nosuch",
    "mrcnn accuracy-gate --recipe ci",
    "mrcnn-bench run --cases static/nope",
    "mrcnn-bench run --preset nope",
    "mrcnn-bench run --rounds -1",
    "mrcnn-bench run --cpus 99",
    "mrcnn-bench run --resume",
    "mrcnn-bench run --image-size 480 by 640",
    "mrcnn-bench compare missing_a.json missing_b.json",
    "mrcnn-bench compare HEAD no-such-ref",
    "mrcnn-bench compare . . --inject-slowdown 1.5",
    "mrcnn-bench gate --checkpoint missing.pt",
    "mrcnn-bench gate --cases static/nope",
    "mrcnn-bench accuracy-gate --checkpoint missing.pt",
    "mrcnn-bench export-time missing.pt2",
    "mrcnn-bench report missing.json",
    "mrcnn-bench export-db missing.json --out db.json",
    "mrcnn-bench check-benchmarks missing.json",
    "mrcnn-bench list --bogus",
    "MRCNN_BENCH_CASES=no_such_module mrcnn-bench list",
    "MRCNN_BENCH_CASES=broken_cases PYTHONPATH=. mrcnn-bench run --cases static/eager",
    "MRCNN_BENCH_CASES=broken_cases PYTHONPATH=. mrcnn-bench --help",
]
SCRATCH_FILES = {"broken_cases.py": "raise RuntimeError('typo in my cases')\n"}  # $MRCNN_BENCH_CASES's module


def run_one(command: str, cwd: Path) -> tuple[int, str]:
    argv = shlex.split(command)
    env = {**os.environ, "CI": "true"}
    while "=" in argv[0]:  # VAR=value before the command, as a shell takes it
        key, _, value = argv.pop(0).partition("=")
        env[key] = value
    argv[0] = str(BIN / argv[0])
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
    return done.returncode, done.stderr.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the markdown table to write")
    args = parser.parse_args(argv)
    lines = ["# Wrong invocations and what they print", "",
             "`python bench/studies/wrong_invocations/cli_errors.py --out results/cli/wrong_invocations.md`, "
             "each command from a scratch "
             "folder holding only `broken_cases.py` (`raise RuntimeError('typo in my cases')`), `CI=true`.", "",
             "| command | exit | stderr |", "| --- | --- | --- |"]
    tracebacks = []
    with tempfile.TemporaryDirectory(prefix="mrcnn_cli_errors_") as tmp:
        for name, text in SCRATCH_FILES.items():
            (Path(tmp) / name).write_text(text)
        for command in INVOCATIONS:
            code, err = run_one(command, Path(tmp))
            if "Traceback" in err:
                tracebacks.append(command)
            shown = "<br>".join(line.replace("|", "\\|") for line in err.splitlines()[-4:]) or "(nothing)"
            lines.append(f"| `{command}` | {code} | {shown} |")
            print(f"{code}  {command}", file=sys.stderr)
    lines += ["", f"Tracebacks: {', '.join(tracebacks) or 'none'}."]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 1 if tracebacks else 0


if __name__ == "__main__":
    sys.exit(main())
