"""The blok-tui console: a Textual app over an Engine (or an attached client with the same API).

It talks to the engine only through its public API and event stream. Events are coalesced: the
event worker only notes what moved, and ten times a second at most the view on top is told, so a burst
of a thousand events costs one redraw. Queue stats and throughput are sampled every second
because they are cheap and move without events.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import signal
import sys
from collections import OrderedDict, deque
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any, ClassVar

from textual.actions import SkipAction
from textual.app import App
from textual.binding import Binding, BindingType
from textual.driver import Driver
from textual.notifications import SeverityLevel
from textual.screen import ModalScreen
from textual.widgets import Input, TextArea
from textual.worker import WorkerCancelled

from engine import (
    EngineError,
    Lagged,
    LogRecorded,
    QueueChanged,
    ReloadErrorCleared,
    ReloadFailed,
    Run,
    RunFinished,
    RunQueued,
    RunStarted,
    RunStatusChanged,
    StepFinished,
    StepStarted,
    WorkflowInfo,
    WorkflowReloaded,
)
from engine.api import EngineAPI
from engine.events import AttemptFailed, Event
from engine.expressions import did_you_mean
from engine.operations import BulkProgress, BulkResult

from . import actions, bulk, engine_log
from .actions import STATUS_FILTERS
from .base_screen import BlokScreen, Changes
from .bulk import BulkPlan
from .command_screen import CommandScreen
from .confirm_screen import ConfirmScreen
from .console import Clock, printable, system_clock
from .dead_letters_screen import DeadLettersScreen
from .engine_log import TOAST_CHARS, EngineWarnings, Toasts
from .hangup import stop_signals
from .help_screen import HelpScreen
from .inject_screen import InjectScreen
from .jobs import JobBook
from .logs_screen import LogsScreen
from .queues_screen import QueuesScreen
from .run_screen import RunScreen
from .run_text import replay_version
from .runs_screen import RunsScreen
from .schedules_screen import SchedulesScreen
from .step_stats import StepStatsCache
from .widgets import BulkBar
from .workers_screen import WorkersScreen

log = logging.getLogger("blok.console")

FLUSH_EVERY = 0.1  # seconds between redraws driven by events (at most)
TICK_EVERY = 1.0  # seconds between clock-driven redraws and throughput samples
HISTORY = 180  # throughput samples kept per queue: three minutes at one a second
LOG_LINES = 5_000  # log lines kept for the live log view

EngineFactory = Callable[[], AbstractAsyncContextManager[EngineAPI]]


class BlokApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "blok-tui"
    # `:` is a priority binding: the app opens the command line as the key arrives, before
    # it routes the keys typed after it (a paste, tmux send-keys, a fast typist). Routed as
    # an ordinary key, `:` went to the focused table first and came back to the app after
    # the rest, which had gone to the table and were lost. A focused text box still gets its
    # `:` (Textual drops the bindings of keys a focused Input or TextArea types).
    BINDINGS: ClassVar[list[BindingType]] = [
        *(
            replace(b, priority=True)
            if isinstance(b, Binding) and b.action == "command_line"
            else b
            for b in actions.bindings(actions.APP)
        ),
        # Instead of Textual's "press ctrl+q to quit" hint; a priority binding, as modals
        # (where the app's keys do not reach) must answer it too. See `action_interrupt`.
        Binding("ctrl+c", "interrupt", show=False, system=True, priority=True),
    ]
    # Only the registry's entries: Textual's own (quit, keys, screenshot…) would repeat ours.
    COMMANDS: ClassVar = {actions.ActionCommands}

    def __init__(
        self,
        engine: EngineAPI | None = None,
        *,
        open_engine: EngineFactory | None = None,
        title: str | None = None,
        clock: Clock | None = None,
        tz: tzinfo | None = None,
        where: str | None = None,
    ) -> None:
        """`engine`: an entered Engine (or attach client). `open_engine`: instead, a factory of
        an `async with`-able engine that the app enters in its own event loop (snapshot tests
        and screenshots run the app in a loop of their own). `clock` and `tz` freeze time; `where`
        replaces the database path shown top right."""
        super().__init__()
        if (engine is None) == (open_engine is None):
            raise ValueError("give BlokApp either an engine or open_engine, not both")
        self.engine = engine
        self._open_engine = open_engine
        if title:
            self.title = title
        self._clock = clock  # a frozen clock (snapshots), else the engine's
        self.tz = tz
        self._where = where
        self.reload_errors: dict[str, str] = {}
        self._quit_question: ConfirmScreen | None = None  # "Quit while runs are running?"
        self.queue_names: list[str] = []
        self.throughput_history: dict[str, deque[float]] = {}
        self._changes = Changes()
        self.ready = asyncio.Event()
        self.last_bulk: BulkResult | None = None  # what the last bulk action did (for tests)
        self.step_stats_cache: StepStatsCache = {}  # shared by the run views
        self.last_injected: str | None = None  # the run of the job injected last (O opens it)
        self.jobs = JobBook()  # jobs read lately: what became of a failed run's job
        self.workflow_infos: dict[str, WorkflowInfo] = {}  # queue → the workflow it runs
        # The newest log lines of every run, numbered, for the live log view.
        self.log_lines: deque[tuple[int, LogRecorded]] = deque(maxlen=LOG_LINES)
        self._log_numbers = itertools.count()
        # Steps' names by (run id, index), from their StepStarted: a log line carries only the
        # index. The newest LOG_LINES steps are kept, enough for the lines kept.
        self.step_names: OrderedDict[tuple[str, int], str] = OrderedDict()
        self._engine_warnings: EngineWarnings | None = None
        self._toasts = Toasts()

    def get_driver_class(self) -> type[Driver]:
        driver = super().get_driver_class()
        if driver.__name__ == "LinuxDriver":  # not on Windows, nor one TEXTUAL_DRIVER names
            from .terminal_driver import TerminalDriver  # imports termios: here, not above

            return TerminalDriver
        return driver

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        # Messages carry engine text ("[step 2/5] charge failed: …", paths, payloads), never
        # markup: brackets must show as written, not vanish as tags; and run-provided text
        # may hold escape sequences, shown as \xNN rather than sent to the terminal.
        super().notify(
            printable(message),
            title=printable(title),
            severity=severity,
            timeout=timeout,
            markup=False,
        )

    async def action_quit(self) -> None:
        """Quit; with runs in flight in this console's engine, ask first: quitting stops
        them (recorded where they stopped, to go on at the next start on a durable
        database)."""
        count = self.engine.in_flight if self.engine is not None else 0
        if not count:
            self.exit()
            return
        runs = "1 run is" if count == 1 else f"{count:,} runs are"
        if self.engine is not None and self.engine.capabilities.location == "memory":
            then = "The engine keeps its runs in memory: they end with it."
        else:
            then = (
                "Those that do not finish at once are stopped and recorded where they "
                "stopped; they go on from there when a worker next serves this database."
            )

        def answer(yes: bool | None) -> None:
            self._quit_question = None
            if yes:
                self.exit()

        question = ConfirmScreen(f"Quit while {runs} running?", then, confirm="Quit", keep="Stay")
        self._quit_question = question
        self.push_screen(question, answer)

    async def action_interrupt(self) -> None:
        """ctrl+c. As in k9s, it quits from a view (asking first when runs are in flight, as
        q does), and a second ctrl+c answers that question. In a modal it does not: the inject
        editor may hold a payload being written, which one reflex press must not lose; there
        ctrl+c copies the selected text, as in any editor, and says how to leave. A text box
        of a view copies its selection too."""
        focused = self.focused
        selected = focused.selected_text if isinstance(focused, Input | TextArea) else ""
        selected = selected or self.screen.get_selected_text() or ""  # by the mouse
        if self._quit_question is not None and self.screen is self._quit_question:
            self._quit_question.dismiss(True)
        elif isinstance(self.screen, BlokScreen):
            if selected:
                raise SkipAction()  # the text box (or the screen) copies it
            await self.action_quit()
        else:
            if selected:
                self.copy_to_clipboard(selected)
            self.action_help_quit(copied=bool(selected))

    def action_help_quit(self, copied: bool = False) -> None:
        # Textual's own says "Press [b]ctrl+q[/b] …" in markup, which notify shows as written.
        self.notify(
            f"{'ctrl+c copied the selected text. ' if copied else ''}"
            "esc closes this first; then ctrl+c (or q) quits",
            title="Copied" if copied else "Do you want to quit?",
        )

    @property
    def where(self) -> str:
        if self._where is not None:
            return self._where
        location = self.opened_engine.capabilities.location
        return "in memory" if location == "memory" else f"db {location}"

    @property
    def opened_engine(self) -> EngineAPI:
        """The engine, for what runs only once it is open: the views (shown only then, see
        `_engine_if_open`) and the timers and workers `_start` begins."""
        if self.engine is None:
            raise RuntimeError("the console's engine is not open yet")
        return self.engine

    def _engine_if_open(self) -> EngineAPI | None:
        """The engine; None, with a note to the operator, while it is not open yet. An app
        given `open_engine` opens it in a worker after mounting, and its keys, palette and
        command line answer from the first frame: what needs the engine waits for it."""
        if self.engine is None:
            self.notify("the engine is still opening: try again in a moment", severity="warning")
        return self.engine

    # ---- lifecycle -------------------------------------------------------------------------
    async def on_mount(self) -> None:
        if self.engine is not None:
            await self._start(self.engine)
        else:
            self.run_worker(self._host_engine(), group="engine", name="engine")

    def now(self) -> datetime:
        """Now, on the clock the runs' times are on (the engine's: its database's)."""
        if self._clock is not None:
            return self._clock()
        return self.engine.now() if self.engine is not None else system_clock()

    async def _host_engine(self) -> None:
        # Entered and left in this one task, as anyio's task groups require.
        assert self._open_engine is not None
        async with self._open_engine() as engine:
            self.engine = engine
            await self._start(engine)
            await asyncio.Event().wait()

    async def on_unmount(self) -> None:
        if self._engine_warnings is not None:
            self._engine_warnings.remove()
        # Textual cancels an app's workers at exit without waiting for them. The engine this
        # app opened must finish closing (its database connections' threads) while the event
        # loop still runs: a connection's thread that answers after the loop has closed fails.
        for worker in list(self.workers):
            if worker.group == "engine":
                # The cancel is how Textual ends it; once `wait` returns, the close has run.
                with contextlib.suppress(WorkerCancelled):
                    await worker.wait()

    async def _start(self, engine: EngineAPI) -> None:
        self._engine_warnings = engine_log.installed()
        self._engine_warnings.attach(self.note_engine_line)
        self.reload_errors = dict(engine.reload_errors)
        await self._refresh_queue_names()
        self.run_worker(self._consume_events(engine), group="events", name="events", exclusive=True)
        self.set_interval(FLUSH_EVERY, self._flush_changes, name="flush")
        self.set_interval(TICK_EVERY, self._tick, name="tick")
        await self.push_screen(QueuesScreen())
        self.ready.set()

    async def _consume_events(self, engine: EngineAPI) -> None:
        async for event in engine.events():
            self._note(event)

    def note_engine_line(self, line: LogRecorded) -> None:
        """A warning of the engine's (engine_log.py): a line of the logs view, and a toast."""
        self.log_lines.append((next(self._log_numbers), line))
        self._changes.logs = True
        if self._toasts.due():
            said = line.message.partition(": ")[2]  # the logger's name: in the logs view
            said = said if len(said) <= TOAST_CHARS else said[: TOAST_CHARS - 1] + "…"
            self.notify(f"{said}  (:logs lists them)", title="Engine warning", severity="warning")

    def _note(self, event: Event) -> None:
        changes = self._changes
        match event:
            case RunQueued() | RunStarted() | RunStatusChanged() | RunFinished():
                changes.runs.add(event.run_id)
                changes.queues.add(event.queue)
                if event.job_id is not None:
                    self.jobs.forget([event.job_id])
            case LogRecorded():
                changes.runs.add(event.run_id)
                changes.logs = True
                self.log_lines.append((next(self._log_numbers), event))
            case StepStarted():
                changes.runs.add(event.run_id)
                self.step_names[(event.run_id, event.index)] = event.name
                if len(self.step_names) > LOG_LINES:
                    self.step_names.popitem(last=False)
            case StepFinished() | AttemptFailed():
                changes.runs.add(event.run_id)
            case QueueChanged():
                changes.queue_list = True
                changes.queues.add(event.queue)
            case WorkflowReloaded():
                changes.queue_list = True
                what = ", ".join(
                    f"{name} @{version}"
                    for name, version in zip(event.workflows, event.versions, strict=False)
                )
                self.notify(what or "no workflows", title=f"Reloaded {Path(event.path).name}")
            case ReloadFailed():
                self.reload_errors[event.path] = event.message
                self._show_reload_errors()
            case ReloadErrorCleared():
                self.reload_errors.pop(event.path, None)
                self._show_reload_errors()
                if Path(event.path).exists():
                    self.notify(f"{Path(event.path).name} loads again", title="Reload fixed")
                else:  # removed: its error went with it, nothing loads
                    self.notify(f"{Path(event.path).name} removed", title="Reload error gone")
            case Lagged():
                changes.everything = True
                changes.queue_list = True

    def _show_reload_errors(self) -> None:
        for screen in self.screen_stack:
            # One being opened shows them as it mounts (`show_chrome`); its banner is not there.
            if isinstance(screen, BlokScreen) and screen.is_mounted:
                screen.show_reload_errors(self.reload_errors)

    @property
    def view(self) -> BlokScreen | None:
        """The topmost view (a modal may be above it); None once the app is closing, when the
        views' widgets are being removed: a tick or a change told to a view then finds none."""
        if not self.is_running:
            return None
        for screen in reversed(self.screen_stack):
            if isinstance(screen, BlokScreen):
                return screen
        return None

    async def _flush_changes(self) -> None:
        if not self._changes:
            return
        changes, self._changes = self._changes, Changes()
        if changes.queue_list:
            await self._refresh_queue_names()
        view = self.view
        if view is not None and not view.is_mounted:
            # A view being opened has no widgets yet (the flush raised NoMatches and ended the
            # console): it is told at the next flush.
            self._changes.add(changes)
        elif view is not None:
            view.engine_changed(changes)

    async def _tick(self) -> None:
        for name in self.queue_names:
            try:
                rate = await self.opened_engine.throughput(name)
            except EngineError:
                continue
            self.throughput_history.setdefault(name, deque(maxlen=HISTORY)).append(rate)
        view = self.view
        if view is not None and view.is_mounted:  # one being opened has no widgets yet
            view.show_out_of_reach(self.opened_engine.out_of_reach_since())
            view.tick()

    async def _refresh_queue_names(self) -> None:
        engine = self.opened_engine
        self.queue_names = [q.name for q in await engine.queues()]
        # What each queue's workflow reads of a job's input: the inject modal's template.
        infos = await engine.workflows()
        self.workflow_infos = {info.queue: info for info in infos if info.queue}

    @property
    def idle(self) -> bool:
        """Nothing noted and not yet shown, and the view is not reading (for tests)."""
        view = self.view
        bulk_running = any(w.group == "bulk" and not w.is_finished for w in self.workers)
        ready = view is None or (view.is_mounted and view.idle)
        return not self._changes and not bulk_running and ready

    # ---- navigation ------------------------------------------------------------------------
    def _push_view(self, view: BlokScreen) -> None:
        """Show a view, once the engine is open: every view reads from it (and names its
        database top right)."""
        if self._engine_if_open() is not None:
            self.push_screen(view)

    def go_home(self) -> None:
        """Back to the queues view, dropping the breadcrumbs above it."""
        while len(self.screen_stack) > 1 and not isinstance(self.screen, QueuesScreen):
            self.pop_screen()

    def open_runs(
        self,
        *,
        status: str = "all",
        queue: str | None = None,
        workflow: str | None = None,
        text: str = "",
        reset: bool = False,
    ) -> None:
        if reset:
            self.go_home()
        self._push_view(RunsScreen(status=status, queue=queue, workflow=workflow, text=text))

    def open_run(self, run_id: str) -> None:
        self._push_view(RunScreen(run_id))

    def open_dead_letters(self, queue: str) -> None:
        self._push_view(DeadLettersScreen(queue))

    def open_logs(self) -> None:
        self.go_home()
        self._push_view(LogsScreen())

    def action_show_logs(self) -> None:
        self.open_logs()

    def open_workers(self) -> None:
        self.go_home()
        self._push_view(WorkersScreen())

    def open_schedules(self) -> None:
        self.go_home()
        self._push_view(SchedulesScreen())

    def action_show_schedules(self) -> None:
        self.open_schedules()

    # ---- operations shared by the views ----------------------------------------------------
    async def cancel_run(self, run_id: str) -> None:
        if self.opened_engine.out_of_reach_since() is not None:
            # Said now: the cancel waits for the database, and the toast after it came late.
            self.notify(
                f"run {run_id}: the database is out of reach; the cancel lands when it is back",
                title="Cancel waits",
                severity="warning",
            )
        try:
            run = await self.opened_engine.cancel(run_id)
        except EngineError as error:
            self.notify(str(error), title="Cancel refused", severity="error")
            return
        self.notify(f"run {run_id} is {run.status}", title="Cancelled")

    async def set_paused(self, queue: str, paused: bool) -> None:
        engine = self.opened_engine
        try:
            await (engine.pause if paused else engine.resume)(queue)
        except EngineError as error:
            self.notify(str(error), severity="error")
            return
        if paused:
            self.notify(f"{queue} claims nothing new; running jobs finish", title="Paused")
        else:
            self.notify(f"{queue} is claiming again", title="Resumed")

    async def replay(
        self,
        run_id: str,
        *,
        from_step: str | None = None,
        title: str = "Replayed",
        asked: bool = False,
    ) -> None:
        """Replay a run (from a step, if given) and open the new run; first, ask when its job
        completed since, or a replay of it completed or has not ended (`asked`: answered yes):
        `r` on a failed run whose job a later delivery completed charged the order twice."""
        engine = self.opened_engine
        if not asked:
            try:
                warning = await engine.replay_warning(run_id)
            except EngineError as error:
                self.notify(str(error), title="Replay refused", severity="error")
                return
            if warning is not None:

                def answer(yes: bool | None) -> None:
                    if yes:
                        again = self.replay(run_id, from_step=from_step, title=title, asked=True)
                        self.run_worker(again, group="replay")

                where = f" from step {from_step}" if from_step else ""
                detail = f"Run {run_id}: {warning}. A replay{where} runs its steps again."
                question = ConfirmScreen(
                    "Replay it anyway?", detail, confirm="Replay", keep="Leave it"
                )
                self.push_screen(question, answer)
                return
        try:
            if from_step is None:
                new_id = await engine.replay(run_id)
            else:
                new_id = await engine.replay(run_id, from_step=from_step)
        except EngineError as error:
            self.notify(str(error), title="Replay refused", severity="error")
            return
        try:
            version = replay_version(await engine.get_run(run_id), await engine.get_run(new_id))
        except EngineError:
            version = ""  # purged meanwhile: the toast says what was done
        where = f" from step {from_step}" if from_step else ""
        on = f", on {version}" if version else ""
        self.notify(f"replay of {run_id}{where} started as {new_id}{on}", title=title)
        self.open_run(new_id)

    def edit_and_replay(self, run: Run) -> None:
        """The run's input in the JSON editor; on send, a replay with the edited input."""

        def replayed(new_id: str | None) -> None:
            if new_id:
                self.notify(f"replay of {run.id} with edited input: {new_id}", title="Replayed")
                self.open_run(new_id)

        modal = InjectScreen(
            self.opened_engine, list(self.queue_names), replay_of=run, workflows=self.workflow_infos
        )
        self.push_screen(modal, replayed)

    def ask_where(self, run_id: str) -> None:
        """Where a running run's code is, as its worker answers (up to a few seconds on
        another machine: a worker, not the screen's wait)."""
        self.run_worker(self._ask_where(run_id), group="where")

    async def _ask_where(self, run_id: str) -> None:
        try:
            answer = await self.opened_engine.where(run_id)
        except EngineError as error:
            self.notify(str(error), title="Where: no answer", severity="warning")
            return
        self.notify(answer, title=f"Where run {run_id} is now", timeout=15)

    async def retry_now(self, run_id: str) -> bool:
        try:
            started = await self.opened_engine.retry_now(run_id)
        except EngineError as error:
            self.notify(str(error), title="Retry now refused", severity="error")
            return False
        also = "" if started == run_id else f" (as its job's next run {started})"
        self.notify(f"run {run_id} goes ahead now{also}", title="Retry now")
        return True

    def confirm_bulk(self, plan: BulkPlan, detail: str, done: Callable[[], Any]) -> None:
        """Ask once, saying how many runs (or jobs) it touches, once per job, and what it
        leaves out; then act, with progress, and report."""
        if plan.count == 0:
            why = f" {plan.per_job}" if plan.per_job else ""
            if plan.item == "dead letter":
                # Not "the 0 dead letters on payments: no dead letters to act on."
                self.notify(f"no dead letters to act on.{why}", severity="warning")
            else:
                self.notify(f"{plan.chosen}: no {plan.item}s to act on.{why}", severity="warning")
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.run_worker(self._bulk(plan, done), group="bulk", name=plan.action)

        verb = bulk.VERBS[plan.action]
        self.push_screen(
            ConfirmScreen(
                plan.question,
                " ".join(
                    part
                    for part in (
                        f"{plan.chosen[:1].upper()}{plan.chosen[1:]}.",
                        plan.per_job,
                        detail,
                    )
                    if part
                ),
                # "all" of a text filter's few dead letters read as all of them: "them".
                confirm=f"{verb} all"
                if plan.everything
                else f"{verb} them"
                if plan.count > 1
                else verb,
                keep="Keep them" if plan.count > 1 else "Keep it",
            ),
            answer,
        )

    async def _bulk(self, plan: BulkPlan, done: Callable[[], Any]) -> BulkResult | None:
        view = self.view
        bar = view.query_one(BulkBar) if view is not None else None
        if bar is not None:
            bar.start(f"{plan.action} {plan.count:,}…", plan.count)

        def progress(step: BulkProgress) -> None:
            if bar is not None:
                bar.advance(step)

        try:
            result = await bulk.execute(self.opened_engine, plan, progress)
        except EngineError as error:
            self.notify(str(error), title=f"Bulk {plan.action} failed", severity="error")
            return None
        finally:
            if bar is not None:
                bar.finish()
        self.notify(
            result.summary(),
            title=f"Bulk {plan.action}",
            severity="warning" if result.skipped else "information",
        )
        self.last_bulk = result
        if plan.action in ("requeue", "discard"):
            self.jobs.forget(result.ids)  # what they became is stale
        done()
        return result

    # ---- app-wide actions (from the registry) ----------------------------------------------
    async def action_command_line(self) -> None:
        if isinstance(self.screen, ModalScreen):
            raise SkipAction()  # a modal (help, a question) is on top: the key is its own
        words = [
            f"{verb} {q}"
            for q in self.queue_names
            for verb in ("runs", "dlq", "pause", "resume", "inject")
        ]
        words += [f"runs {status}" for status in STATUS_FILTERS]
        words += ["workers", "logs", "schedules"]
        # Awaited: the keys typed right after `:` (a paste, tmux send-keys, a fast typist)
        # wait in the app's queue until the line is mounted and focused, instead of going to
        # a screen with nothing focused, which drops them.
        await self.push_screen(CommandScreen(words), self._command_done)

    async def _command_done(self, line: str | None) -> None:
        if line:
            await self.run_command(line)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_inject(self, queue: str | None = None) -> None:
        engine = self._engine_if_open()
        if engine is None:
            return
        view = self.view
        if queue is None and isinstance(view, QueuesScreen):
            queue = view.selected_queue()
        elif queue is None and isinstance(view, RunsScreen | DeadLettersScreen):
            queue = view.queue
        elif queue is None and isinstance(view, RunScreen) and view.run is not None:
            queue = view.run.queue

        async def injected(job_id: str | None) -> None:
            if not job_id:
                return
            job = await engine.get_job(job_id)
            self.last_injected = job.run_id
            self.notify(f"job {job_id}, run {job.run_id}: O opens it", title="Injected")

        modal = InjectScreen(engine, list(self.queue_names), queue, workflows=self.workflow_infos)
        self.push_screen(modal, injected)

    def action_open_injected(self) -> None:
        if self.last_injected is None:
            self.notify("nothing injected yet: i injects a job", severity="warning")
            return
        self.open_run(self.last_injected)

    def copy_id(self, run_id: str) -> None:
        self.copy_to_clipboard(run_id)
        self.notify(run_id, title="Copied")

    def action_show_queues(self) -> None:
        self.go_home()

    def action_show_runs(self) -> None:
        self.open_runs(reset=True)

    def action_show_workers(self) -> None:
        self.open_workers()

    async def run_command(self, line: str) -> None:
        """Carry out a `:` command line such as "runs failed" or "run run_01…"."""
        words = line.strip().lstrip(":").split()
        if not words:
            return
        word, args = words[0].lower(), words[1:]
        if word == "q!":  # quit without asking
            self.exit()
            return
        if word in ("q", "quit", "exit"):
            await self.action_quit()
            return
        entry = actions.by_command(word)
        if entry is None:
            words = [str(a.command) for a in actions.commands()]
            known = ", ".join(f":{w}" for w in words)
            close = did_you_mean(word, words, prefix=":")
            self.notify(f"unknown command :{word}{close} (commands: {known})", severity="error")
            return
        needs = entry.args.startswith("<")
        if needs and not args:
            self.notify(f":{word} needs {entry.args}", severity="error")
            return
        arg = args[0] if args else None
        queues = self.queue_names
        match word:
            case "queues":
                self.go_home()
            case "help":
                self.action_help()
            case "inject":
                if arg is not None and arg not in queues:
                    # Said as `:dlq` says it, on a line of its own that no terminal size
                    # hides; the modal still opens (it says so too), to pick the queue meant.
                    self._unknown_queue(arg)
                self.action_inject(arg)
            case "workers":
                self.open_workers()
            case "schedules":
                self.open_schedules()
            case "logs":
                self.open_logs()
            case "runs":
                text = " ".join(args[1:])
                if arg is None or arg in STATUS_FILTERS:
                    self.open_runs(status=arg or "all", text=text, reset=True)
                elif arg in queues:
                    self.open_runs(queue=arg, text=text, reset=True)
                else:
                    self.notify(
                        f"{arg!r} is neither a status ({', '.join(STATUS_FILTERS)}) nor a queue "
                        f"({', '.join(queues) or 'none'})",
                        severity="error",
                    )
            case "run":
                engine = self._engine_if_open()
                if engine is None:
                    return
                try:
                    run_id = (await engine.find_run(str(arg))).id
                except EngineError as error:
                    self.notify(str(error), severity="error")
                    return
                self.go_home()
                self.open_run(run_id)
            case "dlq" | "pause" | "resume":
                if arg not in queues:
                    self._unknown_queue(str(arg))
                elif word == "dlq":
                    self.go_home()
                    self.open_dead_letters(arg)
                else:
                    await self.set_paused(arg, word == "pause")

    def _unknown_queue(self, name: str) -> None:
        queues = self.queue_names
        close = did_you_mean(name, queues)
        self.notify(
            f"unknown queue {name!r}{close} (queues: {', '.join(queues) or 'none'})",
            severity="error",
        )


