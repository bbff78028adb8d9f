"""Following a database other processes write: their changes as the engine's typed events.

An engine that runs nothing here (a producer, an attached console) follows the backend's change
feed: when the change token moves it reads the runs written since (in commit order, with their
steps and attempts) and the log lines, and tells them as the worker itself would have — a run's
start and its steps, then its log lines, then its end. What the workers serve (queues, pauses,
workflow versions, reload errors) is compared with what it was, for the queue list and banners.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .backends.base import Backend, FeedCursor, Pace, WorkerCatalog
from .events import (
    AttemptFailed,
    Event,
    EventBus,
    Lagged,
    LogRecorded,
    QueueChanged,
    ReloadErrorCleared,
    ReloadFailed,
    RunFinished,
    RunQueued,
    RunStarted,
    RunStatusChanged,
    StepFinished,
    StepStarted,
    WorkflowReloaded,
)
from .filters import RunFilter
from .models import (
    LIVE_RUN_STATUSES,
    AttemptStatus,
    Run,
    RunStatus,
    StepStatus,
    WorkflowInfo,
)

SEEN_RUNS = 20_000  # statuses remembered, so that a rewrite of a finished run is not news
PAGE = 1000

_FINISHED_STEP = frozenset(
    {
        StepStatus.COMPLETED,
        StepStatus.FAILED,
        StepStatus.SKIPPED,
        StepStatus.CACHED,
        StepStatus.CANCELLED,
    }
)
_FAILED_ATTEMPT = frozenset({AttemptStatus.FAILED, AttemptStatus.TIMED_OUT})
# Where a run waits before it starts: a run seen next in another status began since.
_NOT_STARTED = frozenset({"queued", "delayed", "debounced", "throttled"})


@dataclass
class _StepSeen:
    status: str
    attempts: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)


def _at(moment: datetime | None) -> float:
    """When a recorded thing happened, for ordering; one with no time goes last."""
    return moment.timestamp() if moment is not None else math.inf


class Follower:
    def __init__(self, backend: Backend, bus: EventBus, poll_s: float = 0.1) -> None:
        self.backend = backend
        self.bus = bus
        self.poll_s = poll_s
        self.cursor = FeedCursor()
        self.reload_errors: dict[str, str] = {}
        self._statuses: OrderedDict[str, str] = OrderedDict()
        self._steps: dict[str, dict[int, _StepSeen]] = {}
        self._catalogs: dict[str, WorkerCatalog] = {}
        self._catalog_key: Any = None
        self._workers_key: tuple[str, ...] | None = None
        self._paused: set[str] = set()
        self.polls = 0  # change-token checks made
        self.reads = 0  # checks that found a change and read it

    async def prime(self) -> None:
        """Start from what is there now: events are for what changes after this."""
        self.cursor = await self.backend.runs.feed_cursor()
        live = await self.backend.runs.list_runs(_live_filter(), limit=SEEN_RUNS)
        for run in live:
            self._remember(run.id, str(run.status))
            if run.status is RunStatus.RUNNING:
                self._step_events(run)
        await self._read_catalog(publish=False)

    async def loop(self) -> None:
        token = await self.backend.change_token()
        pace = Pace()
        while True:
            self.polls += 1
            moved = await self.backend.wait_for_change(token, self.poll_s * 10, pace)
            if moved == token:
                continue
            token = moved
            self.reads += 1
            await self.read_changes()

    async def read_changes(self) -> None:
        page = await self.backend.runs.feed(self.cursor, PAGE)
        self.cursor = page.cursor
        publish: Callable[[Event], None] = self.bus.publish
        front: list[Event] = []
        back: list[Event] = []
        if page.lagged:
            front.append(Lagged(dropped=page.lagged))
        for run in page.runs:
            before, after = self._run_events(run)
            front.extend(before)
            if run.status not in (RunStatus.QUEUED, RunStatus.DELAYED):
                front.extend(self._step_events(run))
            back.extend(after)
            if run.terminal:
                self._steps.pop(run.id, None)
        lines: list[Event] = [
            LogRecorded(line.run_id, line.step, line.level, line.message) for line in page.logs
        ]
        if self.bus.active:
            for event in (*front, *lines, *back):
                publish(event)
        await self._read_catalog(publish=True)

    def _remember(self, run_id: str, status: str) -> None:
        self._statuses[run_id] = status
        self._statuses.move_to_end(run_id)
        while len(self._statuses) > SEEN_RUNS:
            old, _ = self._statuses.popitem(last=False)
            self._steps.pop(old, None)

    def told(self, run_id: str, status: str) -> bool:
        """Whether a change this engine made to a run itself (it enqueued, cancelled or
        replayed it) is news to its subscribers: not if the feed told it first. Remembered,
        so that the feed does not tell it again either (`Ledger.told`)."""
        if self._statuses.get(run_id) == status:
            return False
        self._remember(run_id, status)
        return True

    def _run_events(self, run: Run) -> tuple[list[Event], list[Event]]:
        """Events for a run's status change: (before its step events, after them). A run may
        have moved several times between two reads (queued, running, then waiting): what a
        subscriber missed is told first (the run was queued, it started), then where it is."""
        status = str(run.status)
        previous = self._statuses.get(run.id)
        self._remember(run.id, status)
        if previous == status:
            return [], []
        before: list[Event] = []
        after: list[Event] = []
        if previous is None:
            queued = status if status in ("queued", "delayed") else "queued"
            before.append(
                RunQueued(run.id, run.queue, run.workflow_name, queued, job_id=run.job_id)
            )
        began = run.started_at is not None and (previous is None or previous in _NOT_STARTED)
        if run.status is RunStatus.RUNNING:
            before.append(RunStarted.of(run))
        elif run.terminal:
            if began:
                before.append(RunStarted.of(run))
            after.append(RunFinished.of(run))
        elif previous is not None or status not in ("queued", "delayed"):
            if began:
                before.append(RunStarted.of(run))
            after.append(RunStatusChanged.of(run))
        return before, after

    def _step_events(self, run: Run) -> list[Event]:
        """Step and attempt changes of the run since it was last seen, in the order they
        happened: a for_each's record comes before its iterations' and ends after them (in the
        records' order, a reader was told the loop had ended before its first item began)."""
        out: list[tuple[float, Event]] = []
        seen_run = self._steps.setdefault(run.id, {})
        for step in run.steps:
            seen = seen_run.get(step.index)
            if seen is None:
                seen = seen_run[step.index] = _StepSeen(str(StepStatus.PENDING))
            if not step.attempts and step.started_at is not None and 1 not in seen.attempts:
                # A flow step (for_each, switch…) has no attempts; its own engine tells it
                # started as attempt 1.
                seen.attempts.add(1)
                out.append((_at(step.started_at), StepStarted(run.id, step.index, step.name, 1)))
            for attempt in step.attempts:
                if attempt.number not in seen.attempts:
                    seen.attempts.add(attempt.number)
                    out.append(
                        (
                            _at(attempt.started_at),
                            StepStarted(run.id, step.index, step.name, attempt.number),
                        )
                    )
                if attempt.status in _FAILED_ATTEMPT and attempt.number not in seen.failed:
                    seen.failed.add(attempt.number)
                    message = (
                        f"{attempt.error_type}: {attempt.error}"
                        if attempt.error_type
                        else str(attempt.error)
                    )
                    failed = AttemptFailed(
                        run.id,
                        step.index,
                        step.name,
                        attempt.number,
                        step.max_attempts,
                        message,
                        attempt.backoff_ms,
                    )
                    out.append((_at(attempt.finished_at), failed))
            if str(step.status) != seen.status:
                if step.status in _FINISHED_STEP:
                    finished = StepFinished(
                        run.id, step.index, step.name, str(step.status), step.error
                    )
                    out.append((_at(step.finished_at), finished))
                seen.status = str(step.status)
        out.sort(key=lambda told: told[0])  # stable: things of one moment keep the records' order
        return [event for _, event in out]

    async def _read_catalog(self, *, publish: bool) -> None:
        """Queue list, pauses, workers and reload errors: compared when any of them moved."""
        shared = self.backend.shared
        catalogs = {c.worker: c for c in await shared.catalogs()}
        workers = tuple(sorted(w.id for w in await shared.workers()))
        paused = await shared.paused_queues()
        key = (tuple(sorted((w, c.updated_at) for w, c in catalogs.items())), workers)
        if key == self._catalog_key and paused == self._paused:
            return
        self._catalog_key = key
        old, old_paused = self._catalogs, self._paused
        self._catalogs, self._paused = catalogs, paused
        errors: dict[str, str] = {}
        for catalog in sorted(catalogs.values(), key=lambda c: c.updated_at):
            # A stopped worker's catalog stays (what it served stays known), its load errors
            # not: an attached console showed one for minutes over workers that load the file.
            if catalog.worker in workers:
                errors.update(catalog.reload_errors)
        previous_errors, self.reload_errors = self.reload_errors, errors
        workers_moved = self._workers_key is not None and workers != self._workers_key
        self._workers_key = workers
        if not (publish and self.bus.active):
            return
        emit = self.bus.publish
        for path, message in errors.items():
            if previous_errors.get(path) != message:
                emit(ReloadFailed(path, message))
        for path in previous_errors.keys() - errors.keys():
            emit(ReloadErrorCleared(path))
        # Each worker against its own last catalog: against all of them merged by name, one
        # worker's version stood for every worker's, and a console watching a mixed fleet
        # (or a gone worker's kept catalog) said "Reloaded" of files nobody touched.
        old_versions = {(c.worker, w.name): w.version for c in old.values() for w in c.workflows}
        by_path: dict[str, list[WorkflowInfo]] = {}
        for catalog in catalogs.values():
            if catalog.worker not in old:  # a worker that started: nothing was reloaded
                continue
            for info in catalog.workflows:
                if old_versions.get((catalog.worker, info.name)) != info.version:
                    said = by_path.setdefault(info.path or "", [])
                    if all((i.name, i.version) != (info.name, info.version) for i in said):
                        said.append(info)  # each worker that reloaded it: said once
        for path, infos in by_path.items():
            emit(
                WorkflowReloaded(
                    path, tuple(i.name for i in infos), tuple(i.version for i in infos)
                )
            )
        old_queues = {(c.worker, q) for c in old.values() for q in c.queues}
        new_queues = {(c.worker, q) for c in catalogs.values() for q in c.queues}
        touched = {q.name for _, q in old_queues ^ new_queues} | (old_paused ^ paused)
        if workers_moved:
            touched |= {q.name for _, q in new_queues}  # a worker came or went: widths moved
        for name in sorted(touched):
            emit(QueueChanged(name))


def _live_filter() -> RunFilter:
    return RunFilter(status=LIVE_RUN_STATUSES)
