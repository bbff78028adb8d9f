"""The runs view: a live table of runs, newest first, paged from the store so that 100,000
runs open as fast as 100. `/` filters by text, 0-8 (or s) by status, retrying or stuck; enter
opens a run, c cancels it (after a confirmation), r replays it and opens the new run. Space
marks rows; C, R and D act on the marked rows, or on every run the filter matches, once per job.
A failed run whose job went on to another delivery says what became of the job (`↻ completed`),
and J opens the job's latest run."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, tzinfo
from typing import ClassVar

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.widgets import Static

from engine import (
    DatabaseError,
    EngineError,
    Job,
    JobState,
    Orphan,
    Run,
    RunFilter,
    RunStatus,
    WaitReason,
)

from . import actions
from .actions import RUN_FLAGS, STATUS_FILTERS
from .base_screen import BlokScreen, Changes
from .bulk import BulkPlan, plan_for_runs
from .console import (
    clock_time,
    countdown,
    day_time,
    duration,
    local_times,
    printable,
    short_ids,
    status_text,
)
from .jobs import ORPHANED, RETRIED_AFTER, orphaned_text, then_text
from .phrases import Phrase, fits, fitted, phrase
from .run_screen import PANEL_GATES
from .step_order import GOING, run_ms, time_runs_to
from .tracebacks import clean_error
from .widgets import FilterInput
from .widgets.row_table import Column, RowTable

WHY_TTL_S = 2.0  # a held run's "why" in the preview is read again after this long
PAGE = 100  # rows held in the table; the window slides as the cursor reaches an edge
READ_PAGE = 1_000  # runs read at a time when a bulk action takes every run the filter matches
PLAN_NOTICE = 2_000  # runs the filter matches from which planning says it is reading them
MARK = "●"
# The "then" of a dead job's last run (its own row, not a later delivery's "↻").
DEAD_LETTER = Text("dead letter", style="magenta")
DISCARDED = Text("discarded", style="grey62")
# Narrow terminals drop the lowest priorities first; the workflow column takes spare room.
COLUMNS = (
    Column("mark", "", 1, priority=9),
    Column("status", "status", 11, priority=10),
    # What the run's job did after it, for a run its job outlived (shown when a row has it).
    Column("then", "then", 11, priority=6),
    Column("run", "run", 12, priority=9),
    Column("workflow", "workflow", 16, priority=8),
    Column("version", "version", 8, priority=2),
    Column("queue", "queue", 10, priority=3),
    # Which worker ran it (`worker_labels`), shown only when the page's runs name two or more:
    # with workers on several machines, which one a failing run was on is the first question.
    # The first to go where the room runs out: the error or input says more.
    Column("worker", "worker", 6, priority=-1),
    Column("started", "started", 11, priority=6),
    Column("took", "took", 7, priority=7, justify="right"),
    Column("attempts", "attempts", 9, priority=5, justify="right"),
    Column("replay of", "replay of", 12, priority=1),
    Column("detail", "error or input", 16, priority=0, flex=True, keeps_place=True),
)
COLUMN_KEYS = [c.key for c in COLUMNS]
ID_COLUMNS = ("run", "replay of")  # short ids: as wide as the longest on the page
WORKER_WIDTH = 24  # at most: a long host name is cut, its start (what tells hosts apart) kept


def worker_labels(ids: Iterable[str]) -> dict[str, str]:
    """Each worker id (host:pid:tag) as short as tells the page's workers apart: the pid where
    they share a host (the whole id took a quarter of the row at 140 columns and squeezed the
    error to a few words), host:pid where they do not, the whole id where that is not enough
    (two engines in one process) or it is not an id of this engine's making."""
    parts = {worker: worker.split(":") for worker in set(ids)}
    whole = {worker: worker for worker in parts}
    if any(len(p) != 3 for p in parts.values()):
        return whole
    one_host = len({host for host, _, _ in parts.values()}) == 1
    labels = {w: pid if one_host else f"{host}:{pid}" for w, (host, pid, _) in parts.items()}
    return labels if len(set(labels.values())) == len(labels) else whole


