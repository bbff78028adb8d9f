"""Durations as users write them: milliseconds, "250ms", "5s", "2m", "1h", "1d" or a
`datetime.timedelta`; and the moments a `wait.until` names."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator

_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# The sign is matched so that "-1s" is refused as negative, as -1 is, not as unreadable.
_PATTERN = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")

# The longest duration anything takes: 100 years. A delay, timeout or retention beyond it is a
# typo or a hostile value, and one some thousands of years long no longer fits a datetime
# (now + 99999999d raises OverflowError wherever it is added).
MAX_DURATION_MS = 36_525 * _UNITS["d"]


def parse_duration(value: object) -> int:
    """Return a duration in whole milliseconds, or raise ValueError saying what was wrong."""
    if isinstance(value, bool):
        raise ValueError(f"cannot parse duration {value!r}: expected milliseconds or '5s'")
    if isinstance(value, int | float):
        return _bounded(value, value)
    if isinstance(value, timedelta):  # whole milliseconds, as a float number of them is
        return _bounded(value // timedelta(microseconds=1) / 1000, value)
    if isinstance(value, str):
        match = _PATTERN.match(value)
        if match:
            number, unit = match.groups()
            return _bounded(float(number) * _UNITS[unit or "ms"], value)
    raise ValueError(
        f"cannot parse duration {_shown(value)}: use milliseconds, a string like "
        "'250ms', '5s', '2m', '1h', '1d', or a timedelta"
    )


def _bounded(ms: float, given: object) -> int:
    shown = _shown(given)
    if isinstance(ms, float) and math.isnan(ms):
        raise ValueError(f"duration {shown} is not a number")
    if ms < 0:
        raise ValueError(f"duration {shown} is negative")
    if ms > MAX_DURATION_MS:
        raise ValueError(f"duration {shown} is longer than 100 years")
    return int(ms)


def _shown(value: object) -> str:
    """The value as the user wrote it, cut short: it goes into a one-line message."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4300-digit limit for str()
        return "(a number too long to show)"
    return text if len(text) <= 40 else text[:39] + "…"


def exact_duration(ms: int | None) -> str:
    """30s, 10m, 1d, 1500ms: the largest unit that holds the duration exactly (a setting as
    it was written, where `format_duration` rounds a measured one)."""
    if ms is None:
        return "–"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


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
"""A pydantic field type: accepts 500, "500ms", "5s", timedelta(seconds=5)… and stores
milliseconds."""


def parse_until(value: Any) -> datetime:
    """A wait.until moment: datetime, ISO string, epoch milliseconds (number or digits)."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value / 1000, UTC)
    if isinstance(value, str):
        text = value.strip()
        try:
            return datetime.fromtimestamp(float(text) / 1000, UTC)
        except ValueError:
            pass
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    raise ValueError(
        f"wait.until: cannot parse {value!r} as a date: use a datetime, an ISO 8601 string "
        "('2026-12-02T15:00:00Z') or epoch milliseconds"
    )
