"""The queues view: one row per queue with its counts, jobs/s and a sparkline of recent
throughput, and the recent failures, one line per job (a job retried three times failed once,
and one whose later delivery completed says so). Enter opens the queue's runs; d its dead
letters; p pauses or resumes it."""

from __future__ import annotations

import time
from datetime import datetime
from typing import ClassVar

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Static

from engine import EngineError, Job, JobState, QueueInfo, Run, RunFilter

from . import actions
from .base_screen import Changes, RowFilterScreen
from .console import count, day_time, printable, short_ids, status_text
from .jobs import RETRIED_AFTER, one_per_job, then_text
from .phrases import Phrase, fitted, phrase
from .plain_text import one_line_keeping_where, opening_and_end
from .queue_counts import QueueCounts, read_queue_counts, served_with
from .widgets import FilterInput, sparkline
from .widgets.row_table import Column, RowTable
from .workers_screen import workers_line

# The run statuses' own words (`queue_counts.py`, which `blok-tui queues` reads too): a job ready
# to be claimed is a "queued" run, a claimed one "running", and the delayed jobs are split into
# "waiting", "delayed" and "throttled", as the runs view says.
COLUMNS = (
    Column("queue", "queue", 14, priority=10, flex=True),
    Column("workflow", "workflow", 18, priority=3),
    Column("provider", "provider", 8, priority=1),
    Column("slots", "slots", 5, priority=2, justify="right"),
    Column("queued", "queued", 6, priority=9, justify="right"),
    Column("running", "running", 7, priority=9, justify="right"),
    Column("waiting", "waiting", 7, priority=7, justify="right"),
    Column("delayed", "delayed", 7, priority=7, justify="right"),
    Column("throttled", "throttled", 9, priority=5, justify="right"),
    Column("completed", "completed", 9, priority=8, justify="right"),
    Column("failed", "failed", 6, priority=8, justify="right"),
    # Above failed: a job out of retries is counted dead, not failed, so where the table
    # narrows, "failed ·" must not stay while the failures' count goes.
    Column("dead", "dead", 5, priority=9, justify="right"),
    # Runs that failed in the last ERRORS_WINDOW_S, retried ones too: with every job failing
    # and retried into the dead-letter queue, "failed" stayed "·" through the outage.
    Column("errors", "errors", 6, priority=8, justify="right"),
    Column("jobs/s", "jobs/s", 6, priority=6, justify="right"),
    Column("last 3 min", "last 3 min", 20, priority=4),
)


DEAD_HINT = "out of retries: counted as dead, not failed · d lists them"
FAILURES_SHOWN = 6  # jobs in "recent failures"
ERRORS_WINDOW_S = 180.0  # the errors column: failed runs this recent (the sparkline's 3 min)
FAILURES_READ = 40  # failed runs read to find them (a job may have failed several times)
# The failed runs are read again when the engine tells of a change, else at most this often:
# the view's tick each second read 40 whole records (each 25 MB where errors quoted a body).
FAILURES_EVERY_S = 10.0


def _right(value: str, style: str = "") -> Text:
    return Text(value, style=style, justify="right")


