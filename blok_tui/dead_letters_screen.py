"""The dead-letter view of a queue: jobs that used up their retries, newest first, with the
error that killed them. r puts the selected one back in its queue with a fresh run and its
retry budget again (the job's max_retries), and says how many retries that is; x takes it out of
the dead-letter queue for good (discards it), after asking. A and X do either to them all."""

from __future__ import annotations

import json
import time
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.widgets import Static

from engine import DatabaseError, EngineError, Job, ReplayedAlready

from . import actions
from .base_screen import Changes, RowFilterScreen
from .bulk import BulkPlan
from .confirm_screen import ConfirmScreen
from .console import day_time, printable, short_ids
from .jobs import budget_words
from .plain_text import opening_and_end
from .tracebacks import clean_error
from .widgets import FilterInput
from .widgets.row_table import Column, RowTable

LISTED = 1000  # the newest dead letters the view lists (the summary counts them all)
REPLAYED_TTL_S = 2.0  # the selected job's replay is read again after this long
INPUT_CHARS = 300  # of a job's input shown under the table and in the discard question

# The error column takes the room left; where it is cut, the message is, and its place (file and
# line) kept at the end; the selected job's whole error is shown under the table.
COLUMNS = (
    Column("job", "job", 12, priority=10),
    Column("workflow", "workflow", 18, priority=5),
    Column("deliveries", "deliveries", 10, priority=4, justify="right"),
    Column("died", "died", 11, priority=6),
    Column("error", "error", 20, priority=9, flex=True, keeps_place=True),
)


