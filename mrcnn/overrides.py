"""``KEY=VALUE`` command-line overrides (``--set``), shared by every command that takes them."""

from __future__ import annotations

import argparse
import ast
from typing import Any


def parse_override(text: str) -> tuple[str, Any]:
    """``"key=value"`` -> ``("key", value)``: the value as a Python literal, else the string itself.

    An argparse ``type=``: a text without ``=`` raises ``argparse.ArgumentTypeError``.
    """
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--set expects key=value, got {text!r}")
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        parsed = value
    return key.strip(), parsed
