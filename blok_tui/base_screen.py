"""What every view of the console shares: breadcrumbs, the reload and database banners, the
footer, going back with escape, and reloading from the engine without piling up queries."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.css.query import NoMatches
from textual.screen import Screen

from engine import DatabaseError, EngineError, RunStatus
from engine.api import EngineAPI

from . import actions
from .confirm_screen import ConfirmScreen
from .console import printable
from .widgets import BulkBar, Crumbs, DatabaseBanner, FilterInput, ReloadBanner
from .widgets.key_bar import Key, KeyBar
from .widgets.row_table import RowTable

if TYPE_CHECKING:
    from engine import Orphan, Run

    from .app import BlokApp


# How long a key stays in a narrow footer: the essential ones (back, the command line, help:
# help lists every key) the longest, then the view's keys from the left (those the view says
# it asks for now among the essential ones), then the app's (quit), the palette last.
ESSENTIAL = 2
PALETTE = -1
ESSENTIAL_KEYS = ("colon", "question_mark")


@dataclass
class Changes:
    """What the engine's events touched since the views last looked (coalesced)."""

    runs: set[str] = field(default_factory=set)  # run ids
    queues: set[str] = field(default_factory=set)  # queue names whose counts moved
    queue_list: bool = False  # queues added, removed, paused or re-configured
    everything: bool = False  # events were lost (Lagged): re-read all
    logs: bool = False  # log lines arrived (the app keeps the newest for the live log view)

    def __bool__(self) -> bool:
        return bool(self.runs or self.queues or self.queue_list or self.everything or self.logs)

    def add(self, other: Changes) -> None:
        """Take in `other`'s changes too (those a view could not be told yet)."""
        self.runs |= other.runs
        self.queues |= other.queues
        self.queue_list |= other.queue_list
        self.everything |= other.everything
        self.logs |= other.logs


class BlokScreen(Screen[None]):
    SCOPE: ClassVar[str] = ""
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "back", show=True),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._loading = False
        self._again = False

    @property
    def blok(self) -> BlokApp:
        # Textual types every node's `app` as App[object] (a screen is not generic over its
        # app's class); these screens are only ever pushed by a BlokApp.
        return self.app  # type: ignore[return-value]

    @property
    def engine(self) -> EngineAPI:
        return self.blok.opened_engine  # the app shows views once its engine is open

    @property
    def line_width(self) -> int:
        """The cells of a line that spans the view (its lines are padded 1 a side)."""
        return self.size.width - 2

    @property
    def crumb(self) -> str:
        return self.SCOPE

    def crumb_among(self, trail: list[BlokScreen]) -> str:
        """This view's crumb in the breadcrumbs of `trail` (the views open, oldest first): a
        view that names a thing says enough of it to tell it from the others' things."""
        return self.crumb

    def compose(self) -> ComposeResult:
        yield Crumbs()
        yield ReloadBanner()
        yield DatabaseBanner()
        yield from self.compose_body()
        yield BulkBar()
        yield KeyBar()

    def compose_body(self) -> ComposeResult:
        yield from ()

    def on_mount(self) -> None:
        self.show_chrome()

    def on_screen_resume(self) -> None:
        # Also sent when the screen is first pushed: the one place a view starts reading.
        self.show_chrome()
        self.request_reload()

    def show_chrome(self) -> None:
        self.show_crumbs()
        self.show_reload_errors(self.blok.reload_errors)
        self.show_keys()

    def show_crumbs(self) -> None:
        stack = [s for s in self.app.screen_stack if isinstance(s, BlokScreen)]
        # The views up to this one: one under another may redraw its own (after a read).
        trail = stack[: stack.index(self) + 1] if self in stack else stack
        crumbs = [s.crumb_among(trail) for s in trail]
        self.query_one(Crumbs).show(self.blok.title, crumbs, self.blok.where)

    def show_keys(self) -> None:
        """The key bar: back (when there is somewhere to go back to), this view's keys, then
        the app's; `? help` and the palette pinned at the right. Where they do not all fit,
        the essential ones stay (see `_fitting`)."""
        keys: list[tuple[Key, int]] = []
        if len([s for s in self.app.screen_stack if isinstance(s, BlokScreen)]) > 1:
            keys.append((("esc", "back", "screen.back"), ESSENTIAL))
        for entry in actions.in_scope(self.SCOPE):
            if entry.key and entry.label and self.key_applies(entry.action):
                key = (entry.key_display, entry.label, f"screen.{entry.action}")
                rank = ESSENTIAL if entry.key in ESSENTIAL_KEYS else self.key_rank(entry.action)
                keys.append((key, rank))
        pinned: list[tuple[Key, int]] = []
        for entry in actions.in_scope(actions.APP):
            if not (entry.key and entry.label):
                continue
            key = (entry.key_display, entry.label, f"app.{entry.action}")
            rank = ESSENTIAL if entry.key in ESSENTIAL_KEYS else 0
            (pinned if entry.action == "help" else keys).append((key, rank))
        pinned.append((("^p", "palette", "app.command_palette"), PALETTE))
        # The bar's text width: the screen's, less the bar's padding and its own margin.
        width = self.size.width - 4 if self.size.width else None
        kept = _fitting([*keys, *pinned], width)
        bar = self.query_one(KeyBar)
        bar.show([k for k, _ in keys if k in kept], [k for k, _ in pinned if k in kept])

    def key_rank(self, action: str) -> int:
        """How long this view's `action` stays in a narrow footer: ESSENTIAL for what the view
        shows now asks for (a run waiting for an event: send it), else 0."""
        return 0

    def key_applies(self, action: str) -> bool:
        """Whether the footer offers this view's `action` just now (every key stays bound;
        the footer shows only those that would do something)."""
        return True

    def show_reload_errors(self, errors: dict[str, str]) -> None:
        self.query_one(ReloadBanner).show_errors(errors)

    def show_out_of_reach(self, since: datetime | None) -> None:
        """The database's outage, if it is in one (the app asks every second)."""
        self.query_one(DatabaseBanner).show_since(since, self.blok.now(), self.blok.tz)

    def on_resize(self) -> None:
        self.show_chrome()

    # ---- loading ---------------------------------------------------------------------------
    def request_reload(self) -> None:
        """Re-read from the engine; a request while a read is in flight runs once after it."""
        if self._loading:
            self._again = True
            return
        self._loading = True
        self.run_worker(self._reload_loop(), group="reload")

    async def _reload_loop(self) -> None:
        try:
            while True:
                self._again = False
                try:
                    await self.load()
                except NoMatches:
                    if not self.closing:
                        raise
                    return  # the view was closed while it read: nothing left to draw
                except (EngineError, DatabaseError) as error:
                    # The engine refused or the database is unreachable (an attached console
                    # whose worker went away): say so and keep the last picture on screen.
                    self.notify(
                        str(error), title="Could not read from the engine", severity="error"
                    )
                    return
                if not self._again:
                    return
        finally:
            self._loading = False

    @property
    def open(self) -> bool:
        """Still on the screen stack (a popped view's widgets are being torn down)."""
        return self in self.app.screen_stack

    @property
    def closing(self) -> bool:
        """Popped, or being torn down with the app: its widgets may already be gone. (Textual
        has no public flag for a node being pruned, hence the private ones.)"""
        torn = self._closing or self._closed or self._pruning
        return torn or not self.open or bool(getattr(self.app, "_exit", False))

    @property
    def idle(self) -> bool:
        """No read in flight or pending (tests wait for this instead of sleeping)."""
        return not self._loading

    async def load(self) -> None:
        """Read what the view shows from the engine and render it."""

    def engine_changed(self, changes: Changes) -> None:
        """Called at most every ~100 ms with what moved; views decide whether to re-read."""

    def tick(self) -> None:
        """Called every second: redraw what depends on the clock (durations, countdowns)."""

    def confirm_cancel(self, run: Run | None, orphaned: Orphan | None = None) -> None:
        """Ask before cancelling `run` (the one key every run view shares), then cancel it.
        `orphaned`: why nobody runs it (its worker is gone), when the view knows."""
        if run is None:
            return
        if run.terminal:
            self.notify(f"run {run.id} has already ended ({run.status})", severity="warning")
            return

        async def answer(yes: bool | None) -> None:
            if yes:
                await self.blok.cancel_run(run.id)
                self.request_reload()

        self.app.push_screen(
            ConfirmScreen(
                f"Cancel run [b]{run.id}[/b]?",
                f"{printable(run.workflow_name)} on {printable(run.queue)}, {run.status}. "
                f"{_what_a_cancel_stops(run, orphaned)}; the job is not retried.",
                confirm="Cancel run",
            ),
            answer,
        )

    def clear_filter(self) -> bool:
        """Drop an active text filter; False when there is none. The first escape does this,
        the next goes back."""
        return False

    def action_key_elsewhere(self, key: str) -> None:
        """A key another view binds, typed here: where it acts (actions.bindings)."""
        self.notify(actions.where_key_acts(key, self.SCOPE), timeout=4)

    def action_back(self) -> None:
        if self.clear_filter():
            return
        if len([s for s in self.app.screen_stack if isinstance(s, BlokScreen)]) > 1:
            self.app.pop_screen()


