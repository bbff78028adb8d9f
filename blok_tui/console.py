"""The console's shared look: status icons and colours, and how times and durations read.

Every view formats through here, with the app's clock and time zone, so that a frozen clock in a
snapshot test freezes every "3s ago" and countdown on screen.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime, tzinfo

from rich.text import Text

from engine import format_duration as duration  # one format for the console and the CLI
from engine.text import printable

__all__ = ["duration", "printable"]

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
    """ "in 19s", "in 4m20s": whole seconds, rounded up, since a countdown moves once a
    second (tenths would tick down by exactly 1.0 each time)."""
    if until is None:
        return ""
    left = (until - now).total_seconds()
    if left <= 0:
        return "due now"
    if left < 1:
        return "in <1s"
    seconds = math.ceil(left)
    return f"in {seconds}s" if seconds < 60 else f"in {duration(seconds * 1000)}"


# An ISO 8601 moment as the engine writes it into messages ("may start at 2026-01-15T09:30:03
# .155286+00:00"): the console says it in its own clock instead.
ISO_MOMENT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[+-]\d{2}:\d{2}|Z)?")


def local_times(text: str, tz: tzinfo | None, now: datetime | None = None) -> str:
    """`text` with each ISO 8601 moment in it as HH:MM:SS in the console's time zone; with
    `now`, one of another day than `now` with its date too ("delayed until 10:18:25" was a
    delay of 25 hours, and one of a hundred years read the same)."""
    today = now.astimezone(tz).date() if now is not None else None

    def local(match: re.Match[str]) -> str:
        try:
            moment = datetime.fromisoformat(match.group(0).replace("Z", "+00:00"))
        except ValueError:
            return match.group(0)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        if today is not None and moment.astimezone(tz).date() != today:
            return moment.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S")
        return clock_time(moment, tz)

    return ISO_MOMENT.sub(local, text)


def count(value: int) -> str:
    return f"{value:,}" if value else "·"


SHORT_ID = 8  # characters of an id shown at least (after its "run_" or "job_" prefix)


def short_ids(ids: list[str], least: int = SHORT_ID) -> dict[str, str]:
    """Each id's shortest prefix that no other id in `ids` shares (at least `least`
    characters after the `run_` prefix), as git shortens commit hashes. Ids are time-first,
    so neighbours in sorted order are the ones that decide."""
    bare = sorted({i.partition("_")[2] or i for i in ids})
    need: dict[str, int] = {}
    for a, b in itertools.pairwise(bare):
        common = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            common += 1
        need[a] = max(need.get(a, least), common + 1)
        need[b] = max(need.get(b, least), common + 1)
    short = {}
    for full in ids:
        tail = full.partition("_")[2] or full
        short[full] = tail[: need.get(tail, least)]
    return short