class RunsTable(RowTable):
    """The runs table, whose id columns widen to the page's longest short id: a short id is
    the shortest prefix that tells a run from the others on the page, and one cut by its
    column ("1a249ead914…" on many rows of an `enqueue_many`) tells nothing and can't be
    typed into `:run`."""

    def fit_ids(self, width: int, worker_width: int = 0) -> None:
        """The id columns `width` wide and the worker's `worker_width` (up to WORKER_WIDTH), or
        as COLUMNS has them when that is more."""

        def widened(column: Column) -> Column:
            if column.key in ID_COLUMNS:
                return replace(column, width=max(column.width, width))
            if column.key == "worker":
                return replace(column, width=max(column.width, min(worker_width, WORKER_WIDTH)))
            return column

        columns = [widened(column) for column in COLUMNS]
        if columns != self.columns:
            self.columns = columns
            self._layout_width = -1  # lay out again at the next draw
            self._strips.clear()
            self.refresh()


def error_line(run: Run, tz: tzinfo | None) -> str:
    """The first line of the run's error, its moments in the console's clock."""
    first = (run.error or "").strip().partition("\n")[0].rstrip()  # of 5 MB: no line copied
    return local_times(clean_error(first), tz)


def started_cell(run: Run, tz: tzinfo | None, now: datetime) -> Text:
    """When the run started. One not started yet shows since when it waits (its creation),
    said so: a bare time there read as its start. One that ended without starting (cancelled
    while queued) has no start to show."""
    if run.started_at is not None:
        return Text(day_time(run.started_at, tz, now))
    if run.terminal:
        return Text("–", style="grey50")
    if run.status is RunStatus.DELAYED and run.run_at is not None:
        # When it may start (a retry's backoff, a delay given): "since" its creation read as
        # how long it had been waiting for a slot.
        return Text(f"at {_clock_or_day(run.run_at, tz, now, '%H:%M:%S')}", style="grey50")
    return Text(f"since {_clock_or_day(run.created_at, tz, now, '%H:%M')}", style="grey50")


def _clock_or_day(moment: datetime, tz: tzinfo | None, now: datetime, clock: str) -> str:
    """`moment` by the clock (`clock`, a strftime format) on the day of `now`, else by its
    date (mm-dd)."""
    local = moment.astimezone(tz)
    return local.strftime(clock if local.date() == now.astimezone(tz).date() else "%m-%d")


def detail_cell(run: Run, tz: tzinfo | None) -> Text:
    """What a wide terminal has room for: the first line of the error, else the input."""
    if run.error:
        return Text(error_line(run, tz), style="red1")
    return Text(
        printable(json.dumps(run.input, ensure_ascii=False, default=str)[:200]), style="grey50"
    )


