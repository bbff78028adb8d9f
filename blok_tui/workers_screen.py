"""The workers view: every worker process registered on this database (id host:pid:tag, when it
started, its last heartbeat) and what it is doing, so an attached console shows who works.

What a worker is doing is the engine's judgement (`worker_state`, as `blok-tui workers` and
`blok-tui health` say it): a worker of this machine is alive while its process runs, as recovery
judges it too; one of another machine while its heartbeat is recent (recovery gives up on it
later still, once the heartbeat is older than a lease). A worker of this machine whose process
runs but whose heartbeat stopped is suspended (SIGSTOP) or stalled: it keeps its jobs, as
recovery leaves them, but claims none. A rule of the console's own said a worker killed here
was alive for ten more seconds, while recovery had already given its jobs to others."""

from __future__ import annotations

import os
from collections import Counter
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.widgets import Static

from engine import WorkerInfo
from engine.liveness import GONE, SERVING, STOPPING, SUSPENDED, pid_names_process_here

from . import actions
from .base_screen import BlokScreen, Changes
from .console import day_time, duration
from .widgets.row_table import Column, RowTable

COLUMNS = (
    Column("worker", "worker", 24, priority=10, flex=True),
    Column("host", "host", 16, priority=3),
    Column("pid", "pid", 8, priority=2, justify="right"),
    Column("started", "started", 11, priority=5),
    Column("heartbeat", "heartbeat", 20, priority=8),
    Column("alive", "state", 12, priority=9),
    # Only while a workflow is served at more than one version: which one each worker has.
    Column("versions", "versions of a split", 30, priority=7),
)

# How each state reads; any other (stalled: alive by its process, no heartbeat) is a warning.
STATES = {
    SERVING: ("✓ alive", "green3"),
    SUSPENDED: ("⏸ suspended", "khaki1"),
    STOPPING: ("↓ stopping", "khaki1"),
    GONE: ("✗ gone", "red1"),
}


Splits = dict[str, dict[str, list[str]]]  # workflow → version → live workers (version_splits)


def workers_line(
    workers: list[WorkerInfo],
    states: dict[str, str],
    *,
    hint: bool = True,
    splits: Splits | None = None,
    shared: dict[str, list[str]] | None = None,
) -> Text:
    """One line for the queues view: "workers  2 alive: host:12, host:34 · 1 suspended · 1
    gone"; `states`: each worker's, by id, as the engine judges it (`worker_state`); then
    each workflow the live workers serve at more than one version (`splits`): a deploy
    half done showed only in `blok-tui health` and the workers' logs; and each queue they
    serve with more than one workflow (`shared`: queue → workflows), whose second name the
    workflow column cuts."""
    alive = [w for w in workers if states.get(w.id) == SERVING]
    line = Text()
    line.append("workers ", style="bold")
    if not workers:
        line.append(" none registered: start one with blok-tui worker", style="dim")
        return line
    line.append(f" {len(alive)} alive", style="green3" if alive else "red1")
    if alive:
        line.append(": " + ", ".join(w.id for w in alive[:4]), style="grey70")
        if len(alive) > 4:
            line.append(f" +{len(alive) - 4}", style="grey70")
    # Alive by their process but serving nothing (a suspended one keeps its jobs), then gone.
    others = Counter(states.get(w.id, GONE) for w in workers if w not in alive)
    for state, count in sorted(others.items(), key=lambda item: (item[0] == GONE, item[0])):
        line.append(f" · {count} {state}", style="khaki3")
    for workflow, versions in sorted((splits or {}).items()):
        line.append(f" · ⚠ {workflow} at {len(versions)} versions", style="bold khaki1")
    for queue, workflows in sorted((shared or {}).items()):
        line.append(f" · ⚠ queue {queue} serves {' and '.join(workflows)}", style="bold khaki1")
    if hint:
        line.append("   :workers lists them", style="dim")
    return line


def versions_served(worker: str, splits: Splits) -> str:
    """The versions `worker` serves of the workflows served at more than one: "orders@1a28"."""
    return ", ".join(
        f"{workflow}@{version}"
        for workflow, versions in sorted(splits.items())
        for version, holders in sorted(versions.items())
        if worker in holders
    )


def is_this_process(worker: WorkerInfo) -> bool:
    """Whether `worker` is the engine of the console's own process (a hosting console runs
    jobs too), as opposed to a `blok-tui worker` or another console on the database."""
    return worker.pid == os.getpid() and pid_names_process_here(worker)


class WorkersScreen(BlokScreen):
    SCOPE: ClassVar[str] = actions.WORKERS
    BINDINGS: ClassVar[list[BindingType]] = actions.bindings(actions.WORKERS)

    def __init__(self) -> None:
        super().__init__()
        self.found: list[WorkerInfo] = []
        self.states: dict[str, str] = {}  # by worker id: engine.worker_state
        self.splits: Splits = {}

    @property
    def crumb(self) -> str:
        return "workers"

    def compose_body(self) -> ComposeResult:
        yield Static(id="workers-summary", classes="filters")
        yield RowTable(COLUMNS, id="workers")

    @property
    def table(self) -> RowTable:
        return self.query_one("#workers", RowTable)

    def on_mount(self) -> None:
        super().on_mount()
        self.table.hide_columns(("versions",))  # until a split is read
        self.table.focus()

    async def load(self) -> None:
        self.found = await self.engine.workers()
        self.states = {w.id: self.engine.worker_state(w) for w in self.found}
        self.splits = await self.engine.version_splits()
        self.render_rows()

    def render_rows(self) -> None:
        now, tz = self.blok.now(), self.blok.tz
        rows = []
        for worker in self.found:
            state = self.states.get(worker.id, GONE)
            ago = (now - worker.heartbeat_at).total_seconds() * 1000
            cells: list[Text | str] = [
                Text(worker.id, style="bold"),
                worker.host,
                Text(str(worker.pid), justify="right"),
                day_time(worker.started_at, tz, now),
                Text(f"{day_time(worker.heartbeat_at, tz, now)} ({duration(max(ago, 0))})"),
                Text(*STATES.get(state, (f"⚠ {state}", "dark_orange"))),
                Text(versions_served(worker.id, self.splits), style="khaki1"),
            ]
            rows.append((worker.id, cells))
        self.table.set_rows(rows)
        self.table.hide_columns(() if self.splits else ("versions",))
        summary = workers_line(self.found, self.states, hint=False, splits=self.splits)
        own = next((w for w in self.found if is_this_process(w)), None)
        if own is not None:  # a hosting console runs jobs too: which row is it?
            summary.append("   this console: ", style="khaki3")
            summary.append(own.id, style="bold khaki1")
        self.query_one("#workers-summary", Static).update(summary, layout=False)

    def engine_changed(self, changes: Changes) -> None:
        if changes.everything:
            self.request_reload()

    def tick(self) -> None:
        self.request_reload()  # heartbeats move without events
