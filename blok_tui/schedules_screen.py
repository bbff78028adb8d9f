"""The schedules view (`:schedules`): every schedule the workers declared on this database, with
a countdown to its next tick, when it last fired and how its last run went; p pauses or resumes
one, n runs it now, enter opens its last run."""

from __future__ import annotations

from datetime import datetime, tzinfo
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.widgets import Static

from engine import EngineError, ScheduleInfo

from . import actions
from .base_screen import BlokScreen, Changes
from .console import countdown, day_time, printable, short_ids, status_text
from .widgets.row_table import Column, RowTable

COLUMNS = (
    Column("workflow", "workflow", 18, priority=10),
    # The flexible one: a cron with its time zone is the longest thing in a row.
    Column("schedule", "schedule", 22, priority=9, flex=True),
    Column("state", "state", 8, priority=8),
    Column("next", "next", 10, priority=7),
    Column("last", "last fired", 11, priority=4),
    Column("run", "last run", 12, priority=3),
    Column("status", "status", 11, priority=6),
    Column("queue", "queue", 12, priority=2),
)


def _workers(overruled: dict[str, tuple[str, ...]], workflows: list[str]) -> str:
    """ "1 worker declares", "2 workers declare": the live workers `overruled` names for
    `workflows`, counted once each."""
    count = len({worker for name in workflows for worker in overruled[name]})
    return f"{count} workers declare" if count > 1 else f"{count} worker declares"


def row_key(info: ScheduleInfo) -> str:
    return f"{info.workflow}\x00{info.schedule}"


class SchedulesScreen(BlokScreen):
    SCOPE: ClassVar[str] = actions.SCHEDULES
    BINDINGS: ClassVar[list[BindingType]] = actions.bindings(actions.SCHEDULES)

    def __init__(self) -> None:
        super().__init__()
        self.found: list[ScheduleInfo] = []
        # Workflow → the live workers whose own schedules for it do not fire (a mixed fleet).
        self.overruled: dict[str, tuple[str, ...]] = {}

    @property
    def crumb(self) -> str:
        return "schedules"

    def compose_body(self) -> ComposeResult:
        yield Static(id="schedules-summary", classes="filters")
        yield RowTable(COLUMNS, id="schedules")

    @property
    def table(self) -> RowTable:
        return self.query_one("#schedules", RowTable)

    def on_mount(self) -> None:
        super().on_mount()
        self.table.focus()

    async def load(self) -> None:
        self.found = await self.engine.schedules()
        self.overruled = await self.engine.overruled_schedules()
        self.render_rows()

    def render_rows(self) -> None:
        now, tz = self.blok.now(), self.blok.tz
        short = short_ids([i.last_run_id for i in self.found if i.last_run_id])
        rows = [(row_key(info), self.cells(info, now, tz, short)) for info in self.found]
        self.table.set_rows(rows)
        paused = sum(1 for info in self.found if info.paused)
        line = Text()
        line.append("schedules ", style="bold")
        kept = {info.workflow for info in self.found}
        if not self.found and not self.overruled:
            # One line of an 80-column terminal (it wrapped there, and the demo has none).
            line.append(
                " none: a workflow declares them with schedules=[Schedule(...)]", style="dim"
            )
        elif self.found:
            line.append(f" {len(self.found)}", style="grey85")
            if paused:
                line.append(f" · {paused} paused", style="khaki3")
            unserved = sum(1 for info in self.found if not info.served)
            if unserved:  # a countdown that comes and goes, and nothing fires
                line.append(
                    f" · {unserved} not served by a live worker (their ticks do not fire)",
                    style="dark_orange",
                )
        # A mixed fleet: what fires is not what those workers' files say, and where the
        # version declared last has none, nothing of the workflow is listed.
        others = sorted(name for name in self.overruled if name in kept)
        if others:
            line.append(
                f" · {_workers(self.overruled, others)} other schedules for"
                f" {', '.join(others)} (another version of the file): those listed fire",
                style="dark_orange",
            )
        silenced = sorted(name for name in self.overruled if name not in kept)
        if silenced:
            line.append(
                f"{' ·' if self.found else ''} {_workers(self.overruled, silenced)} schedules"
                f" for {', '.join(silenced)}, which another version of the file, declared"
                " last, has none of: none fire",
                style="dark_orange",
            )
        upcoming = [i.next_at for i in self.found if i.next_at is not None and i.served]
        if upcoming:
            line.append(f" · next tick {countdown(min(upcoming), now)}", style="grey70")
        self.query_one("#schedules-summary", Static).update(line, layout=False)

    @staticmethod
    def cells(
        info: ScheduleInfo, now: datetime, tz: tzinfo | None, short: dict[str, str]
    ) -> list[Text | str]:
        state = (
            Text("⏸ paused", style="khaki3")
            if info.paused
            else Text("● active", style="green3")
            if info.served
            else Text("⚠ not served", style="dark_orange")
        )
        upcoming = (
            Text(countdown(info.next_at, now), style="grey85")
            if info.next_at is not None and info.served
            else Text("–", style="dim")
        )
        last = day_time(info.last_fired_at, tz, now) if info.last_fired_at else "never"
        status = status_text(str(info.last_status)) if info.last_status else Text("–", style="dim")
        return [
            Text(printable(info.workflow), style="bold"),
            printable(info.schedule),
            state,
            upcoming,
            last,
            short.get(info.last_run_id, info.last_run_id) if info.last_run_id else "–",
            status,
            printable(info.queue),
        ]

    def selected(self) -> ScheduleInfo | None:
        table = self.table
        if not table.keys:
            return None
        key = table.keys[min(table.cursor_row, len(table.keys) - 1)]
        return next((i for i in self.found if row_key(i) == key), None)

    async def action_toggle_schedule(self) -> None:
        info = self.selected()
        if info is None:
            return
        try:
            if info.paused:
                await self.engine.resume_schedule(info.workflow, info.schedule)
                self.notify(f"{info.workflow} {info.schedule} fires again", title="Resumed")
            else:
                await self.engine.pause_schedule(info.workflow, info.schedule)
                self.notify(f"{info.workflow} {info.schedule} fires no more", title="Paused")
        except EngineError as error:
            self.notify(str(error), severity="error")
        self.request_reload()

    async def action_run_schedule(self) -> None:
        info = self.selected()
        if info is None:
            return
        try:
            run_id = await self.engine.run_schedule(info.workflow, info.schedule)
        except EngineError as error:
            self.notify(str(error), title="Run now refused", severity="error")
            return
        self.notify(f"run {run_id}: enter opens it", title=f"{info.workflow} runs now")
        self.request_reload()

    def action_open_last_run(self) -> None:
        info = self.selected()
        if info is None or info.last_run_id is None:
            self.notify("this schedule has not run yet", severity="warning")
            return
        self.blok.open_run(info.last_run_id)

    def on_row_table_selected(self, event: RowTable.Selected) -> None:
        event.stop()
        self.action_open_last_run()

    def engine_changed(self, changes: Changes) -> None:
        if changes.runs or changes.everything:
            self.request_reload()

    def tick(self) -> None:
        self.request_reload()  # countdowns, and ticks fired by other processes
