"""Live log lines across every run (:logs or L), and the engine's own warnings (run "engine":
engine_log.py), newest at the bottom, following as they come unless the cursor is moved up.
`/` filters by text (message, run id, step, level); enter opens the run of the line under the
cursor."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.widgets import Static

from engine import LogRecorded

from . import actions
from .base_screen import Changes, RowFilterScreen
from .console import clock_time, short_ids
from .engine_log import ENGINE
from .run_screen import LEVELS, LOG_STYLES
from .tracebacks import clean_error
from .widgets import FilterInput
from .widgets.row_table import Column, RowTable

SHOWN = 1_000  # matching lines on screen at most (the newest)
COLUMNS = (
    Column("time", "time", 8, priority=9),
    Column("run", "run", 10, priority=8),
    Column("step", "step", 12, priority=2),
    Column("level", "lvl", 4, priority=5),
    Column("message", "message", 20, priority=10, flex=True),
)


class LogsScreen(RowFilterScreen):
    SCOPE: ClassVar[str] = actions.LOGS
    BINDINGS: ClassVar[list[BindingType]] = actions.bindings(actions.LOGS)

    def __init__(self) -> None:
        super().__init__()
        self.text = ""
        self.follow = True  # the cursor stays on the newest line until moved up from it

    @property
    def crumb(self) -> str:
        return "logs"

    def compose_body(self) -> ComposeResult:
        yield Static(id="logs-summary", classes="filters")
        yield FilterInput("filter log lines: message, run id, step or level…")
        yield RowTable(COLUMNS, id="logs")

    @property
    def table(self) -> RowTable:
        return self.query_one("#logs", RowTable)

    def on_mount(self) -> None:
        self.table.focus()

    async def load(self) -> None:
        self.render_rows()

    def render_rows(self) -> None:
        lines = list(self.blok.log_lines)
        needle = self.text.lower()
        if needle:
            lines = [
                (n, e)
                for n, e in lines
                if needle in f"{e.run_id} {self.step_of(e)} {e.level} {e.message}".lower()
            ]
        lines = lines[-SHOWN:]
        short = short_ids([event.run_id for _, event in lines])
        tz = self.blok.tz
        rows = []
        for n, event in lines:
            level = event.level.lower()
            style = LOG_STYLES.get(level, "")
            rows.append(
                (
                    str(n),
                    [
                        Text(clock_time(datetime.fromtimestamp(event.ts, UTC), tz), style="grey50"),
                        Text(short[event.run_id], style="grey62"),
                        Text(self.step_of(event)),
                        Text(LEVELS.get(level, level[:4]), style=style or "grey70"),
                        Text(clean_error(event.message).replace("\n", " ⏎ "), style=style),
                    ],
                )
            )
        table = self.table
        # Following while the cursor is on the newest line (or there is none yet).
        self.follow = table.cursor_row >= table.row_count - 1
        table.set_rows(rows)
        if self.follow and rows:
            table.move_cursor(len(rows) - 1, announce=False)
        summary = Text()
        total = len(self.blok.log_lines)
        summary.append(f"{total:,} log lines since the console started", style="bold")
        if self.text:
            summary.append(f"   / {self.text}  ({len(rows):,} match)  esc clears", style="khaki1")
        summary.append(
            "   following" if self.follow else "   paused: end follows again", style="dim"
        )
        self.query_one("#logs-summary", Static).update(summary, layout=False)

    def step_of(self, line: LogRecorded) -> str:
        """The step that logged the line: its name once its start was seen (the line carries
        only its index), else its number; nothing for a run-level line."""
        if line.step is None:
            return ""
        return self.blok.step_names.get((line.run_id, line.step)) or f"step {line.step + 1}"

    def on_row_table_selected(self, event: RowTable.Selected) -> None:
        event.stop()
        self.action_open_line_run()

    def action_open_line_run(self) -> None:
        key = self.table.cursor_key
        found = next((e for n, e in self.blok.log_lines if str(n) == key), None)
        if found is not None and found.run_id == ENGINE:
            self.notify("an engine warning: no run of its own", severity="warning")
        elif found is not None:
            self.blok.open_run(found.run_id)

    def engine_changed(self, changes: Changes) -> None:
        if changes.logs or changes.everything:
            self.render_rows()
