"""Attach to a database that another process's Engine writes: `AttachedEngine`.

It has the Engine's API as far as a console and the command line use it. Reads go straight to
the SQLite file. Actions go through the `control` table to the worker that can carry them out:
the one holding the run (cancel), or one serving the queue (enqueue, replay, requeue, pause). With
no worker alive, what the database alone can do is done directly, because the queue is durable:
enqueue, replay and requeue write the job, cancelling a job nobody holds marks it cancelled,
pause writes the pause; a running run whose worker is gone is refused.

Live events come from polling `PRAGMA data_version` (it changes only when another connection
commits), and only then reading what changed: runs whose `rev` moved past the last one seen,
their steps and attempts, log lines past the last id, and the worker catalog (what each worker
serves, written by the Engine at start and at each reload).

A queue is known if a worker declared it: a live one, or one of the last workers that ran on
this file (their catalog stays until a new worker starts). Any other queue is `UnknownQueue`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup

from .durations import parse_duration
from .engine import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    EngineError,
    UnknownJob,
    UnknownQueue,
    UnknownRun,
    new_id,
    wait_control,
)
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
from .models import (
    TERMINAL_RUN_STATUSES,
    AttemptStatus,
    Job,
    JobState,
    QueueInfo,
    QueueStats,
    Run,
    RunStatus,
    StepStatus,
    WorkerInfo,
    WorkflowInfo,
    utcnow,
)
from .queue import QueueError
from .redact import redact_headers
from .sqlite_db import DatabaseError, SqliteDatabase
from .sqlite_queue import SqliteQueue
from .sqlite_store import RUN_COLUMNS, SqliteRunStore, run_from_row
from .store import RunFilter

POLL_INTERVAL = 0.1  # seconds between `PRAGMA data_version` checks: changes show within ~0.1 s
CONTROL_TIMEOUT = 8.0  # a worker's cancel itself waits up to 5 s for the step to stop
STALE_HEARTBEAT = 10.0  # a worker on another host is gone after this long without a heartbeat
PAGE = 1000  # changed rows read per query
MAX_PAGES = 5  # beyond this many pages in one poll, subscribers get Lagged and re-read
SEEN_RUNS = 20_000  # statuses remembered, so that a rewrite of a finished run is not news

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


@dataclass(frozen=True, slots=True)
class ServedQueue:
    """A queue as a worker declared it in its catalog."""

    name: str
    workflow_name: str
    workflow_version: str
    provider: str
    concurrency: int
    retries: int


@dataclass(frozen=True, slots=True)
class WorkerCatalog:
    """What one worker serves: its row of `worker_catalog`."""

    worker: str
    queues: tuple[ServedQueue, ...]
    workflows: tuple[WorkflowInfo, ...]
    reload_errors: dict[str, str]
    updated_at: float


@dataclass
class _StepSeen:
    status: str
    attempts: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class AttachedEngine:
    """`async with AttachedEngine(".blok/blok.db") as engine:` — an Engine's API on a database
    another process serves. `watch=False` skips the change poller (one-shot CLI commands)."""

    attached = True

    def __init__(
        self,
        database: str | os.PathLike[str],
        *,
        watch: bool = True,
        poll_interval: float = POLL_INTERVAL,
        control_timeout: float = CONTROL_TIMEOUT,
    ) -> None:
        self.database = Path(database)
        self.watch = watch
        self.poll_interval = poll_interval
        self.control_timeout = control_timeout
        self.bus = EventBus()
        self.reload_errors: dict[str, str] = {}
        self.worker: WorkerInfo | None = None  # an attached client runs nothing itself
        self._db: SqliteDatabase | None = None
        self._store: SqliteRunStore | None = None
        self._queue: SqliteQueue | None = None
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None
        self._rev = 0
        self._log_id = 0
        self._statuses: OrderedDict[str, str] = OrderedDict()
        self._steps: dict[str, dict[int, _StepSeen]] = {}
        self._catalog_key: Any = None
        self._workers_key: tuple[str, ...] | None = None
        self._catalogs: dict[str, WorkerCatalog] = {}
        self._paused: set[str] = set()
        self.polls = 0  # data_version checks made
        self.reads = 0  # polls that found a change and read it

    # ---- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> AttachedEngine:
        if not self.database.is_file():
            raise DatabaseError(
                f"{self.database}: no such database (start a worker on it first: "
                f"blok-tui worker --db {self.database})"
            )
        stack = AsyncExitStack()
        await stack.__aenter__()
        self._stack = stack
        try:
            db = SqliteDatabase(self.database)
            await db.open()
            stack.push_async_callback(db.close)  # after the writer's task group has ended
            self._db = db
            self._store = SqliteRunStore(db)
            self._queue = SqliteQueue(db)
            self._tg = await stack.enter_async_context(anyio.create_task_group())
            self._tg.start_soon(db.writer_loop)
            await self._prime()
            if self.watch:
                self._tg.start_soon(self._poll_loop)
        except BaseException:
            await stack.__aexit__(*sys.exc_info())
            raise
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        assert self._stack is not None and self._tg is not None
        try:
            if self._db is not None:
                # While the writer still runs: afterwards `close` has nothing left to flush.
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await self._db.flush()
        finally:
            self._tg.cancel_scope.cancel()
            # The body's own exception is not the background tasks' business: it propagates as
            # it is, not wrapped in the task group's ExceptionGroup.
            await self._stack.__aexit__(None, None, None)
            self.bus.close()
        return None

    @property
    def store(self) -> SqliteRunStore:
        if self._store is None:
            raise DatabaseError(f"{self.database}: not attached (use `async with`)")
        return self._store

    @property
    def queue(self) -> SqliteQueue:
        if self._queue is None:
            raise DatabaseError(f"{self.database}: not attached (use `async with`)")
        return self._queue

    # ---- workers and what they serve -------------------------------------------------------
    async def workers(self) -> list[WorkerInfo]:
        return await self.store.workers()

    async def live_workers(self) -> list[WorkerInfo]:
        """Workers whose process is alive (same host) or whose heartbeat is fresh."""
        host = socket.gethostname()
        stale = utcnow() - timedelta(seconds=STALE_HEARTBEAT)
        return [
            w
            for w in await self.store.workers()
            if (_pid_alive(w.pid) if w.host == host else w.heartbeat_at >= stale)
        ]

    async def catalogs(self) -> list[WorkerCatalog]:
        """Every worker's catalog, oldest first (a later declaration of a queue wins)."""
        rows = await self.store.db.fetchall(
            "SELECT worker, queues, workflows, reload_errors, updated_at FROM worker_catalog"
            " ORDER BY updated_at"
        )
        catalogs = []
        for row in rows:
            # Only the fields this version knows: a newer worker may write more.
            queues = tuple(
                ServedQueue(**{k: q[k] for k in ServedQueue.__dataclass_fields__})
                for q in json.loads(row["queues"])
            )
            workflows = tuple(
                WorkflowInfo(**{k: w.get(k) for k in WorkflowInfo.model_fields})
                for w in json.loads(row["workflows"])
            )
            catalogs.append(
                WorkerCatalog(
                    row["worker"], queues, workflows, json.loads(row["reload_errors"]), row[4]
                )
            )
        return catalogs

    async def _served(self, queue: str) -> tuple[ServedQueue, list[str]]:
        """The queue's latest declaration, and the live workers serving it."""
        catalogs = await self.catalogs()
        live = {w.id for w in await self.live_workers()}
        declared: ServedQueue | None = None
        serving: list[str] = []
        for catalog in catalogs:
            for served in catalog.queues:
                if served.name == queue:
                    declared = served
                    if catalog.worker in live:
                        serving.append(catalog.worker)
        if declared is None:
            known = sorted({q.name for c in catalogs for q in c.queues})
            raise UnknownQueue(
                f"unknown queue {queue!r} (queues: {', '.join(known) or 'none'}; a queue is "
                "known once a worker serving it has started on this database)"
            )
        return declared, serving

    async def queues(self) -> list[QueueInfo]:
        """Queues declared by the workers, merged by name: concurrency is the sum over the live
        workers serving the queue (the last declared one if none is alive)."""
        catalogs = await self.catalogs()
        live = {w.id for w in await self.live_workers()}
        paused = await self.store.paused_queues()
        merged: dict[str, QueueInfo] = {}
        live_width: dict[str, int] = {}
        for catalog in catalogs:
            for served in catalog.queues:
                merged[served.name] = QueueInfo(
                    name=served.name,
                    workflow_name=served.workflow_name,
                    provider=served.provider,
                    concurrency=served.concurrency,
                    paused=served.name in paused,
                )
                if catalog.worker in live:
                    live_width[served.name] = live_width.get(served.name, 0) + served.concurrency
        for name, width in live_width.items():
            merged[name].concurrency = width
        return [merged[name] for name in sorted(merged)]

    async def workflows(self) -> list[WorkflowInfo]:
        latest: dict[str, WorkflowInfo] = {}
        for catalog in await self.catalogs():
            for info in catalog.workflows:
                latest[info.name] = info
        return [latest[name] for name in sorted(latest)]

    # ---- reads -----------------------------------------------------------------------------
    async def get_run(self, run_id: str) -> Run:
        run = await self.store.get_run(run_id)
        if run is None:
            raise UnknownRun(f"unknown run {run_id!r}")
        return run

    async def runs(
        self,
        status: str | list[str] | None = None,
        workflow: str | None = None,
        queue: str | None = None,
        limit: int = 100,
        *,
        text: str | None = None,
        offset: int = 0,
        **filters: Any,
    ) -> list[Run]:
        try:
            where = RunFilter.of(status, workflow, queue, text, **filters)
        except ValueError as error:
            raise EngineError(f"bad filter: {error}") from None
        where = await self._resolve(where)
        return await self.store.list_runs(where, limit=limit, offset=offset)

    async def count_runs(self, where: RunFilter | None = None) -> int:
        if where is not None:
            where = await self._resolve(where)
        return await self.store.count_runs(where)

    async def _resolve(self, where: RunFilter) -> RunFilter:
        # Filters that need the store to become concrete (stuck runs), as the Engine does.
        try:
            from .operations import resolve_stuck
        except ImportError:
            return where
        return await resolve_stuck(self.store, where)

    async def get_job(self, job_id: str) -> Job:
        job = await self.queue.get_job(job_id)
        if job is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        return job

    async def wait_for_job(self, job_id: str, timeout: float | None = None) -> Run:
        """The job's last run, once the job has ended."""
        with anyio.fail_after(timeout):
            while True:
                job = await self.get_job(job_id)
                if job.state.terminal:
                    return await self.get_run(job.run_id)
                await anyio.sleep(0.05)  # another process settles it: nothing to await here

    async def queue_stats(self, queue: str) -> QueueStats:
        served, _ = await self._served(queue)
        if served.provider == "sqlite":
            return await self.queue.stats(queue)
        # A memory queue lives in its worker's process; its runs are the next best thing.
        rows = await self.store.db.fetchall(
            "SELECT status, count(*) FROM runs WHERE queue = ? GROUP BY status", (queue,)
        )
        counts = {row[0]: row[1] for row in rows}
        return QueueStats(
            queue=queue,
            waiting=counts.get("queued", 0),
            active=counts.get("running", 0),
            completed=counts.get("completed", 0),
            failed=sum(counts.get(s, 0) for s in ("failed", "timed_out", "crashed")),
            delayed=counts.get("delayed", 0) + counts.get("waiting", 0),
            cancelled=counts.get("cancelled", 0),
        )

    async def throughput(self, queue: str, window: float = 10.0) -> float:
        """Completed runs per second over the last `window` seconds, from every worker."""
        row = await self.store.db.fetchone(
            "SELECT count(*) FROM runs WHERE queue = ? AND status = 'completed'"
            " AND finished_at >= ?",
            (queue, time.time() - window),
        )
        return (row[0] if row else 0) / window

    async def dead_letters(self, queue: str) -> list[Job]:
        await self._served(queue)
        return await self.queue.dead_letters(queue)

    # ---- actions ---------------------------------------------------------------------------
    async def _ask(
        self, action: str, target: str, run_id: str | None = None, **payload: Any
    ) -> dict[str, Any]:
        """Post a control request to one worker and wait for its answer."""
        request = await self.store.post_control(action, run_id, payload, target=target)
        result = await wait_control(self.store, request, timeout=self.control_timeout)
        if result is None:
            raise EngineError(
                f"worker {target} did not answer the {action} request within "
                f"{self.control_timeout:g} s (request {request} stays queued for it)"
            )
        if not result.get("ok"):
            raise EngineError(result.get("error") or f"worker {target} refused to {action}")
        return result

    async def enqueue(
        self,
        queue: str,
        payload: Any = None,
        *,
        priority: int = 0,
        delay: Any = None,
        job_id: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> str:
        """Add a job; returns its id. A live worker serving the queue adds it (it knows the
        current workflow version); with none alive, a SQLite queue gets the job directly."""
        _check_payload(payload)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise EngineError(f"priority must be an integer, not {priority!r}")
        run_at = None
        if delay is not None:
            try:
                delay_ms = parse_duration(delay)
            except ValueError as error:
                raise EngineError(f"delay: {error}") from None
            if delay_ms > 0:
                run_at = utcnow() + timedelta(milliseconds=delay_ms)
        served, serving = await self._served(queue)
        if serving and job_id is None:
            result = await self._ask(
                "enqueue",
                serving[0],
                queue=queue,
                payload=payload,
                priority=priority,
                delay=delay,
                headers=headers,
            )
            return str(result["job_id"])
        self._check_direct(served, "enqueue to")
        if job_id is not None and await self.queue.get_job(job_id) is not None:
            return job_id
        job, run = _new_job(served, payload, priority, run_at, job_id, headers, {})
        self.store.save_run(run)
        await self.queue.add([job], [run])
        return job.id

    def _check_direct(self, served: ServedQueue, what: str) -> None:
        if served.provider != "sqlite":
            raise EngineError(
                f"no worker serving queue {served.name!r} is running, and it is a "
                f"{served.provider} queue that lives in its worker's process: cannot {what} it "
                "(start a worker: blok-tui worker)"
            )

    async def cancel(self, run_id: str) -> Run:
        """Cancel a running, waiting, delayed or queued run; a finished run is an error."""
        run = await self.get_run(run_id)
        if run.terminal:
            raise EngineError(f"run {run_id} has already ended ({run.status}); nothing to cancel")
        live = {w.id for w in await self.live_workers()}
        if run.status is RunStatus.RUNNING:
            if run.worker not in live:
                raise EngineError(
                    f"run {run_id} is running on worker {run.worker}, which is not alive; the "
                    "next worker to start on this database marks it crashed"
                )
            assert run.worker is not None
            await self._ask("cancel", run.worker, run_id)
            return await self.get_run(run_id)
        served, serving = await self._served(run.queue)
        if serving:
            await self._ask("cancel", serving[0], run_id)
            return await self.get_run(run_id)
        self._check_direct(served, "cancel a run of")
        job = await self.queue.get_job(run.job_id)
        if job is not None and job.run_id == run_id and await self.queue.cancel_pending(job.id):
            now = utcnow()
            run.status = RunStatus.CANCELLED
            run.finished_at = now
            run.error = "cancelled by operator before it ran"
            for step in run.steps:
                if step.status in (StepStatus.RUNNING, StepStatus.WAITING):
                    step.status = StepStatus.CANCELLED
                    step.finished_at = now
            self.store.save_run(run)
            await self.store.flush()
            return run
        run = await self.get_run(run_id)
        raise EngineError(f"run {run_id} is {run.status} and could not be cancelled; try again")

    async def replay(self, run_id: str, *, from_step: str | None = None, input: Any = None) -> str:
        """A new run with the same input (or `input`), `replay_of` pointing back."""
        source = await self.get_run(run_id)
        served, serving = await self._served(source.queue)
        if serving:
            result = await self._ask("replay", serving[0], run_id, from_step=from_step, input=input)
            return str(result["run_id"])
        if from_step is not None:
            raise EngineError(
                f"replaying from a step needs a worker serving queue {source.queue!r} "
                "(it knows the workflow's steps): start one with blok-tui worker"
            )
        self._check_direct(served, "replay into")
        payload = source.input if input is None else input
        _check_payload(payload)
        job, run = _new_job(
            served, payload, source.priority, None, None, None, {"replay_of": source.id}
        )
        self.store.save_run(run)
        await self.queue.add([job], [run])
        return run.id

    async def requeue(self, job_id: str) -> str:
        """Put a dead-lettered job back in its queue with a fresh run."""
        job = await self.get_job(job_id)
        served, serving = await self._served(job.queue)
        if serving:
            await self._ask("requeue", serving[0], job_id=job_id)
            return job_id
        self._check_direct(served, "requeue into")
        fresh, run = _new_job(served, job.payload, job.priority, None, job.id, job.headers, {})
        try:
            await self.queue.requeue(job_id, run)
        except QueueError as error:
            raise EngineError(str(error)) from None
        self.store.save_run(run)
        await self.store.flush()
        return fresh.id

    async def pause(self, queue: str) -> None:
        await self._set_paused(queue, True)

    async def resume(self, queue: str) -> None:
        await self._set_paused(queue, False)

    async def _set_paused(self, queue: str, paused: bool) -> None:
        # Every live worker serving the queue stops (or starts) claiming from it.
        _, serving = await self._served(queue)
        action = "pause" if paused else "resume"
        for worker in serving:
            await self._ask(action, worker, queue=queue)
        if not serving:
            await self.store.set_paused(queue, paused)

    # ---- live events -----------------------------------------------------------------------
    def events(self) -> AsyncIterator[Event]:
        """Typed events, live, made from what other processes commit. Subscribed from this
        call on: what happens before the first `async for` step is kept, not lost."""
        bus = self.bus
        send, receive = anyio.create_memory_object_stream[Event](bus._buffer)
        bus._subscribers[send] = 0

        async def stream() -> AsyncIterator[Event]:
            try:
                async with receive:
                    async for event in receive:
                        yield event
            finally:
                bus._subscribers.pop(send, None)
                send.close()

        return stream()

    async def _prime(self) -> None:
        """Start from what is there now: events are for what changes after attaching."""
        db = self.store.db
        row = await db.fetchone(
            "SELECT coalesce(max(rev), 0), (SELECT max(id) FROM logs) FROM runs"
        )
        self._rev, self._log_id = (row[0], row[1] or 0) if row else (0, 0)
        terminal = ", ".join(f"'{s}'" for s in TERMINAL_RUN_STATUSES)
        live = await db.fetchall(f"SELECT id, status FROM runs WHERE status NOT IN ({terminal})")
        for run_id, status in live:
            self._remember(run_id, status)
        await self._read_steps([r[0] for r in live if r[1] == RunStatus.RUNNING], publish=False)
        await self._read_catalog(publish=False)

    async def _poll_loop(self) -> None:
        store = self.store
        token = await store.change_token()
        while True:
            await anyio.sleep(self.poll_interval)
            self.polls += 1
            current = await store.change_token()
            if current == token:
                continue
            token = current
            self.reads += 1
            await self.read_changes()

    async def read_changes(self) -> None:
        """Read what changed since the last call and publish it as events: a run's start and
        its steps, then the log lines, then its end, as the worker itself would tell them."""
        front, back = await self._read_runs()
        lines = await self._read_logs()
        for event in (*front, *lines, *back):
            self.bus.publish(event)
        await self._read_catalog(publish=True)

    def _remember(self, run_id: str, status: str) -> None:
        self._statuses[run_id] = status
        self._statuses.move_to_end(run_id)
        while len(self._statuses) > SEEN_RUNS:
            old, _ = self._statuses.popitem(last=False)
            self._steps.pop(old, None)

    async def _read_runs(self) -> tuple[list[Event], list[Event]]:
        """Runs changed since the last read: (starts and step events, ends)."""
        db = self.store.db
        changed: list[Run] = []
        front: list[Event] = []
        for _ in range(MAX_PAGES):
            rows = await db.fetchall(
                f"SELECT {RUN_COLUMNS}, rev FROM runs WHERE rev > ? ORDER BY rev LIMIT ?",
                (self._rev, PAGE),
            )
            if rows:
                self._rev = rows[-1]["rev"]
                changed.extend(run_from_row(row) for row in rows)
            if len(rows) < PAGE:
                break
        else:
            row = await db.fetchone("SELECT coalesce(max(rev), 0) FROM runs")
            top = row[0] if row else self._rev
            if top > self._rev:
                front.append(Lagged(dropped=top - self._rev))
                self._rev = top
        publish = self.bus.active
        stepped = [r.id for r in changed if r.status not in (RunStatus.QUEUED, RunStatus.DELAYED)]
        back: list[Event] = []
        made = [(run.id, *self._run_events(run)) for run in changed]
        step_events = await self._read_steps(stepped, publish=publish)
        if not publish:
            return [], []
        for run_id, before, after in made:
            front.extend(before)
            front.extend(step_events.get(run_id, []))
            back.extend(after)
        return front, back

    def _run_events(self, run: Run) -> tuple[list[Event], list[Event]]:
        """Events for a run's status change: (before its step events, after them)."""
        status = str(run.status)
        previous = self._statuses.get(run.id)
        self._remember(run.id, status)
        if previous == status:
            return [], []
        before: list[Event] = []
        after: list[Event] = []
        if previous is None:
            queued = status if status in ("queued", "delayed") else "queued"
            before.append(RunQueued(run.id, run.queue, run.workflow_name, queued))
        if run.status is RunStatus.RUNNING:
            before.append(RunStarted(run.id, run.queue, run.workflow_name))
        elif run.terminal:
            if run.started_at is not None and previous in (None, "queued", "delayed"):
                before.append(RunStarted(run.id, run.queue, run.workflow_name))
            after.append(RunFinished(run.id, run.queue, run.workflow_name, status, run.error))
        elif previous is not None:
            after.append(RunStatusChanged(run.id, run.queue, status))
        return before, after

    async def _read_steps(self, run_ids: list[str], *, publish: bool) -> dict[str, list[Event]]:
        """Step and attempt changes of these runs, as events per run."""
        events: dict[str, list[Event]] = {}
        db = self.store.db
        for start in range(0, len(run_ids), 500):
            chunk = run_ids[start : start + 500]
            marks = ", ".join("?" * len(chunk))
            steps = await db.fetchall(
                "SELECT run_id, idx, name, status, error, max_attempts FROM steps"
                f" WHERE run_id IN ({marks}) ORDER BY run_id, idx",
                tuple(chunk),
            )
            attempts = await db.fetchall(
                "SELECT run_id, step_idx, number, status, error, error_type, backoff_ms"
                f" FROM attempts WHERE run_id IN ({marks}) ORDER BY run_id, step_idx, number",
                tuple(chunk),
            )
            by_step: dict[tuple[str, int], list[Any]] = {}
            for row in attempts:
                by_step.setdefault((row[0], row[1]), []).append(row)
            for row in steps:
                run_id, idx, name, status, error, max_attempts = tuple(row)
                seen_run = self._steps.setdefault(run_id, {})
                seen = seen_run.get(idx)
                if seen is None:
                    seen = seen_run[idx] = _StepSeen(str(StepStatus.PENDING))
                out = events.setdefault(run_id, [])
                for arow in by_step.get((run_id, idx), []):
                    number, astatus = arow[2], arow[3]
                    if number not in seen.attempts:
                        seen.attempts.add(number)
                        out.append(StepStarted(run_id, idx, name, number))
                    if astatus in _FAILED_ATTEMPT and number not in seen.failed:
                        seen.failed.add(number)
                        message = f"{arow[5]}: {arow[4]}" if arow[5] else str(arow[4])
                        out.append(
                            AttemptFailed(run_id, idx, name, number, max_attempts, message, arow[6])
                        )
                if status != seen.status:
                    if status in _FINISHED_STEP:
                        out.append(StepFinished(run_id, idx, name, status, error))
                    seen.status = status
            for run_id in chunk:
                if self._statuses.get(run_id) in {str(s) for s in TERMINAL_RUN_STATUSES}:
                    self._steps.pop(run_id, None)
        return events if publish else {}

    async def _read_logs(self) -> list[Event]:
        db = self.store.db
        if not self.bus.active:
            row = await db.fetchone("SELECT max(id) FROM logs")
            self._log_id = max(self._log_id, (row[0] or 0) if row else 0)
            return []
        lines: list[Event] = []
        for _ in range(MAX_PAGES):
            rows = await db.fetchall(
                "SELECT id, run_id, step_idx, level, message FROM logs WHERE id > ?"
                " ORDER BY id LIMIT ?",
                (self._log_id, PAGE),
            )
            lines.extend(LogRecorded(row[1], row[2], row[3], row[4]) for row in rows)
            if rows:
                self._log_id = rows[-1][0]
            if len(rows) < PAGE:
                return lines
        row = await db.fetchone("SELECT max(id) FROM logs")
        top = (row[0] or 0) if row else 0
        if top > self._log_id:
            lines.append(Lagged(dropped=top - self._log_id))
            self._log_id = top
        return lines

    async def _read_catalog(self, *, publish: bool) -> None:
        """Queue list, pauses, workers and reload errors: re-read when any of them changed."""
        db = self.store.db
        marks = await db.fetchall("SELECT worker, updated_at FROM worker_catalog ORDER BY worker")
        workers = await db.fetchall("SELECT id FROM workers ORDER BY id")
        paused = {row[0] for row in await db.fetchall("SELECT queue FROM paused_queues")}
        key = (tuple(tuple(r) for r in marks), tuple(r[0] for r in workers))
        if key == self._catalog_key and paused == self._paused:
            return
        self._catalog_key = key
        old, old_paused = self._catalogs, self._paused
        self._catalogs = {c.worker: c for c in await self.catalogs()}
        self._paused = paused
        errors: dict[str, str] = {}
        for catalog in sorted(self._catalogs.values(), key=lambda c: c.updated_at):
            errors.update(catalog.reload_errors)
        previous_errors, self.reload_errors = self.reload_errors, errors
        workers_moved = self._workers_key is not None and key[1] != self._workers_key
        self._workers_key = key[1]
        if not (publish and self.bus.active):
            return
        emit: Callable[[Event], None] = self.bus.publish
        for path, message in errors.items():
            if previous_errors.get(path) != message:
                emit(ReloadFailed(path, message))
        for path in previous_errors.keys() - errors.keys():
            emit(ReloadErrorCleared(path))
        old_versions = {w.name: w.version for c in old.values() for w in c.workflows}
        by_path: dict[str, list[WorkflowInfo]] = {}
        for catalog in self._catalogs.values():
            for info in catalog.workflows:
                if old_versions.get(info.name) != info.version and old_versions:
                    by_path.setdefault(info.path or "", []).append(info)
        for path, infos in by_path.items():
            emit(
                WorkflowReloaded(
                    path, tuple(i.name for i in infos), tuple(i.version for i in infos)
                )
            )
        old_queues = {(c.worker, q) for c in old.values() for q in c.queues}
        new_queues = {(c.worker, q) for c in self._catalogs.values() for q in c.queues}
        touched = {q.name for _, q in old_queues ^ new_queues} | (old_paused ^ paused)
        if workers_moved:
            touched |= {q.name for _, q in new_queues}  # a worker came or went: widths moved
        for name in sorted(touched):
            emit(QueueChanged(name))


def _check_payload(payload: Any) -> None:
    try:
        blob = json.dumps(payload)
    except (TypeError, ValueError) as error:
        raise EngineError(f"payload is not JSON-serialisable: {error}") from None
    if len(blob) > DEFAULT_MAX_PAYLOAD_BYTES:
        raise EngineError(
            f"payload is {len(blob):,} bytes, above the {DEFAULT_MAX_PAYLOAD_BYTES:,}-byte cap"
        )


def _new_job(
    served: ServedQueue,
    payload: Any,
    priority: int,
    run_at: Any,
    job_id: str | None,
    headers: dict[str, str] | None,
    meta: dict[str, Any],
) -> tuple[Job, Run]:
    """A job and its queued run, as the Engine would make them, for a queue no live worker
    serves (the worker that claims it later starts the run on its current version)."""
    now = utcnow()
    job = Job(
        id=job_id or new_id("job"),
        queue=served.name,
        workflow_name=served.workflow_name,
        payload=payload,
        headers=headers or {},
        priority=priority,
        state=JobState.DELAYED if run_at else JobState.WAITING,
        run_at=run_at,
        max_retries=served.retries,
        run_id=new_id("run"),
        created_at=now,
        meta=meta,
    )
    run = Run(
        id=job.run_id,
        workflow_name=served.workflow_name,
        workflow_version=served.workflow_version,
        queue=served.name,
        job_id=job.id,
        status=RunStatus.DELAYED if run_at else RunStatus.QUEUED,
        input=payload,
        headers=redact_headers(job.headers),
        priority=priority,
        created_at=now,
        run_at=run_at,
        replay_of=meta.get("replay_of"),
    )
    return job, run


__all__ = ["AttachedEngine", "ServedQueue", "WorkerCatalog"]
