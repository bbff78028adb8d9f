"""Text from runs (errors, logs, outputs) made safe to print on a terminal."""

from __future__ import annotations

import re

# C0 and C1 control characters except tab and newline, and DEL: what a terminal acts on
# (clear screen, set title, write the clipboard) instead of showing; and the bidirectional
# overrides and isolates, which reorder what is shown after them (an error's text made to read
# as something else: "Trojan Source").
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with control characters (escape sequences included) shown as `\\xNN`, so a run's
    error or log line cannot drive the operator's terminal."""
    return _CONTROL.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