class RowFilterScreen(BlokScreen):
    """A view that filters the rows it has loaded by the text typed after `/`, as it is typed.
    It sets `text`, then calls `render_rows()`; subclasses provide both and a `table`."""

    text: str

    @property
    def table(self) -> RowTable:
        raise NotImplementedError

    def render_rows(self) -> None:
        raise NotImplementedError

    def action_filter(self) -> None:
        self.query_one(FilterInput).open()

    def on_input_changed(self, event: FilterInput.Changed) -> None:
        self.text = event.value
        self.render_rows()

    def on_filter_input_done(self, event: FilterInput.Done) -> None:
        self.text = event.value
        self.render_rows()
        self.table.focus()

    def clear_filter(self) -> bool:
        if not self.text:
            return False
        self.query_one(FilterInput).action_drop()
        return True


def _fitting(keys: list[tuple[Key, int]], width: int | None) -> list[Key]:
    """The keys that fit in `width` cells as the key bar draws them ("q quit  "), in their
    order: the highest ranked first, then, among equals, from the left, each that still fits.
    The bar itself cuts from the right, and a 60-column terminal lost `: command`, `/ filter`
    and `q quit` (the app's keys come last) while it kept `d dead letters`."""
    if width is None:
        return [key for key, _ in keys]

    def cells(key: Key) -> int:
        return len(key[0]) + len(key[1]) + 3

    chosen: set[int] = set()
    used = 0
    for n, (key, _) in sorted(enumerate(keys), key=lambda item: (-item[1][1], item[0])):
        if used + cells(key) <= width:
            chosen.add(n)
            used += cells(key)
    return [key for n, (key, _) in enumerate(keys) if n in chosen]


def _what_a_cancel_stops(run: Run, orphaned: Orphan | None) -> str:
    if orphaned is not None:
        return f"Nobody runs it now ({orphaned.why}): it is recorded cancelled at once"
    if run.status is RunStatus.RUNNING:
        # A sync node cannot be interrupted in its thread: said before, not after, the cancel.
        return (
            "Its current step is interrupted (a node written as a plain def runs on in its "
            "thread until it returns, and keeps its worker's slot till then)"
        )
    if run.status is RunStatus.WAITING:
        return "It does not go on from its wait"
    return "It never starts"