class RunsScreen(BlokScreen):
    SCOPE: ClassVar[str] = actions.RUNS
    BINDINGS: ClassVar[list[BindingType]] = actions.bindings(actions.RUNS)

    def __init__(
        self,
        *,
        status: str = "all",
        queue: str | None = None,
        workflow: str | None = None,
        text: str = "",
    ) -> None:
        super().__init__()
        self.status_name = status
        self.queue = queue
        self.workflow = workflow
        self.text = text
        self.marked: dict[str, Run] = {}  # run id → the run, in the order marked
        self.start = 0
        self.total = 0
        self.runs: list[Run] = []
        self.short: dict[str, str] = {}  # run id → its shortest unique prefix on this page
        self.worker_names: dict[str, str] = {}  # worker id → its label on this page
        self.fates: dict[str, Job] = {}  # run id → its job, for runs their job outlived
        self.orphans: dict[str, Orphan] = {}  # run id → nobody runs it, for running runs
        self.last_of: dict[str, Job] = {}  # run id → its dead (or discarded) job, its last run
        self.loaded = False  # the first page is on screen (the benchmark waits for this)
        self.read = False  # the engine answered a first read (rendered with it)
        self.planning = False  # a bulk action's plan is being read
        # Why a held run waits (a gate, a pause), for the preview: run id → (the answer, when
        # read on the monotonic clock), read for the highlighted run only.
        self.whys: dict[str, tuple[WaitReason | None, float]] = {}

    @property
    def crumb(self) -> str:
        parts = ["runs"]
        if self.queue:
            parts.append(self.queue)
        if self.workflow:
            parts.append(self.workflow)
        if self.status_name != "all":
            parts.append(self.status_name)
        return " ".join(parts)

    def compose_body(self) -> ComposeResult:
        yield Static(id="filters", classes="filters")
        yield FilterInput(
            "filter runs: run or job id, workflow, version, queue, status, error, input…"
        )
        yield RunsTable(COLUMNS, id="runs")
        yield Static(id="preview")

    @property
    def table(self) -> RunsTable:
        return self.query_one("#runs", RunsTable)

    def on_mount(self) -> None:
        super().on_mount()
        self.table.focus()

    @property
    def retrying(self) -> bool:
        """The "retrying" filter: only runs still going with a failed attempt behind them."""
        return RUN_FLAGS.get(self.status_name, {}).get("retrying", False)

    @property
    def stuck(self) -> float | None:
        """The "stuck" filter: only runs running longer than this × their workflow's median."""
        return RUN_FLAGS.get(self.status_name, {}).get("stuck")

    @property
    def where(self) -> RunFilter:
        """The status, queue and workflow chosen, and the `/` text: the engine matches it in
        the id, job id, workflow, version, queue, status, error and input of every run (this
        view read the newest 1,000 and matched them itself: an order's run older than that was
        not found)."""
        statuses = STATUS_FILTERS[self.status_name] or None
        return RunFilter.of(
            statuses,
            self.workflow,
            self.queue,
            self.text or None,
            retrying=self.retrying,
            stuck=self.stuck,
        )

    def describe_filter(self) -> str:
        """The filter in words, for a confirmation: "failed runs on orders matching 'x'"."""
        words = ["every"]
        if self.status_name != "all":
            words.append(self.status_name)
        words.append("run")
        if self.queue:
            words.append(f"on {self.queue}")
        if self.workflow:
            words.append(f"of {self.workflow}")
        if self.text:
            words.append(f"matching {self.text!r}")
        return " ".join(words)

    async def load(self) -> None:
        where = self.where
        self.total = await self.engine.count_runs(where)
        if self.start >= self.total:
            self.start = max(0, self.total - PAGE)
        self.runs = await self._page(where, PAGE, self.start)
        self.fates, self.orphans = await self.blok.jobs.outlook(self.engine, self.runs)
        # The last run of a dead (or discarded) job: the row an operator acts on was the one
        # with a blank "then", where its earlier deliveries read "↻ dead". (Read with the
        # fates above: from the book, no second read.)
        failed = [run for run in self.runs if str(run.status) in RETRIED_AFTER]
        jobs = await self.blok.jobs.read(self.engine, (run.job_id for run in failed))
        self.last_of = {
            run.id: job
            for run in failed
            if (job := jobs.get(run.job_id)) is not None
            and job.run_id == run.id
            and (job.state is JobState.DEAD or job.meta.get("discarded"))
        }
        self.read = True
        self.render_rows()
        self.loaded = True

    async def _page(self, where: RunFilter, limit: int, offset: int) -> list[Run]:
        return await self.engine.runs(
            status=list(where.status) if where.status else None,
            workflow=self.workflow,
            queue=self.queue,
            limit=limit,
            offset=offset,
            text=where.text,
            retrying=self.retrying,
            stuck=self.stuck,
        )

    def row_cells(self, run: Run) -> list[Text | str]:
        now = self.blok.now()
        tz = self.blok.tz
        # Three fields of fixed width, blank when nothing to say, so that each lines up from
        # row to row ("4 3✗ j3" over "1" had read as one ragged column).
        attempts = Text(f"{run.attempts or '·':>2}", justify="right")
        failed = f" {run.failed_attempts:>2}✗" if run.failed_attempts else "    "
        attempts.append(failed, style="red1")
        attempts.append(f" j{run.job_attempt}" if run.job_attempt > 1 else "   ", style="khaki3")
        orphan = self.orphans.get(run.id)
        # "–" for a run a worker's stop sent back to the queue; an orphan's stops when its
        # worker was last seen.
        took = run_ms(run, time_runs_to(run, now, orphan))
        short = self.short
        fate = self.fates.get(run.id)
        then: Text | str = ""
        if fate is not None:
            then = then_text(fate)
        elif orphan is not None:
            then = ORPHANED
        elif run.id in self.last_of:
            then = DISCARDED if self.last_of[run.id].state is JobState.CANCELLED else DEAD_LETTER
        return [
            Text(MARK if run.id in self.marked else " ", style="bold khaki1"),
            status_text(str(run.status)),
            then,
            Text(short.get(run.id, run.id), style="grey85"),
            printable(run.workflow_name),
            Text(run.workflow_version[:8], style="grey62"),
            run.queue,
            Text(printable(self.worker_names.get(run.worker or "", "")), style="grey62"),
            started_cell(run, tz, now),
            Text(duration(took) if took is not None else "–", justify="right"),
            attempts,
            Text(
                short.get(run.replay_of, run.replay_of) if run.replay_of else "",
                style="medium_purple1",
            ),
            detail_cell(run, tz),
        ]

    def render_rows(self) -> None:
        ids = [run.id for run in self.runs]
        self.short = short_ids([*ids, *(r.replay_of for r in self.runs if r.replay_of)])
        self.worker_names = worker_labels(run.worker for run in self.runs if run.worker)
        self.table.fit_ids(
            max(map(len, self.short.values()), default=0),
            max(map(cell_len, map(printable, self.worker_names.values())), default=0),
        )
        # Columns empty on every row of the page give their room to the error or input; the
        # worker's says something only where the page's runs ran on two workers or more.
        empty = [] if self.fates or self.orphans or self.last_of else ["then"]
        if not any(run.replay_of for run in self.runs):
            empty.append("replay of")
        if len(self.worker_names) < 2:
            empty.append("worker")
        self.table.hide_columns(empty)
        self.table.set_rows([(run.id, self.row_cells(run)) for run in self.runs])
        self.render_filters()
        self.render_preview()

    def render_filters(self) -> None:
        # One line (drawn without a new layout): the nine statuses where the whole line fits
        # with them, else only the chosen one; then, where it still does not fit, what says
        # least goes first, whole. With runs marked, the bulk keys (not in the footer) stay
        # longer than the page and the status keys.
        width = self.line_width
        rest = self.filter_phrases()
        every = self.status_choice(every=True)
        if width >= 110 and fits([*every, *rest], width):
            line = fitted([*every, *rest], width)
        else:
            line = fitted([*self.status_choice(every=False), *rest], width)
        self.query_one("#filters", Static).update(line, layout=False)

    def status_choice(self, *, every: bool) -> list[Phrase]:
        """The status filters with their keys (`every`), or the chosen one and how to change
        it."""
        if not every:
            chosen = Text.assemble(("status ", "dim"), (self.status_name, "bold"))
            return [Phrase(chosen, keep=9), phrase("(0-8, s)", "dim", gap=" ", keep=3)]
        statuses = Text()
        for n, name in enumerate(STATUS_FILTERS):
            chosen_one = name == self.status_name
            statuses.append(f" {n} ", style="reverse bold" if chosen_one else "bold dim")
            statuses.append(f"{name} ", style="bold" if chosen_one else "dim")
        return [Phrase(statuses, keep=9)]

    def filter_phrases(self) -> list[Phrase]:
        """The filter line after the statuses: the search, the marks, the page."""
        phrases: list[Phrase] = []
        if self.text:
            search = Text.assemble(("/ ", "bold"), (self.text, "khaki1"))
            phrases.append(Phrase(search, keep=8))
            phrases.append(phrase("esc clears", "dim", keep=1))
        if self.marked:
            marked = f"{MARK} {len(self.marked):,} marked"
            phrases.append(phrase(marked, "bold khaki1", gap="   ", keep=8))
            hint = "C cancel · R replay · D requeue · u unmark"
            phrases.append(phrase(hint, "khaki3", keep=5))
        shown = len(self.runs)
        if shown:
            page = f"{self.start + 1:,}–{self.start + shown:,} of {self.total:,}"
            phrases.append(phrase(page, "bold", gap="   ", keep=4))
        elif not self.read:  # not "no runs yet" while the first read waits (an outage)
            phrases.append(phrase("reading…", "dim", gap="   ", keep=7))
        elif self.total == 0:
            filtered = self.text or self.status_name != "all"
            hint = "no runs match" if filtered else "no runs yet: i injects a job"
            phrases.append(phrase(hint, "dim", gap="   ", keep=7))
        return phrases

    def on_resize(self) -> None:
        self.render_filters()  # nine status names, or only the chosen one

    def selected_run_id(self) -> str | None:
        return self.table.cursor_key

    def engine_changed(self, changes: Changes) -> None:
        if changes.runs or changes.everything:
            self.request_reload()

    def tick(self) -> None:
        # Durations of running runs grow without any event: redraw just those cells.
        if not self.query("#runs"):
            return  # the view is being torn down (or not composed yet)
        for run in self.runs:
            if run.started_at is not None and str(run.status) in GOING:
                self.table.update_row(run.id, self.row_cells(run))

    # ---- paging ----------------------------------------------------------------------------
    def render_preview(self) -> None:
        """One glance at the highlighted run without opening it: its error, else its input."""
        run = next((r for r in self.runs if r.id == self.selected_run_id()), None)
        text = Text()
        if run is not None:
            text.append(f"{run.id}  ", style="bold")
            text.append(f"job {run.job_id}  priority {run.priority}", style="grey62")
            text.append("\n")
            fate = self.fates.get(run.id)
            if fate is not None:
                shown = short_ids([run.id, fate.run_id])[fate.run_id]
                text.append_text(then_text(fate, long=True, shown_id=shown))
                text.append("  J opens it  ", style="grey50")
            orphaned = self.orphans.get(run.id)
            if orphaned is not None:
                text.append_text(orphaned_text(orphaned, self.blok.tz))
                text.append("  ")
            held = str(run.status) in ("delayed", "throttled", "queued") and run.run_at
            why = self.why_of(run) if held else None
            if why is not None:
                # A gate holds it (a concurrency key's slots, a rate limit, a pause): which,
                # and until when, where the status alone read as an ordinary backoff.
                summary = local_times(clean_error(why.summary), self.blok.tz, self.blok.now())
                gate = why.gate.replace("_", " ")
                text.append(f"{run.status} [{gate}] ", style="khaki3")
                text.append(f"{summary.removeprefix(f'{gate}: ')}  ", style="khaki3")
            elif held and run.run_at is not None:
                now, tz = self.blok.now(), self.blok.tz
                text.append(
                    f"{run.status} until {clock_time(run.run_at, tz)} "
                    f"({countdown(run.run_at, now)})  ",
                    style="khaki3",
                )
            if run.error:
                text.append(error_line(run, self.blok.tz), style="red1")
            else:
                text.append("input ", style="grey62")
                text.append(printable(json.dumps(run.input, ensure_ascii=False, default=str)[:400]))
        self.query_one("#preview", Static).update(text, layout=False)

    def why_of(self, run: Run) -> WaitReason | None:
        """Why a held run waits, as last read (a gate's own, else None); a read is started
        when there is none yet, or it is older than `WHY_TTL_S`: the preview redraws then."""
        known = self.whys.get(run.id)
        if known is None or time.monotonic() - known[1] > WHY_TTL_S:
            self.whys[run.id] = (known[0] if known else None, time.monotonic())
            self.run_worker(self._read_why(run.id), group="why", exclusive=True)
        why = known[0] if known else None
        return why if why is not None and why.gate in PANEL_GATES else None

    async def _read_why(self, run_id: str) -> None:
        try:
            why = await self.engine.why_waiting(run_id)
        except (EngineError, DatabaseError):
            why = None  # the preview is a help: the run's row says its status
        self.whys = {run_id: (why, time.monotonic())}  # only the highlighted run's is kept
        if self.selected_run_id() == run_id and not self.closing:
            self.render_preview()

    def on_row_table_highlighted(self, event: RowTable.Highlighted) -> None:
        table = self.table
        if event.table is not table or event.row != table.cursor_row:
            return  # a stale event from before the last redraw
        self.render_preview()
        last = table.row_count - 1
        if event.row == last and self.start + table.row_count < self.total:
            self.start += PAGE // 2
            self.request_reload()
        elif event.row == 0 and self.start > 0:
            self.start = max(0, self.start - PAGE // 2)
            self.request_reload()

    def action_first_page(self) -> None:
        self.start = 0
        self.request_reload()
        self.table.move_cursor(0)

    def action_last_page(self) -> None:
        self.start = max(0, self.total - PAGE)
        self.request_reload()
        self.table.move_cursor(PAGE)

    # ---- filters ---------------------------------------------------------------------------
    def action_status(self, name: str) -> None:
        self.status_name = name
        self.start = 0
        self.show_chrome()
        self.request_reload()

    def action_cycle_status(self) -> None:
        names = list(STATUS_FILTERS)
        self.action_status(names[(names.index(self.status_name) + 1) % len(names)])

    def action_filter(self) -> None:
        box = self.query_one(FilterInput)
        box.value = self.text
        box.open()

    def on_input_changed(self, event: FilterInput.Changed) -> None:
        self.text = event.value.strip()
        self.start = 0
        self.request_reload()

    def on_filter_input_done(self, event: FilterInput.Done) -> None:
        self.text = event.value.strip()
        self.request_reload()
        self.table.focus()

    def clear_filter(self) -> bool:
        if not self.text:
            return False
        self.query_one(FilterInput).action_drop()
        return True

    # ---- actions ---------------------------------------------------------------------------
    def on_row_table_selected(self, event: RowTable.Selected) -> None:
        event.stop()
        self.action_open_run()

    def action_open_run(self) -> None:
        run_id = self.selected_run_id()
        if run_id is not None:
            self.blok.open_run(run_id)

    def action_cancel_run(self) -> None:
        run = next((r for r in self.runs if r.id == self.selected_run_id()), None)
        self.confirm_cancel(run, self.orphans.get(run.id) if run is not None else None)

    async def action_replay_run(self) -> None:
        run_id = self.selected_run_id()
        if run_id is not None:
            await self.blok.replay(run_id)

    def selected_run(self) -> Run | None:
        return next((r for r in self.runs if r.id == self.selected_run_id()), None)

    def action_open_later(self) -> None:
        run = self.selected_run()
        if run is None:
            return
        fate = self.fates.get(run.id)
        if fate is None:
            self.notify(
                f"run {run.id} is its job's latest run: no later delivery to open",
                severity="warning",
            )
            return
        self.blok.open_run(fate.run_id)

    def action_copy_id(self) -> None:
        run_id = self.selected_run_id()
        if run_id is not None:
            self.blok.copy_id(run_id)

    def action_edit_replay(self) -> None:
        run = self.selected_run()
        if run is not None:
            self.blok.edit_and_replay(run)

    def action_where(self) -> None:
        run_id = self.selected_run_id()
        if run_id is not None:
            self.blok.ask_where(run_id)

    async def action_retry_now(self) -> None:
        run_id = self.selected_run_id()
        if run_id is not None and await self.blok.retry_now(run_id):
            self.request_reload()

    # ---- marks and bulk actions ------------------------------------------------------------
    def action_toggle_mark(self) -> None:
        run = self.selected_run()
        if run is None:
            return
        if self.marked.pop(run.id, None) is None:
            self.marked[run.id] = run
        self.table.update_row(run.id, self.row_cells(run))
        self.render_filters()
        # Marking row after row: space moves on, as in a file manager.
        if self.table.cursor_row < self.table.row_count - 1:
            self.table.move_cursor(self.table.cursor_row + 1)

    def action_clear_marks(self) -> None:
        self.marked.clear()
        self.render_rows()

    async def _plan(self, action: str) -> BulkPlan:
        """The marked runs, else every run the filter (and the search) matches; once per
        job."""
        if self.marked:
            n = len(self.marked)
            runs, chosen = (
                list(self.marked.values()),
                f"the {n:,} marked run{'s' if n != 1 else ''}",
            )
        else:
            runs, chosen = await self._every_match(), self.describe_filter()
        return await plan_for_runs(
            self.engine, self.blok.jobs, action, runs, chosen, everything=not self.marked
        )

    async def _every_match(self) -> list[Run]:
        """Every run the status, queue, workflow and search chosen match, newest first (paged;
        a run that a new one pushed onto the next page is counted once)."""
        where = self.where
        found: dict[str, Run] = {}
        offset = 0
        while True:
            chunk = await self._page(where, READ_PAGE, offset)
            for run in chunk:
                found.setdefault(run.id, run)
            if len(chunk) < READ_PAGE:
                return list(found.values())
            offset += READ_PAGE

    def _bulk_done(self) -> None:
        self.marked.clear()
        self.request_reload()

    def action_bulk_cancel(self) -> None:
        self._ask("cancel")

    def action_bulk_replay(self) -> None:
        self._ask("replay")

    def action_bulk_requeue(self) -> None:
        self._ask("requeue")

    @property
    def idle(self) -> bool:
        return super().idle and not self.planning

    def _ask(self, action: str) -> None:
        """Plan the action off the input path (10,000 runs take a second or so to read, with
        their jobs), then ask. A second press while planning is not a second plan."""
        if self.planning:
            self.notify("still reading the runs for the bulk action asked for", severity="warning")
            return
        self.planning = True
        self.run_worker(self._plan_and_ask(action), group="plan")

    async def _plan_and_ask(self, action: str) -> None:
        try:
            if not self.marked and not self.text and self.total > PLAN_NOTICE:
                self.notify(
                    f"reading the {self.total:,} runs the filter matches, to act once per job…"
                )
            plan = await self._plan(action)
        except (EngineError, DatabaseError) as error:
            self.notify(str(error), title=f"Bulk {action} not planned", severity="error")
            return
        finally:
            self.planning = False
        if action == "cancel":
            detail = "Runs that have already ended are skipped; the others are interrupted and "
            detail += "not retried."
        elif action == "replay":
            detail = "Each starts again as a new run with the same input; runs still going are "
            detail += "skipped."
        else:
            detail = "Each goes back in its queue with a fresh run and its retry budget again: "
            detail += f"{plan.budget}."
        self.blok.confirm_bulk(plan, detail, self._bulk_done)
