"""A step's attempts: number, status, duration, error, and the backoff before the next one;
then the traceback of each failed attempt, newest first, so the cause is on screen."""

from __future__ import annotations

from datetime import datetime

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from engine import StepRun

from ..console import duration, status_text
from ..tracebacks import clean_error, fold_traceback

NARROW = 60  # below this many columns, statuses are icons and backoffs are short


# The steps that hold others: their attempts are their steps'.
HOLDERS = ("for_each", "loop", "switch", "try_catch")


def no_attempts(step: StepRun, unreached: bool) -> str:
    """What a step without attempts says in their place: why it has none."""
    status = str(step.status)
    if step.cached_from:
        return "cached from run " + step.cached_from
    if step.kind == "wait":
        return "a wait: no attempts"
    if step.kind == "event" and status == "waiting":
        return "waits for an event: no attempts"
    if step.kind == "event":  # done waiting: the title says how it ended
        return "an event wait: no attempts"
    if step.kind == "subworkflow" and step.child_run_id:
        return "a subworkflow: its child run has the attempts"
    if step.kind in HOLDERS:
        return f"a {step.kind}: no attempts of its own; its steps have them"
    if status in ("pending", "running", "waiting") and not unreached:
        return "no attempts yet"
    if status == "failed":  # e.g. its input was refused: the error above says why
        return "no attempts: it failed before its function was called"
    if status == "cancelled":
        return "no attempts: cancelled before its function was called"
    if status == "skipped":
        return "skipped: no attempts"
    return "no attempts"


class AttemptsView(Static):
    DEFAULT_CSS = """
    AttemptsView { height: auto; padding: 0 1; }
    """

    def show(self, step: StepRun, now: datetime, *, unreached: bool = False) -> None:
        """`unreached`: its run ended before it (a pending step is then not "yet" to run)."""
        narrow = 0 < self.size.width < NARROW
        if not step.attempts:
            self.update(Text(no_attempts(step, unreached), style="dim italic"))
            return
        rows = []
        for attempt in step.attempts:
            then = ""
            if attempt.backoff_ms is not None:
                then = f"retry in {duration(attempt.backoff_ms)}"
            status = (
                status_text(str(attempt.status), steps=True)
                if str(attempt.status) != "timed_out"
                else Text("⧗ timed out", style="bold dark_orange")
            )
            took = duration(
                attempt.duration_ms
                if attempt.finished_at
                else (now - attempt.started_at).total_seconds() * 1000
            )
            error = (
                Text(clean_error(attempt.error), style="red1")
                if attempt.error
                else Text("–", style="dim")
            )
            rows.append((f"{attempt.number}/{step.max_attempts}", status, took, error, then))
        table: RenderableType
        if narrow:
            # Each attempt in two columns, its error under its status at full width (an error
            # column would be a dozen characters wide here).
            grid = Table(box=None, padding=(0, 1), expand=True, show_header=False)
            grid.add_column(width=5, justify="right", no_wrap=True)
            grid.add_column(ratio=1, overflow="fold")
            for number, status, took, error, then in rows:
                cell = Text.assemble(status, f"  {took}")
                if then:
                    cell.append(f"  {then}", style="khaki1")
                if str(error) != "–":
                    cell.append("\n")
                    cell.append_text(error)
                grid.add_row(number, cell)
            table = grid
        else:
            # The error column takes what the others leave: each of them is as wide as what
            # it holds (fixed widths, 16 for "retry in 100ms", left the error 37 columns at
            # 140, and it wrapped mid-phrase).
            grid = Table(
                box=None, padding=(0, 1), expand=True, show_edge=False, header_style="bold dim"
            )
            grid.add_column("#", justify="right", no_wrap=True)
            grid.add_column("status", no_wrap=True)
            grid.add_column("took", justify="right", no_wrap=True)
            grid.add_column("error", ratio=1, overflow="fold")
            if any(then for *_, then in rows):
                grid.add_column("next", no_wrap=True)
            for number, status, took, error, then in rows:
                cells: list[RenderableType] = [number, status, took, error]
                if len(grid.columns) == 5:
                    cells.append(Text(then, style="khaki1"))
                grid.add_row(*cells)
            table = grid
        parts: list[RenderableType] = [table]
        # The newest traceback in full; an older one only when it says something else.
        shown: set[str] = set()
        for attempt in reversed(step.attempts):
            if attempt.traceback and attempt.traceback not in shown:
                shown.add(attempt.traceback)
                parts.append(Text(f"\nattempt {attempt.number} traceback", style="bold dim"))
                parts.append(indented(fold_traceback(attempt.traceback), style="grey70"))
        self.update(Group(*parts))


def indented(text: str, style: str) -> Group:
    """`text`, a traceback, each of its lines wrapped under its own indent: as one Text, a
    frame's line too long for the pane went on in its first column ("line\n18, in upload"),
    where it read as a line of its own."""
    lines = []
    for line in text.splitlines():
        content = line.lstrip(" ")
        lines.append(Padding(Text(content, style=style), (0, 0, 0, len(line) - len(content))))
    return Group(*lines)
