"""A step's attempts: number, status, duration, error, and the backoff before the next one;
then the traceback of each failed attempt, newest first, so the cause is on screen."""

from __future__ import annotations

from datetime import datetime

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from engine import StepRun

from ..console import duration, status_text


class AttemptsView(Static):
    DEFAULT_CSS = """
    AttemptsView { height: auto; padding: 0 1; }
    """

    def show(self, step: StepRun, now: datetime) -> None:
        if not step.attempts:
            note = "cached from run " + step.cached_from if step.cached_from else "no attempts yet"
            if step.kind == "wait":
                note = "a wait: no attempts"
            self.update(Text(note, style="dim italic"))
            return
        table = Table(
            box=None, padding=(0, 1), expand=True, show_edge=False, header_style="bold dim"
        )
        table.add_column("#", justify="right", width=3)
        table.add_column("status", width=11, no_wrap=True)
        table.add_column("took", justify="right", width=7, no_wrap=True)
        table.add_column("error", ratio=1, overflow="fold")
        table.add_column("next", width=14, no_wrap=True)
        for attempt in step.attempts:
            then = ""
            if attempt.backoff_ms is not None:
                then = f"retry in {duration(attempt.backoff_ms)}"
            table.add_row(
                f"{attempt.number}/{step.max_attempts}",
                status_text(str(attempt.status), steps=True)
                if str(attempt.status) != "timed_out"
                else Text("⧗ timed out", style="bold dark_orange"),
                duration(
                    attempt.duration_ms
                    if attempt.finished_at
                    else (now - attempt.started_at).total_seconds() * 1000
                ),
                Text(attempt.error or "", style="red1")
                if attempt.error
                else Text("–", style="dim"),
                Text(then, style="khaki1"),
            )
        parts: list[RenderableType] = [table]
        # The newest traceback in full; an older one only when it says something else.
        shown: set[str] = set()
        for attempt in reversed(step.attempts):
            if attempt.traceback and attempt.traceback not in shown:
                shown.add(attempt.traceback)
                parts.append(Text(f"\nattempt {attempt.number} traceback", style="bold dim"))
                parts.append(Text(attempt.traceback.rstrip(), style="grey70"))
        self.update(Group(*parts))