async def run_console(
    engine: EngineAPI, *, title: str | None = None, grace: float | None = None
) -> int:
    """Run the console over an entered engine until the operator quits. Returns the exit
    status for the process: 0 when the operator quit, non-zero when the console crashed
    (Textual has shown the traceback), so a supervisor or a script can tell. `grace`: how
    long the engine gives its runs to finish once the console is gone, for the line saying so."""
    app = BlokApp(engine, title=title)
    # A SIGTERM (a `kill`, a supervisor) quits as `q` does: Python's default ended the process
    # at once and left the terminal in the alternate screen with the cursor hidden, and the
    # engine's runs without their grace. So does a SIGHUP, the terminal closing (`hangup`).
    loop = asyncio.get_running_loop()
    quitting = stop_signals(signal.SIGTERM)
    for signum in quitting:
        loop.add_signal_handler(signum, app.exit)
    try:
        await app.run_async()
    finally:
        for signum in quitting:
            # Not Python's default again until the engine has stopped (the caller's `async
            # with`; the loop's close takes these out): `tmux kill-server` sends SIGTERM, then
            # SIGHUP, and the default for the second ended the process in the runs' grace,
            # leaving them `running`, to be recorded crashed, a delivery of each job spent.
            loop.add_signal_handler(signum, _already_stopping, signum)
    status = app.return_code or 0
    if status == 0 and engine.in_flight:
        # The engine now gives its runs the grace period, with the screen already gone: say
        # why the prompt is not back yet.
        memory = engine.capabilities.location == "memory"
        line = stopping_line(engine.in_flight, grace, memory=memory)
        try:
            print(line, file=sys.stderr, flush=True)
        except OSError as gone:  # EIO: the terminal closed (SIGHUP), nobody is there to read it
            log.info("%s (not shown: %s)", line, gone.strerror)
    return status


def _already_stopping(signum: int) -> None:
    log.info("%s while the console stops: its runs' grace stands", signal.Signals(signum).name)


def stopping_line(count: int, grace: float | None, *, memory: bool = False) -> str:
    """What the terminal shows while the engine stops the runs a quit interrupted: one line of
    an 80-column terminal (the question before the quit said it at length)."""
    runs = "1 run" if count == 1 else f"{count:,} runs"
    within = f"up to {grace:g}s; " if grace is not None else ""
    then = "in memory, the rest end with it" if memory else "the rest resume at the next start"
    return f"blok-tui: stopping {runs}… ({within}{then})"
