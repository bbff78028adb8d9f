"""Text from runs (errors, logs, outputs) made safe to print on a terminal."""

from __future__ import annotations

import re

# C0 and C1 control characters except tab and newline, and DEL: what a terminal acts on
# (clear screen, set title, write the clipboard) instead of showing.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with control characters (escape sequences included) shown as `\\xNN`, so a run's
    error or log line cannot drive the operator's terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
