"""A persistent banner while the database cannot be reached: since when, and that what the
view shows is from before. During an outage the console kept its last picture ("3 alive",
frozen counts) with nothing to say it was old, and a view opened then said "no runs yet"."""

from __future__ import annotations

from datetime import datetime, tzinfo

from rich.text import Text
from textual.widgets import Static

from engine import format_duration

from ..console import clock_time


class DatabaseBanner(Static):
    DEFAULT_CSS = """
    DatabaseBanner {
        display: none; height: 1;
        background: $error 25%; color: $text; border-left: thick $error; padding: 0 1;
        text-wrap: nowrap; text-overflow: ellipsis;
    }
    DatabaseBanner.-out { display: block; }
    """

    def show_since(self, since: datetime | None, now: datetime, tz: tzinfo | None) -> None:
        self.set_class(since is not None, "-out")
        if since is None:
            self.update("")
            return
        out_for = format_duration(max(0.0, (now - since).total_seconds() * 1000))
        text = Text()
        text.append(
            f"⚠ the database is out of reach since {clock_time(since, tz)} ({out_for})",
            style="bold",
        )
        text.append(
            " — reconnecting; what is shown is from before, and actions wait for it",
            style="dim",
        )
        self.update(text)
