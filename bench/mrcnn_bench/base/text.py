"""Text from outside, made safe to print in a table: no forged cells or rows, no live terminal escapes."""

from __future__ import annotations

import re

# C0 and C1 control characters (ESC, CR, NUL, ...) and DEL: never printed as themselves.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def cell(text: object) -> str:
    """``text`` as one cell of a markdown table or one line on a terminal: ``|`` escaped, a newline
    or any other control character shown as its ``\\xNN`` escape."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", str(text)).replace("|", "\\|")