class QueuesScreen(RowFilterScreen):
    SCOPE: ClassVar[str] = actions.QUEUES
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", show=False),  # the first view: nowhere to go back to
        *actions.bindings(actions.QUEUES),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.text = ""
        self.infos: list[QueueInfo] = []
        self.counts: dict[str, QueueCounts] = {}
        self.errors: dict[str, int] = {}  # runs failed in the last ERRORS_WINDOW_S, per queue
        self.shown = 0  # queues the filter leaves in the table
        self.failures: list[Run] = []  # the recent failures as last read, one per job
        # time.monotonic() of that read; None: a run changed since (the engine told), read again
        self.failures_read_at: float | None = None

    @property
    def crumb(self) -> str:
        return "queues"

    def compose_body(self) -> ComposeResult:
        yield Static(id="summary", classes="filters")
        yield FilterInput("filter queues by name…")
        yield RowTable(COLUMNS, id="queues")
        yield Static(id="workers-line", classes="filters")
        yield Static("recent failures", classes="section", id="failures-title")
        yield Static(id="failures", classes="log")

    @property
    def table(self) -> RowTable:
        return self.query_one("#queues", RowTable)

    def on_mount(self) -> None:
        super().on_mount()
        self.table.focus()

    async def load(self) -> None:
        infos = await self.engine.queues()
        counts, errors = {}, {}
        since = self.blok.now().timestamp() - ERRORS_WINDOW_S
        for info in infos:
            try:
                counts[info.name] = (await read_queue_counts(self.engine, info.name))[1]
            except EngineError:  # removed by a reload between the two calls
                continue
            failed_lately = RunFilter(
                status=tuple(sorted(RETRIED_AFTER)), queue=info.name, finished_after=since
            )
            errors[info.name] = await self.engine.count_runs(failed_lately)
        workers = await self.engine.workers()
        states = {w.id: self.engine.worker_state(w) for w in workers}
        splits = await self.engine.version_splits()
        read_at = self.failures_read_at
        if read_at is None or time.monotonic() - read_at > FAILURES_EVERY_S:
            # Set before the read: a change told during it sets None, and reads again.
            self.failures_read_at = time.monotonic()
            failed = await self.engine.runs(status=sorted(RETRIED_AFTER), limit=FAILURES_READ)
            # When each failed, newest first: listed by their starts, a crash found at
            # 18:08:28 read 18:08:17, and the lines came out of order.
            failures = sorted(one_per_job(failed).runs, key=_failed_at, reverse=True)
            self.failures = failures[:FAILURES_SHOWN]
        failures = self.failures
        jobs = await self.blok.jobs.read(self.engine, (run.job_id for run in failures))
        # Everything read first, then drawn at once: the view may be gone after any await.
        if self.closing:
            return
        self.infos = [i for i in infos if i.name in counts]
        self.counts = counts
        self.errors = errors
        self.render_rows()
        shared = {info.name: info.workflow_names for info in infos if info.workflow_names}
        self.query_one("#workers-line", Static).update(
            workers_line(workers, states, splits=splits, shared=shared)
        )
        self.render_failures(failures, jobs)

    def render_rows(self) -> None:
        history = self.blok.throughput_history
        shown = [i for i in self.infos if self.text.lower() in i.name.lower()]
        self.shown = len(shown)
        rows = []
        for info in shown:
            c = self.counts[info.name]
            errors = self.errors.get(info.name, 0)
            samples = history.get(info.name, ())
            rate = samples[-1] if samples else 0.0
            name = Text(printable(info.name), style="bold")
            if info.paused:
                name.append("  ⏸ paused", style="khaki1")
            elif not info.served:  # its workers stopped: its jobs wait for the next one
                name.append("  ✗ no worker", style="dark_orange")
            cells: list[Text | str] = [
                name,
                Text(
                    printable(served_with(info, none="–")),
                    style="khaki1" if info.workflow_names else "grey70",
                ),
                info.provider,
                _right(str(info.concurrency)),
                _right(count(c.queued), "grey85"),
                _right(count(c.running), "bold deep_sky_blue1" if c.running else ""),
                _right(count(c.waiting), "khaki1"),
                _right(count(c.delayed), "khaki3"),
                _right(count(c.throttled), "dark_orange" if c.throttled else ""),
                _right(count(c.completed), "green3"),
                _right(count(c.failed), "red1" if c.failed else ""),
                _right(count(c.dead), "bold magenta" if c.dead else ""),
                _right(count(errors), "bold red1" if errors else ""),
                _right(f"{rate:.1f}" if rate else "·"),
                Text(sparkline(list(samples), width=20, bucket=9), style="green3"),
            ]
            rows.append((info.name, cells))
        self.table.set_rows(rows)
        self.render_summary()

    def render_summary(self) -> None:
        totals = sum(self.counts.values(), QueueCounts())
        line = Text()
        if not self.counts:  # counts of nothing would only push the hint off a narrow screen
            line.append("no queues", style="bold")
            line.append(
                ": add a workflow with a WorkerTrigger to the workflows folder", style="dim"
            )
            self.query_one("#summary", Static).update(line, layout=False)
            return
        queues = len(self.counts)
        # One line (it is drawn without a new layout): at a narrow width the least useful
        # phrases go, whole: the hint, then the filter (its text is on the line under it).
        counted = f"{queues} queue{'' if queues == 1 else 's'}"
        if self.text:  # the table shows only those the filter matches
            counted = f"{self.shown} of {counted}"

        def tally(n: int, what: str, keep: int, style: str = "", gap: str = " · ") -> Phrase:
            # A count of none goes before any count of some: at 80 columns "0 delayed" stayed
            # and "85 throttled" went, and the line said the backlog was empty.
            return phrase(f"{n:,} {what}", style, gap=gap, keep=keep if n else keep - 5)

        phrases = [
            phrase(counted, "bold", keep=9),
            tally(totals.queued, "queued", 8, gap="   "),
            tally(totals.running, "running", 8),
            tally(totals.waiting, "waiting", 6),
            tally(totals.delayed, "delayed", 5),
            tally(totals.dead, "dead", 7, "magenta" if totals.dead else ""),
        ]
        if totals.throttled:  # only when some are: the line is full on a narrow screen
            phrases.insert(5, tally(totals.throttled, "throttled", 5, "dark_orange"))
        if self.text and not self.shown:
            # Else an empty table under the counts of every queue, and nothing said. (Where
            # the line is short, "0 of 7 queues" says it.)
            nothing = f"no queue matches {self.text!r}: esc clears"
            phrases.append(phrase(nothing, "khaki1", gap="   ", keep=4))
        elif self.text:
            phrases.append(phrase(f"filter: {self.text!r}", "khaki1", gap="   ", keep=2))
        if self.size.width >= 100 and self.shown:
            phrases.append(phrase("enter: its runs", "dim", gap="   ", keep=1))
        self.query_one("#summary", Static).update(fitted(phrases, self.line_width), layout=False)

    def render_failures(self, runs: list[Run], jobs: dict[str, Job]) -> None:
        now, tz = self.blok.now(), self.blok.tz
        # A failure whose job is out of retries is in the dead column, not the failed one
        # (failed: ended without the dead-letter queue): where the list shows one, say so.
        dead = any((job := jobs.get(run.job_id)) and job.state is JobState.DEAD for run in runs)
        title = [phrase("recent failures", keep=1)]
        if dead:
            title.append(phrase(DEAD_HINT, "not bold dim", gap="   "))
        self.query_one("#failures-title", Static).update(fitted(title, self.line_width))
        text = Text()
        short = short_ids([run.id for run in runs])
        width = max(map(len, short.values()), default=0)  # the notes after them line up
        for n, run in enumerate(runs):
            text.append(day_time(_failed_at(run), tz, now), style="grey50")
            text.append("  ")
            text.append_text(status_text(str(run.status), label=False))
            text.append(f" {printable(run.workflow_name):<18.18} ", style="bold")
            text.append(f"{short[run.id]:<{width}}  ", style="grey62")
            text.append_text(job_note(run, jobs.get(run.job_id)))
            # Cut here, keeping its place at the end: the line's own cut took the file first.
            room = max(self.line_width - cell_len(text.plain[text.plain.rfind("\n") + 1 :]), 1)
            first = (run.error or "").partition("\n")[0]  # not a copy of each line of 5 MB
            error = printable(opening_and_end(first, room))
            text.append(one_line_keeping_where(error, room), style="red1")
            if n < len(runs) - 1:
                text.append("\n")
        if not runs:
            text.append("none: every run so far completed or is still going", style="dim")
        else:
            text.append("\n:runs failed lists them all", style="dim")
        self.query_one("#failures", Static).update(text)

    def on_resize(self) -> None:
        if self.counts:  # what fits the summary changed (before the first read: nothing)
            self.render_summary()

    def selected_queue(self) -> str | None:
        return self.table.cursor_key

    def engine_changed(self, changes: Changes) -> None:
        if changes:
            if changes.runs or changes.everything:
                self.failures_read_at = None
            self.request_reload()

    def tick(self) -> None:
        # Stats are cheap (one grouped count per queue) and jobs move between states without
        # events (a delay running out), so the view re-reads them every second.
        self.request_reload()

    # ---- actions ---------------------------------------------------------------------------
    def on_row_table_selected(self, event: RowTable.Selected) -> None:
        event.stop()
        self.action_open_queue()

    def action_open_queue(self) -> None:
        queue = self.selected_queue()
        if queue is not None:
            self.blok.open_runs(queue=queue)

    def action_dead_letters(self) -> None:
        queue = self.selected_queue()
        if queue is not None:
            self.blok.open_dead_letters(queue)

    async def action_toggle_pause(self) -> None:
        queue = self.selected_queue()
        info = next((i for i in self.infos if i.name == queue), None)
        if info is None:
            return
        await self.blok.set_paused(info.name, not info.paused)
        self.request_reload()


def _failed_at(run: Run) -> datetime:
    """When a failed run ended (it has no end recorded while it ends: its start)."""
    return run.finished_at or run.started_at or run.created_at


def job_note(run: Run, job: Job | None) -> Text:
    """Before a failure's error: what became of its job ("↻ completed " when a later delivery
    went through), or how many deliveries it took to die ("3 deliveries, dead ")."""
    if job is None:
        return Text()
    if job.run_id != run.id:
        return then_text(job) + Text("  ")
    words = []
    if job.deliveries > 1:  # as `show` counts them: claims a gate held back are not
        words.append(f"{job.deliveries} deliveries")
    if job.state is JobState.DEAD:
        words.append("dead")
    return Text(", ".join(words) + "  ", style="magenta") if words else Text()
