"""The console's shared look: status icons and colours, and how times and durations read.

Every view formats through here, with the app's clock and time zone, so that a frozen clock in a
snapshot test freezes every "3s ago" and countdown on screen.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, tzinfo

from rich.text import Text

from engine import format_duration as duration  # one format for the console and the CLI

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    return datetime.now(UTC)


# icon, style: one glyph per status so a column of them reads at a glance.
RUN_STATUS_LOOK: dict[str, tuple[str, str]] = {
    "queued": ("○", "grey62"),
    "delayed": ("◷", "khaki3"),
    "debounced": ("≈", "grey50"),
    "running": ("▶", "bold deep_sky_blue1"),
    "waiting": ("⏸", "khaki1"),
    "completed": ("✓", "green3"),
    "failed": ("✗", "bold red1"),
    "cancelled": ("⊘", "grey58"),
    "timed_out": ("⧗", "bold dark_orange"),
    "crashed": ("☠", "bold magenta"),
    "throttled": ("⋯", "khaki3"),
    "expired": ("⌀", "grey50"),
}
STEP_STATUS_LOOK: dict[str, tuple[str, str]] = {
    "pending": ("·", "grey42"),
    "running": ("▶", "bold deep_sky_blue1"),
    "completed": ("✓", "green3"),
    "failed": ("✗", "bold red1"),
    "skipped": ("↷", "grey50"),
    "cached": ("◆", "medium_purple1"),
    "cancelled": ("⊘", "grey58"),
    "waiting": ("⏸", "khaki1"),
}


def status_text(status: str, *, steps: bool = False, label: bool = True) -> Text:
    looks = STEP_STATUS_LOOK if steps else RUN_STATUS_LOOK
    icon, style = looks.get(str(status), ("?", "white"))
    name = str(status).replace("_", " ")
    return Text(f"{icon} {name}" if label else icon, style=style)


def status_style(status: str, *, steps: bool = False) -> str:
    looks = STEP_STATUS_LOOK if steps else RUN_STATUS_LOOK
    return looks.get(str(status), ("?", "white"))[1]


def clock_time(moment: datetime | None, tz: tzinfo | None) -> str:
    if moment is None:
        return "–"
    return moment.astimezone(tz).strftime("%H:%M:%S")


def day_time(moment: datetime | None, tz: tzinfo | None, now: datetime) -> str:
    """HH:MM:SS for today, with the date in front for older moments."""
    if moment is None:
        return "–"
    local = moment.astimezone(tz)
    if local.date() == now.astimezone(tz).date():
        return local.strftime("%H:%M:%S")
    return local.strftime("%m-%d %H:%M")


def countdown(until: datetime | None, now: datetime) -> str:
    if until is None:
        return ""
    left = (until - now).total_seconds() * 1000
    return "due now" if left <= 0 else f"in {duration(left)}"


def count(value: int) -> str:
    return f"{value:,}" if value else "·"
