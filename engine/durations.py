"""Durations as users write them: milliseconds, or "250ms", "5s", "2m", "1h", "1d"."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator

_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(value: object) -> int:
    """Return a duration in whole milliseconds, or raise ValueError saying what was wrong."""
    if isinstance(value, bool):
        raise ValueError(f"cannot parse duration {value!r}: expected milliseconds or '5s'")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"duration {value!r} is negative")
        return int(value)
    if isinstance(value, str):
        match = _PATTERN.match(value)
        if match:
            number, unit = match.groups()
            return int(float(number) * _UNITS[unit or "ms"])
    raise ValueError(
        f"cannot parse duration {value!r}: use milliseconds or a string like "
        "'250ms', '5s', '2m', '1h', '1d'"
    )


def format_duration(ms: float | None) -> str:
    """120ms, 4.2s, 3m12s, 1h02m, 2d03h: short enough for a table cell, exact enough to
    compare (the console and the CLI both show durations this way)."""
    if ms is None:
        return "–"
    if ms < 1000:
        return f"{ms:.0f}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"


Duration = Annotated[int, BeforeValidator(parse_duration)]
"""A pydantic field type: accepts 500, "500ms", "5s"… and stores milliseconds."""
