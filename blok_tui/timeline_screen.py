"""The timeline of a run (T in the run view): the queue delay, every step and each attempt on
one time axis, with backoff gaps and waits, live while the run goes on."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import VerticalScroll
from textual.widgets import Static

from engine import EngineError, Run

from . import actions
from .base_screen import BlokScreen, Changes
from .console import printable, status_text
from .widgets.timeline import TimelineRows, timeline, timeline_rows


class TimelineScreen(BlokScreen):
    SCOPE: ClassVar[str] = actions.TIMELINE
    BINDINGS: ClassVar[list[BindingType]] = actions.bindings(actions.TIMELINE)

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.run: Run | None = None
        self.missing: str | None = None
        self.every = False  # a: every iteration of a long for_each, not its ends
        self.drawn = TimelineRows([])

    @property
    def crumb(self) -> str:
        return "timeline"

    def compose_body(self) -> ComposeResult:
        yield Static(id="timeline-header", classes="filters")
        with VerticalScroll(id="timeline-scroll"):
            yield Static(id="timeline", classes="log")

    async def load(self) -> None:
        try:
            self.run = await self.engine.get_run(self.run_id)
            self.missing = None
        except EngineError as error:
            self.missing = str(error)
        self.fold()

    def fold(self) -> None:
        """The rows to draw, once a read (not every second): a for_each of 2,000 items drew
        4,000 lines, a second and a half to open."""
        run = self.run
        self.drawn = TimelineRows([]) if run is None else timeline_rows(run, every=self.every)
        self.render_timeline()
        self.show_keys()

    @property
    def folded(self) -> bool:
        return bool(self.drawn.left_out)

    def key_applies(self, action: str) -> bool:
        if action == "every_step":  # only where something is left out, or was
            return self.every or self.folded
        return True

    def action_every_step(self) -> None:
        self.every = not self.every
        self.fold()

    def render_timeline(self) -> None:
        header = Text()
        if self.run is None:
            header.append(self.missing or "loading…", style="red1" if self.missing else "dim")
        else:
            run = self.run
            header.append_text(status_text(str(run.status)))
            header.append(f"  {printable(run.workflow_name)}", style="bold")
            header.append(f"  {run.id}", style="grey62")
        self.query_one("#timeline-header", Static).update(header, layout=False)
        if self.run is not None:
            width = self.query_one("#timeline", Static).size.width or self.size.width - 2
            drawn = timeline(self.run, self.blok.now(), width, self.drawn)
            self.query_one("#timeline", Static).update(drawn)

    def on_resize(self) -> None:
        self.render_timeline()

    def engine_changed(self, changes: Changes) -> None:
        if self.run_id in changes.runs or changes.everything:
            self.request_reload()

    def tick(self) -> None:
        if self.run is not None and not self.run.terminal:
            self.render_timeline()
