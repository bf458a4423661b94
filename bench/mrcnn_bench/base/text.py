"""Text made safe to print: from outside, in a table (no forged cells or rows, no live terminal
escapes); and JSON that every parser reads (no ``NaN`` or ``Infinity``, which Python writes)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

# C0 and C1 control characters (ESC, CR, NUL, ...) and DEL: never printed as themselves.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def cell(text: object) -> str:
    """``text`` as one cell of a markdown table or one line on a terminal: ``|`` escaped, a newline
    or any other control character shown as its ``\\xNN`` escape."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", str(text)).replace("|", "\\|")


def finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float (nested in dicts, lists, tuples) replaced by None: JSON's null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def strict_json(value: Any, **kwargs: Any) -> str:
    """``value`` as standard JSON, a non-finite number as ``null`` (``json.dumps`` would write ``NaN`` or
    ``Infinity``, which is not JSON); ``kwargs`` go to ``json.dumps``."""
    return json.dumps(finite_or_none(value), allow_nan=False, **kwargs)