class DeadLettersScreen(RowFilterScreen):
    SCOPE: ClassVar[str] = actions.DEAD_LETTERS
    BINDINGS: ClassVar[list[BindingType]] = actions.bindings(actions.DEAD_LETTERS)

    def __init__(self, queue: str) -> None:
        super().__init__()
        self.queue = queue
        self.jobs: list[Job] = []
        self.total = 0  # the queue's dead letters: the list holds the newest of them only
        self.text = ""
        self.missing: str | None = None
        # The selected job's run's replay that completed or has not ended, and when read.
        self.replays: dict[str, tuple[str | None, float]] = {}

    @property
    def crumb(self) -> str:
        return f"dead letters {self.queue}"

    def compose_body(self) -> ComposeResult:
        yield Static(id="dlq-summary", classes="filters")
        yield FilterInput("filter dead letters: job id or error text…")
        yield RowTable(COLUMNS, id="dead")
        yield Static(id="dlq-detail", classes="detail-line")

    @property
    def table(self) -> RowTable:
        return self.query_one("#dead", RowTable)

    def on_mount(self) -> None:
        super().on_mount()
        self.table.focus()

    async def load(self) -> None:
        try:
            self.jobs = await self.engine.dead_letters(self.queue, limit=LISTED)
            self.total = max(len(self.jobs), (await self.engine.queue_stats(self.queue)).dead)
            self.missing = None
        except EngineError as error:
            self.jobs, self.missing = [], str(error)
        self.render_rows()

    def render_rows(self) -> None:
        needle = self.text.lower()
        shown = [j for j in self.jobs if needle in f"{j.id} {j.error or ''} {_input(j)}".lower()]
        now, tz = self.blok.now(), self.blok.tz
        short = short_ids([j.id for j in shown])
        # Jobs that died together have ids alike far along: cut to 12, they read the same.
        widest = max((len(prefix) for prefix in short.values()), default=0)
        self.table.fit_column("job", max(COLUMNS[0].width, widest))
        self.table.set_rows(
            [
                (
                    job.id,
                    [
                        Text(short[job.id], style="grey85"),
                        printable(job.workflow_name),
                        Text(str(job.deliveries), justify="right"),
                        day_time(job.finished_at, tz, now),
                        Text(printable(_one_line(job.error or "")), style="red1"),
                    ],
                )
                for job in shown
            ]
        )
        self.render_detail()
        summary = Text()
        if self.missing:
            summary.append(self.missing, style="red1")
        else:
            count = self.total
            noun = "dead letter" if count == 1 else "dead letters"
            summary.append(f"{count:,} {noun} on {self.queue}", style="bold")
            if count > len(self.jobs):  # the list holds the newest only: said, not hidden
                summary.append(f"   the newest {len(self.jobs):,} listed", style="khaki1")
            if self.text:
                summary.append(f"   / {self.text}  ({len(shown)} shown)", style="khaki1")
            if not self.jobs:
                # One line of an 80-column terminal with the count before it.
                summary.append("   every job finished or is still trying", style="dim")
        self.query_one("#dlq-summary", Static).update(summary, layout=False)

    def render_detail(self) -> None:
        """The selected job: its full id and its whole error, which the table cuts."""
        job = next((j for j in self.jobs if j.id == self.selected_job_id()), None)
        text = Text()
        if job is not None:
            text.append(f"{job.id}  ", style="bold")
            text.append(f"run {job.run_id}\n", style="grey62")
            # Which order it was: what an operator weighs before a requeue or a discard.
            text.append("input ", style="grey62")
            text.append(f"{printable(_input(job)[:INPUT_CHARS])}\n")
            text.append(clean_error(job.error or "no error recorded"), style="red1")
            fixed = self.replayed_of(job)
            if fixed is not None:  # a replay fixed it: the list had not said so
                text.append(f"\n{printable(fixed)}: a requeue runs it again", style="khaki1")
        self.query_one("#dlq-detail", Static).update(text)

    def replayed_of(self, job: Job) -> str | None:
        """What a replay of the job's run did ("it was replayed as run X, which completed"),
        as last read; a read is started when there is none yet, or it is older than
        `REPLAYED_TTL_S`: the detail redraws then."""
        known = self.replays.get(job.id)
        if known is None or time.monotonic() - known[1] > REPLAYED_TTL_S:
            self.replays[job.id] = (known[0] if known else None, time.monotonic())
            self.run_worker(self._read_replayed(job), group="replayed", exclusive=True)
        return known[0] if known else None

    async def _read_replayed(self, job: Job) -> None:
        try:
            said = await self.engine.replay_warning(job.run_id)
        except (EngineError, DatabaseError):
            said = None  # the detail is a help: r asks again before it requeues
        self.replays = {job.id: (said, time.monotonic())}  # only the selected job's is kept
        if self.selected_job_id() == job.id and not self.closing:
            self.render_detail()

    def on_row_table_highlighted(self, event: RowTable.Highlighted) -> None:
        self.render_detail()

    def selected_job_id(self) -> str | None:
        return self.table.cursor_key

    def engine_changed(self, changes: Changes) -> None:
        if self.queue in changes.queues or changes.everything:
            self.request_reload()

    async def action_requeue(self, force: bool = False) -> None:
        job = next((j for j in self.jobs if j.id == self.selected_job_id()), None)
        if job is None:
            return
        try:
            await self.engine.requeue(job.id, force=force)
        except ReplayedAlready as error:
            # Fixed by a replay already: requeued, its steps run again (a charge twice).
            def answer(yes: bool | None) -> None:
                if yes:
                    self.run_worker(self.action_requeue(force=True), group="requeue")

            question = ConfirmScreen(
                "Requeue it anyway?", f"{error}.", confirm="Requeue", keep="Leave it"
            )
            self.app.push_screen(question, answer)
            return
        except EngineError as error:
            self.notify(str(error), title="Requeue refused", severity="error")
            return
        self.blok.jobs.forget([job.id])
        said = f"job {job.id} is back on {self.queue} with a fresh run and {budget_words([job])}"
        try:
            paused = any(q.paused for q in await self.engine.queues() if q.name == self.queue)
        except (EngineError, DatabaseError):
            paused = False  # the toast says what was done; the queues view says the rest
        if paused:  # else it looked requeued and then nothing ran
            said += (
                f"; the queue is paused: nothing runs until it is resumed (:resume {self.queue})"
            )
        self.notify(said, title="Requeued")
        self.request_reload()

    def action_discard(self) -> None:
        job = next((j for j in self.jobs if j.id == self.selected_job_id()), None)
        if job is None:
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.run_worker(self._discard(job), group="discard")

        died = day_time(job.finished_at, self.blok.tz, self.blok.now())
        question = ConfirmScreen(
            f"Discard job {job.id}?",
            f"{printable(job.workflow_name)}, input {printable(_input(job)[:INPUT_CHARS])}; "
            f"died {died}: {printable(_one_line(job.error or 'no error recorded'))[:INPUT_CHARS]}\n\n"
            "It leaves the dead-letter queue for good: cancelled, it never runs again. Its "
            "runs stay readable until the retention deletes them.",
            confirm="Discard",
            keep="Keep it",
        )
        self.app.push_screen(question, answer)

    async def _discard(self, job: Job) -> None:
        try:
            await self.engine.discard(job.id)
        except EngineError as error:
            self.notify(str(error), title="Discard refused", severity="error")
            return
        self.blok.jobs.forget([job.id])
        self.notify(f"job {job.id} is out of the dead letters of {self.queue}", title="Discarded")
        self.request_reload()

    def action_requeue_all(self) -> None:
        """Every dead letter of the queue (or the ones the text filter shows), after asking."""
        shown = self._shown()
        detail = (
            "Each goes back in its queue with a fresh run and its retry budget again: "
            f"{budget_words(shown)}. A job a replay completed, or is still running, is left (it would run again)."
        )
        self.blok.confirm_bulk(self._plan("requeue", shown), detail, self.request_reload)

    def action_discard_all(self) -> None:
        shown = self._shown()
        detail = (
            "Each leaves the dead-letter queue for good: cancelled, it never runs again. "
            "Their runs stay readable until the retention deletes them."
        )
        self.blok.confirm_bulk(self._plan("discard", shown), detail, self.request_reload)

    def _shown(self) -> list[Job]:
        """The dead letters a bulk action takes: those the text filter shows."""
        needle = self.text.lower()
        return [j for j in self.jobs if needle in f"{j.id} {j.error or ''}".lower()]

    def _plan(self, action: str, shown: list[Job]) -> BulkPlan:
        # Without a filter, every dead letter of the queue, not only those listed: the dialog
        # asked about 1,000 and the requeue took 4,499.
        count = len(shown) if self.text else self.total
        chosen = (
            f"the dead letter on {self.queue}"
            if count == 1
            else f"the {count:,} dead letters on {self.queue}"
        )
        if self.text:
            chosen += f" matching {self.text!r} (of the newest {len(self.jobs):,})"
        return BulkPlan(
            action,
            tuple(j.id for j in shown),
            count,
            chosen,
            item="dead letter",
            dead_of=self.queue if not self.text else None,
            everything=not self.text,
        )

    def action_first_row(self) -> None:
        self.table.move_cursor(0)

    def action_last_row(self) -> None:
        self.table.move_cursor(len(self.table.keys) - 1)

    def on_row_table_selected(self, event: RowTable.Selected) -> None:
        event.stop()
        self.action_open_job_run()

    def action_open_job_run(self) -> None:
        job = next((j for j in self.jobs if j.id == self.selected_job_id()), None)
        if job is not None:
            self.blok.open_run(job.run_id)


def _one_line(error: str) -> str:
    """A multi-line error on one table line: its lines joined, the table cuts the rest (of a 5
    MB error, what a line of the widest terminal shows)."""
    error = opening_and_end(error, 500)
    return " ⏎ ".join(line.strip() for line in error.strip().splitlines() if line.strip())


def _input(job: Job) -> str:
    """The job's input as one line of JSON."""
    return json.dumps(job.payload, ensure_ascii=False, default=str)
