"""The Engine: workflows, queues, workers and the store, in one `async with`.

It owns one anyio task group. Inside it run a claim loop per queue, one task per job in flight,
and a few housekeepers (the SQLite writer, heartbeats and leases, operator requests from other
processes, the janitor, the file watcher). Everything a console needs is a public method or an
event on `events()`.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import os
import random
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from .context import Context
from .durations import parse_duration
from .events import (
    EventBus,
    QueueChanged,
    ReloadErrorCleared,
    ReloadFailed,
    RunFinished,
    RunQueued,
    RunStarted,
    RunStatusChanged,
    Subscription,
    WorkflowReloaded,
)
from .gates import Gates
from .loader import (
    IMPORT_TIMEOUT_S,
    LoadedFile,
    WorkflowLoadError,
    load_file_with_timeout,
    workflow_files,
)
from .models import (
    PENDING_RUN_STATUSES,
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
from .operations import (
    BulkResult,
    ProgressCallback,
    Skip,
    matching_runs,
    resolve_stuck,
    run_bulk,
)
from .primitives import cancel_waited_children, run_middleware, wake_parent
from .queue import JobQueue, MemoryQueue, QueueError
from .records import construct
from .redact import redact_headers
from .runner import Outcome, Runner
from .sqlite_db import SqliteDatabase
from .sqlite_queue import SqliteQueue
from .sqlite_store import SqliteRunStore
from .store import ControlRequest, MemoryRunStore, RunFilter, RunStore
from .workflow import Workflow

log = logging.getLogger("blok.engine")

DEFAULT_MAX_PAYLOAD_BYTES = 1_048_576
KEPT_VERSIONS = 100  # per workflow, for waiting runs that resume on the version they began on
_live_workers: set[str] = set()  # engines alive in this process, for boot recovery


class EngineError(Exception):
    """A request the engine refuses; the message says why and is meant for the user."""


class UnknownQueue(EngineError):
    pass


class UnknownRun(EngineError):
    pass


class UnknownJob(EngineError):
    pass


def new_id(prefix: str) -> str:
    # Time first so ids sort by creation, then randomness.
    return f"{prefix}_{int(time.time() * 1000):011x}{secrets.token_hex(4)}"


@dataclass
class RunHandle:
    run: Run
    job: Job
    ctx: Context | None = None
    scope: anyio.CancelScope | None = None
    cancel_requested: bool = False
    done: anyio.Event = field(default_factory=anyio.Event)

    def cancel(self) -> None:
        self.cancel_requested = True
        if self.ctx is not None:
            self.ctx.cancelled = True
        if self.scope is not None:
            self.scope.cancel()


@dataclass
class QueueRuntime:
    """A queue as this engine serves it right now."""

    name: str
    workflow: Workflow
    queue: JobQueue
    concurrency: int
    active: int = 0
    paused: bool = False
    stopped: bool = False
    loop_done: anyio.Event = field(default_factory=anyio.Event)
    changed: anyio.Event = field(default_factory=anyio.Event)
    completed_times: list[float] = field(default_factory=list)

    def poke(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()
        self.queue.wake(self.name)

    def stop(self) -> None:
        """Stop claiming; the claim loop ends within one claim timeout."""
        self.stopped = True
        self.poke()


class Engine:
    """The workflow engine. Use as `async with Engine(workflows=..., database=...) as engine`."""

    def __init__(
        self,
        workflows: str | os.PathLike[str] | Sequence[Workflow] | None = None,
        database: str | os.PathLike[str] | None = None,
        *,
        provider: str | None = None,
        watch: bool = False,
        retention: str | int | float | timedelta = timedelta(days=7),
        janitor_interval: float = 60.0,
        grace_period: float = 10.0,
        lease: float = 30.0,
        heartbeat: float = 2.0,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        snapshot_cap: int | None = None,
        consume: bool = True,
        import_timeout: float = IMPORT_TIMEOUT_S,
    ) -> None:
        self._source = workflows
        self.database = Path(database) if database is not None else None
        self._default_provider = provider
        self.watch = watch
        if isinstance(retention, timedelta):
            self.retention = retention
        else:
            self.retention = timedelta(milliseconds=parse_duration(retention))
        self.janitor_interval = janitor_interval
        self.grace_period = grace_period
        self.lease = lease
        self.heartbeat_interval = heartbeat
        self.max_payload_bytes = max_payload_bytes
        self.consume = consume
        self.import_timeout = import_timeout  # a workflow file's import that takes longer fails
        self.bus = EventBus()
        self.db: SqliteDatabase | None = None
        self.store: RunStore = MemoryRunStore()
        self._queues: dict[str, JobQueue] = {}
        self._runtimes: dict[str, QueueRuntime] = {}
        self._paused: set[str] = set()  # paused queue names, for runtimes made later too
        self._handles: dict[str, RunHandle] = {}
        self._job_done: dict[str, anyio.Event] = {}
        self._files: dict[Path, LoadedFile] = {}
        self._inline: list[Workflow] = []
        self._workflows: dict[str, Workflow] = {}
        self._versions: dict[tuple[str, str], Workflow] = {}
        self.reload_errors: dict[str, str] = {}
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None
        self._jobs_scope: anyio.CancelScope | None = None
        self._stopping = False
        self.worker = WorkerInfo(
            id=self._worker_id(),
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=utcnow(),
            heartbeat_at=utcnow(),
        )
        env_cap = os.environ.get("BLOK_STATE_SNAPSHOT_MAX_BYTES", "")
        cap = snapshot_cap or (int(env_cap) if env_cap.isdigit() else None)
        self.runner = Runner(self.store, self.bus, **({"snapshot_cap": cap} if cap else {}))
        self.runner.engine = self  # subworkflow steps dispatch child runs through the engine
        self.runner.middleware = run_middleware
        self.gates = Gates(self)

    @staticmethod
    def _worker_id() -> str:
        base = f"{socket.gethostname()}:{os.getpid()}"
        worker_id, n = base, 1
        while worker_id in _live_workers:
            n += 1
            worker_id = f"{base}#{n}"
        return worker_id

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def default_provider(self) -> str:
        chosen = self._default_provider or os.environ.get("BLOK_WORKER_ADAPTER") or None
        if chosen is None:
            return "sqlite" if self.database is not None else "memory"
        return chosen

    async def __aenter__(self) -> Engine:
        stack = AsyncExitStack()
        await stack.__aenter__()
        self._stack = stack
        try:
            _live_workers.add(self.worker.id)
            stack.callback(_live_workers.discard, self.worker.id)
            if self.database is not None:
                self.db = SqliteDatabase(self.database)
                await self.db.open()
                self.store = SqliteRunStore(self.db)
                self.runner.store = self.store
            self._tg = await stack.enter_async_context(anyio.create_task_group())
            if self.db is not None:
                self._tg.start_soon(self._guarded, self.db.writer_loop)
                stack.push_async_callback(self.db.close)
            self._jobs_tg = await self._start_jobs_group()
            await self._recover()
            # Known before the claim loops start, so a paused queue claims nothing at boot.
            self._paused = await self.store.paused_queues()
            self._load_initial()
            self._tg.start_soon(self._guarded, self._heartbeat_loop)
            self._tg.start_soon(self._guarded, self._janitor_loop)
            if isinstance(self.store, SqliteRunStore):
                self._tg.start_soon(self._guarded, self._control_loop)
                self._tg.start_soon(self._guarded, self._pause_sync_loop)
            if self.watch and self._folder is not None:
                from .reload import watch_folder

                self._tg.start_soon(self._guarded, watch_folder, self, self._folder)
        except BaseException:
            # The housekeepers already started (the writer) would keep the task group open.
            if self._tg is not None:
                self._tg.cancel_scope.cancel()
            await stack.__aexit__(None, None, None)
            raise
        return self

    async def _start_jobs_group(self) -> TaskGroup:
        """Job tasks live in their own group so that a drain can wait for them, then cancel."""
        assert self._tg is not None
        ready = anyio.Event()
        holder: dict[str, Any] = {}

        async def host() -> None:
            with anyio.CancelScope() as scope:
                self._jobs_scope = scope
                async with anyio.create_task_group() as tg:
                    holder["tg"] = tg
                    ready.set()
                    await anyio.sleep_forever()

        self._tg.start_soon(host)
        await ready.wait()
        return holder["tg"]

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        assert self._stack is not None
        if exc is not None and not isinstance(exc, anyio.get_cancelled_exc_class()):
            self._crash_in_flight(exc)
        try:
            if exc is None:
                await self.shutdown(self.grace_period)
            else:
                self._stopping = True
                if self._tg is not None:
                    self._tg.cancel_scope.cancel()
        finally:
            try:
                # True when the cancellation came from our own task group (`shutdown()` called
                # in the `async with` body): it is ours to swallow, not the caller's to see.
                suppressed = await self._stack.__aexit__(exc_type, exc, tb)
            except BaseException as error:
                # One of the engine's own tasks failed: the task group re-raises it here.
                if not isinstance(error, anyio.get_cancelled_exc_class()):
                    self._crash_in_flight(error)
                raise
            finally:
                self.bus.close()
        # Only a cancellation is ever ours to swallow: an error from the body (a failed
        # assertion in a test) can come back wrapped in a group the stack calls handled.
        return bool(suppressed) and isinstance(exc, anyio.get_cancelled_exc_class())

    async def shutdown(self, grace_period: float | None = None) -> None:
        """Stop claiming, let running jobs finish within the grace period, then cancel the
        rest and put their jobs back in the queue for another worker."""
        if self._stopping:
            return
        self._stopping = True
        grace = self.grace_period if grace_period is None else grace_period
        for runtime in self._runtimes.values():
            runtime.stop()
        for runtime in self._runtimes.values():
            if self.consume:
                await runtime.loop_done.wait()
        with anyio.move_on_after(grace):
            while self._handles:
                await self._any_job_done()
        interrupted = list(self._handles.values())
        if self._jobs_scope is not None:
            self._jobs_scope.cancel()
        for handle in interrupted:
            with anyio.move_on_after(1):
                await handle.done.wait()
        for queue in self._queues.values():
            await queue.release_worker(self.worker.id)
        with anyio.CancelScope(shield=True):
            await self.store.forget_worker(self.worker.id)
            await self.store.flush()
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    async def _any_job_done(self) -> None:
        events = [h.done for h in self._handles.values()]
        if not events:
            return
        async with anyio.create_task_group() as tg:

            async def wait_one(event: anyio.Event) -> None:
                await event.wait()
                tg.cancel_scope.cancel()

            for event in events:
                tg.start_soon(wait_one, event)

    async def _guarded(self, task: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run one of the engine's own tasks; if it fails, the runs in flight are recorded as
        crashed with its error before the task group tears everything down."""
        try:
            await task(*args)
        except Exception as error:
            log.exception("engine task %s failed", getattr(task, "__name__", task))
            self._crash_in_flight(error)
            raise

    def _crash_in_flight(self, error: BaseException) -> None:
        """The process is going down with an error: say so on every run it holds, hand their
        jobs back for redelivery, and commit that now, before anything else can fail."""
        reason = (
            f"crashed: the engine stopped on an unhandled error: {type(error).__name__}: {error}"
        )
        for handle in list(self._handles.values()):
            self._interrupt(handle.job, handle.run, reason)
        if self.db is not None:
            try:
                self.db.flush_now()
            except Exception:
                log.exception("could not record %d in-flight runs as crashed", len(self._handles))

    # ---- workflows and queues --------------------------------------------------------------
    @property
    def _folder(self) -> Path | None:
        if isinstance(self._source, str | os.PathLike):
            path = Path(self._source)
            return path if path.is_dir() else path.parent
        return None

    def _load_initial(self) -> None:
        source = self._source
        if source is None:
            self._apply()
            return
        if isinstance(source, str | os.PathLike):
            path = Path(source)
            if not path.exists():
                raise EngineError(f"{path}: no such workflows folder or file")
            for file in [path] if path.is_file() else workflow_files(path):
                self.load(file)
            self._apply()
            return
        self._inline = list(source)
        self._apply()

    def load(
        self, path: Path, *, imported: LoadedFile | WorkflowLoadError | None = None
    ) -> LoadedFile | None:
        """(Re)load one workflow file; on failure its previous version keeps serving. The hot
        reloader imports off the event loop and hands the outcome in as `imported`."""
        path = path.resolve()
        key = str(path)
        try:
            if imported is None:
                imported = load_file_with_timeout(path, self.import_timeout)
            if isinstance(imported, WorkflowLoadError):
                raise imported
            loaded = imported
            self._check_queues(loaded)
        except WorkflowLoadError as error:
            self.reload_errors[key] = str(error)
            log.error("workflow file failed to load: %s", error)
            self._publish_catalog()
            if self.bus.active:
                self.bus.publish(ReloadFailed(key, str(error)))
            return None
        self._files[path] = loaded
        if self.reload_errors.pop(key, None) is not None and self.bus.active:
            self.bus.publish(ReloadErrorCleared(key))
        return loaded

    def unload(self, path: Path) -> None:
        path = path.resolve()
        self._files.pop(path, None)
        if self.reload_errors.pop(str(path), None) is not None and self.bus.active:
            self.bus.publish(ReloadErrorCleared(str(path)))

    def _check_queues(self, loaded: LoadedFile) -> None:
        names: dict[str, Path] = {}
        queues: dict[str, str] = {}
        for path, other in self._files.items():
            if path == loaded.path:
                continue
            for wf in other.workflows:
                names[wf.name] = path
                if wf.queue:
                    queues[wf.queue] = wf.name
        for wf in loaded.workflows:
            if wf.name in names:
                raise WorkflowLoadError(
                    loaded.path,
                    None,
                    f"workflow {wf.name!r} is already defined in {names[wf.name]}",
                )
            if wf.queue and wf.queue in queues:
                raise WorkflowLoadError(
                    loaded.path,
                    None,
                    f"queue {wf.queue!r} is already consumed by workflow {queues[wf.queue]!r}",
                )
            names[wf.name] = loaded.path
            if wf.queue:
                queues[wf.queue] = wf.name
            if wf.trigger is not None:
                # Refused here rather than failing later in _apply, where a hot reload would
                # take the whole engine down (an unknown provider, sqlite without a database).
                try:
                    self._queue_for(self._provider_for(wf))
                except EngineError as error:
                    raise WorkflowLoadError(
                        loaded.path, None, f"workflow {wf.name!r}: {error}"
                    ) from None

    def _apply(self) -> None:
        """Make the served queues match the loaded workflows, without touching runs in flight."""
        current: dict[str, Workflow] = {}
        for wf in self._inline:
            current[wf.name] = wf
        for loaded in self._files.values():
            for wf in loaded.workflows:
                current[wf.name] = wf
        for wf in current.values():
            self._versions.pop((wf.name, wf.version), None)  # re-added last: the newest
            self._versions[(wf.name, wf.version)] = wf
        # Old versions are kept for runs that wait and resume on them; a long editing session
        # must not keep every module it ever loaded, so only the newest few per workflow stay.
        kept: dict[str, int] = {}
        for key in reversed(list(self._versions)):
            kept[key[0]] = kept.get(key[0], 0) + 1
            if kept[key[0]] > KEPT_VERSIONS:
                del self._versions[key]
        self._workflows = current
        wanted = {wf.queue: wf for wf in current.values() if wf.trigger is not None}
        for name in list(self._runtimes):
            runtime = self._runtimes[name]
            wf = wanted.get(name)
            provider = self._provider_for(wf) if wf else None
            if wf is None or provider != runtime.queue.provider:
                # Stop claiming; jobs stay in the queue and runs in flight finish. The claim
                # loop is told, not cancelled (see _claim_loop): a claim under way when the
                # file went away hands its jobs back to the queue.
                del self._runtimes[name]
                runtime.stop()  # wakes a paused loop too, so it sees it is retired
                if self.bus.active:
                    self.bus.publish(QueueChanged(name))
        for name, wf in wanted.items():
            assert wf.trigger is not None
            runtime = self._runtimes.get(name)
            if runtime is None:
                runtime = QueueRuntime(
                    name, wf, self._queue_for(self._provider_for(wf)), wf.trigger.concurrency
                )
                runtime.paused = name in self._paused
                self._runtimes[name] = runtime
                if self._tg is not None and self.consume and not self._stopping:
                    self._tg.start_soon(self._guarded, self._claim_loop, runtime)
                if self.bus.active:
                    self.bus.publish(QueueChanged(name))
            else:
                if runtime.concurrency != wf.trigger.concurrency and self.bus.active:
                    self.bus.publish(QueueChanged(name))
                runtime.workflow = wf
                runtime.concurrency = wf.trigger.concurrency
                runtime.poke()
        self._publish_catalog()

    def _publish_catalog(self) -> None:
        """Write what this worker serves to the database, for consoles attached from another
        process (engine/remote.py). Rows of workers that are gone are dropped here too."""
        if self.db is None:
            return
        queues = [
            {
                "name": r.name,
                "workflow_name": r.workflow.name,
                "workflow_version": r.workflow.version,
                "provider": r.queue.provider,
                "concurrency": r.concurrency,
                "retries": r.workflow.trigger.retries if r.workflow.trigger else 0,
            }
            for r in sorted(self._runtimes.values(), key=lambda r: r.name)
        ]
        workflows = [
            {
                "name": wf.name,
                "version": wf.version,
                "queue": wf.queue,
                "path": wf.path,
                "steps": [s.name for s in wf.steps],
            }
            for wf in sorted(self._workflows.values(), key=lambda w: w.name)
        ]
        self.db.write(
            "INSERT OR REPLACE INTO worker_catalog (worker, queues, workflows, reload_errors,"
            " updated_at) VALUES (?, ?, ?, ?, ?)",
            (
                self.worker.id,
                json.dumps(queues),
                json.dumps(workflows, default=str),
                json.dumps(self.reload_errors),
                time.time(),
            ),
        )
        self.db.write("DELETE FROM worker_catalog WHERE worker NOT IN (SELECT id FROM workers)", ())

    def _provider_for(self, wf: Workflow) -> str:
        chosen = (wf.trigger.provider if wf.trigger else None) or self.default_provider
        return chosen

    def _queue_for(self, provider: str) -> JobQueue:
        queue = self._queues.get(provider)
        if queue is None:
            if provider == "memory":
                queue = MemoryQueue()
            elif provider == "sqlite":
                if self.db is None:
                    raise EngineError(
                        "the sqlite queue needs a database: pass database=PATH to Engine "
                        "(or use provider='memory')"
                    )
                queue = SqliteQueue(self.db, lease_s=self.lease)
            else:
                raise EngineError(f"unknown queue provider {provider!r}: use 'memory' or 'sqlite'")
            self._queues[provider] = queue
        return queue

    def notify_reloaded(self, loaded: LoadedFile) -> None:
        if self.bus.active:
            self.bus.publish(
                WorkflowReloaded(
                    str(loaded.path),
                    tuple(w.name for w in loaded.workflows),
                    tuple(w.version for w in loaded.workflows),
                )
            )

    # ---- workers ---------------------------------------------------------------------------
    async def _claim_loop(self, runtime: QueueRuntime) -> None:
        # Stopped by a flag, never by cancellation: a claim cancelled half-way would leave jobs
        # leased to this worker that nobody runs.
        try:
            while not runtime.stopped:
                while not runtime.stopped and (
                    runtime.paused or runtime.active >= runtime.concurrency
                ):
                    if runtime.paused:  # jobs claimed ahead go back for other workers
                        runtime.queue.return_ahead(runtime.name)
                    await runtime.changed.wait()
                if runtime.stopped:
                    break
                jobs = await runtime.queue.claim(
                    runtime.name,
                    runtime.concurrency - runtime.active,
                    self.worker.id,
                    timeout=0.25,
                )
                if runtime.stopped or runtime.paused:
                    for job in jobs:  # paused or stopped while the claim was under way
                        runtime.queue.settle(job, JobState.WAITING)
                    runtime.queue.return_ahead(runtime.name)
                    continue
                for job in jobs:
                    runtime.active += 1
                    self._jobs_tg.start_soon(self._work, runtime, job)
        finally:
            runtime.queue.return_ahead(runtime.name)
            runtime.loop_done.set()

    async def _work(self, runtime: QueueRuntime, job: Job | None) -> None:
        """One worker slot (counted in `runtime.active`): run the job, then the next one the
        queue hands over at once, in this same task, until it has none, or the queue is
        paused, stopped or narrowed. A task and a claim round trip per job would cost more
        than a short job itself."""
        try:
            while job is not None:
                await self._execute(runtime, job)
                await anyio.lowlevel.checkpoint()  # the rest of the engine runs between jobs
                if (
                    runtime.stopped
                    or runtime.paused
                    or self._stopping
                    or runtime.active > runtime.concurrency
                    or self._runtimes.get(runtime.name) is not runtime
                ):
                    return
                job = runtime.queue.claim_nowait(runtime.name, self.worker.id)
        finally:
            runtime.active -= 1
            runtime.poke()

    def _workflow_for(self, runtime: QueueRuntime, run: Run, resuming: bool) -> Workflow:
        """The definition a claimed run executes: the current one, except for a run resuming
        after a reload that changed the shape of its steps (the cursor and the step records
        would point at different steps), which finishes on the version it started on."""
        current = runtime.workflow
        if not resuming or run.workflow_version in ("", current.version):
            return current
        older = self._versions.get((run.workflow_name, run.workflow_version))
        if older is not None:
            compatible = _step_shape(older.steps) == _step_shape(current.steps)
        else:  # started before a restart: only its top-level step records are left
            compatible = [
                (s.name, s.kind)
                for s in run.steps
                if s.parent is None and not (s.tags and s.tags[0].startswith("mw:"))
            ] == [(s.name, s.kind) for s in current.steps]
        if compatible:
            self.runner.engine_log(
                run,
                f"resumed on version {current.version} (started on {run.workflow_version}); "
                "its steps are unchanged",
            )
            return current
        if older is not None:
            self.runner.engine_log(
                run,
                f"resumed on version {run.workflow_version}, the version it started on: the "
                f"current version {current.version} changed its steps",
            )
            return older
        self.runner.engine_log(
            run,
            f"version {run.workflow_version} it started on is gone (restart); resumed on "
            f"{current.version} although its steps changed",
            "warning",
        )
        return current

    async def _run_for(self, job: Job) -> tuple[Run, bool]:
        """The run a claimed job executes, and whether it resumes one that already began."""
        meta = job.meta
        if job.resume:
            run = await self.store.get_run(job.run_id)
            if run is not None:
                return run, True
        if meta.pop("redelivered", False):
            old_run = job.run_id
            job.run_id = new_id("run")
            run = self._new_run(job, job_attempt=job.attempts)
            self._queue_of(job).assign_run(job)
            self.runner.engine_log(
                run, f"redelivery of job {job.id}: its previous run {old_run} crashed"
            )
            return run, False
        return self._new_run(job, job_attempt=int(meta.get("failures", 0)) + 1), False

    def _new_run(
        self, job: Job, *, job_attempt: int = 1, status: RunStatus = RunStatus.QUEUED
    ) -> Run:
        wf = self._workflows.get(job.workflow_name)
        meta = job.meta
        return construct(
            Run,
            dict(
                id=job.run_id,
                workflow_name=job.workflow_name,
                workflow_version=wf.version if wf else "",
                queue=job.queue,
                job_id=job.id,
                status=status,
                input=job.payload,
                headers=redact_headers(job.headers),
                output=None,
                error=None,
                error_step=None,
                priority=job.priority,
                job_attempt=job_attempt,
                created_at=job.created_at if job_attempt == 1 else utcnow(),
                started_at=None,
                finished_at=None,
                run_at=job.run_at,
                wait_until=None,
                replay_of=meta.get("replay_of"),
                replay_from_step=meta.get("replay_from_step"),
                parent_run_id=meta.get("parent_run_id"),
                depth=meta.get("depth", 0),
                worker=None,
                attempts=0,
                failed_attempts=0,
                cursor=[],
                state={},
                steps=[],
                logs=[],
            ),
        )

    async def _execute(self, runtime: QueueRuntime, job: Job) -> None:
        handle: RunHandle | None = None
        try:
            run, resuming = await self._run_for(job)
            workflow = self._workflow_for(runtime, run, resuming)
            if not await self.gates.admit(runtime, job, run, workflow, resuming):
                return  # debounced, delayed, throttled, queued or expired: the job went back
            handle = RunHandle(run, job)
            self._handles[run.id] = handle
            run.status = RunStatus.RUNNING
            run.workflow_version = workflow.version
            run.worker = self.worker.id
            run.wait_until = None
            if run.started_at is None:
                run.started_at = utcnow()
            ctx = Context.for_job(run, job, dict(run.state) if resuming else None)
            ctx._sink = self.runner.log_sink(run, ctx)
            handle.ctx = ctx
            self.store.save_run(run)
            if self.bus.active:
                self.bus.publish(RunStarted(run.id, run.queue, run.workflow_name))
            timeout = workflow.trigger.timeout if workflow.trigger else None
            outcome: Outcome | None = None
            # One scope serves both the operator's cancel and the trigger's timeout: a cancel
            # sets `cancel_requested` first, so a scope caught without it is the timeout.
            deadline = anyio.current_time() + timeout / 1000 if timeout else math.inf
            with anyio.CancelScope(deadline=deadline) as scope:
                handle.scope = scope
                if handle.cancel_requested:
                    scope.cancel()
                outcome = await self.runner.run(workflow, run, ctx)
            if scope.cancelled_caught and not handle.cancel_requested:
                outcome = Outcome(
                    RunStatus.TIMED_OUT,
                    error=f"run timed out after {timeout}ms (the trigger's timeout)",
                )
            if handle.cancel_requested or outcome is None:
                outcome = Outcome(RunStatus.CANCELLED, error="cancelled by operator")
            self._settle(runtime, job, run, workflow, outcome)
            if run.parent_run_id is not None and run.terminal:
                self._jobs_tg.start_soon(wake_parent, self, run)  # it may be waiting on this run
        except anyio.get_cancelled_exc_class():
            # The engine is shutting down past its grace period: hand the job back.
            if handle is not None:
                self._interrupt(job, handle.run)
            raise
        except Exception as error:
            # An engine bug, not the workflow's: fail the run loudly rather than lose it.
            log.exception("internal error while running job %s", job.id)
            if handle is not None:
                handle.run.status = RunStatus.FAILED
                handle.run.error = f"internal engine error: {type(error).__name__}: {error}"
                handle.run.finished_at = utcnow()
                self.store.save_run(handle.run)
            job.error = f"internal engine error: {error}"
            runtime.queue.settle(job, JobState.FAILED)
            self._job_finished(job)
        finally:
            if handle is not None:
                self.gates.release(handle.run.id)
                self._handles.pop(handle.run.id, None)
                handle.done.set()

    def _interrupt(self, job: Job, run: Run, reason: str | None = None) -> None:
        if run.terminal:
            return  # already recorded (a crash flip beat the cancellation here)
        run.status = RunStatus.CRASHED
        run.error = reason or (
            "interrupted: the worker shut down before the run finished; "
            "the job went back to the queue"
        )
        run.finished_at = utcnow()
        self._close_open_step(run, StepStatus.FAILED, AttemptStatus.FAILED, run.error)
        self.store.save_run(run)
        job.meta["redelivered"] = True
        job.resume = False
        self._queue_of(job).settle(job, JobState.WAITING)
        if self.bus.active:
            self.bus.publish(
                RunFinished(run.id, run.queue, run.workflow_name, str(run.status), run.error)
            )

    def _queue_of(self, job: Job) -> JobQueue:
        runtime = self._runtimes.get(job.queue)
        if runtime is not None:
            return runtime.queue
        return self._queue_for(self.default_provider)

    @staticmethod
    def _close_open_step(
        run: Run, step_status: StepStatus, attempt_status: AttemptStatus, error: str
    ) -> None:
        now = utcnow()
        for step in run.steps:
            if step.status in (StepStatus.RUNNING, StepStatus.WAITING):
                step.status = step_status
                step.finished_at = now
                step.error = error
                for attempt in step.attempts:
                    if attempt.status is AttemptStatus.RUNNING:
                        attempt.status = attempt_status
                        attempt.finished_at = now
                        attempt.error = error

    def _settle(
        self, runtime: QueueRuntime, job: Job, run: Run, workflow: Workflow, outcome: Outcome
    ) -> None:
        queue = runtime.queue
        now = utcnow()
        if outcome.status is RunStatus.WAITING:
            assert outcome.wait_until is not None
            run.status = RunStatus.WAITING
            run.wait_until = outcome.wait_until
            job.resume = True
            self.store.save_run(run)
            queue.settle(job, JobState.DELAYED, run_at=outcome.wait_until)
            if self.bus.active:
                self.bus.publish(RunStatusChanged(run.id, run.queue, str(run.status)))
            return
        run.finished_at = now
        run.state = {}
        run.cursor = []
        run.error = outcome.error
        run.error_step = outcome.error_step
        next_run: Run | None = None
        if outcome.status is RunStatus.COMPLETED:
            run.status = RunStatus.COMPLETED
            run.output = outcome.output
            state = JobState.COMPLETED
            runtime.completed_times.append(time.monotonic())
            if len(runtime.completed_times) > 50_000:
                del runtime.completed_times[:25_000]
        elif outcome.status is RunStatus.CANCELLED:
            run.status = RunStatus.CANCELLED
            self._close_open_step(run, StepStatus.CANCELLED, AttemptStatus.CANCELLED, "cancelled")
            state = JobState.CANCELLED
        elif outcome.status is RunStatus.TIMED_OUT:
            run.status = RunStatus.TIMED_OUT
            self._close_open_step(
                run, StepStatus.FAILED, AttemptStatus.TIMED_OUT, outcome.error or ""
            )
            state = JobState.FAILED
        else:
            run.status = RunStatus.FAILED
            failures = int(job.meta.get("failures", 0)) + 1
            job.meta["failures"] = failures
            retries = workflow.trigger.retries if workflow.trigger else 0
            if failures <= retries:
                assert workflow.trigger is not None
                backoff = workflow.trigger.backoff_ms(failures - 1, random.random())
                job.run_id = new_id("run")
                job.run_at = now + timedelta(milliseconds=backoff)
                job.resume = False
                next_run = self._new_run(job, job_attempt=failures + 1, status=RunStatus.DELAYED)
                self.runner.engine_log(
                    run,
                    f"job attempt {failures}/{retries + 1} failed; retrying in "
                    f"{backoff / 1000:.1f}s as run {next_run.id}",
                    "warning",
                )
                state = JobState.DELAYED
            else:
                # With retries, a job that used them all up goes to the dead-letter queue.
                state = JobState.DEAD if retries > 0 else JobState.FAILED
                job.error = run.error
                if retries:
                    self.runner.engine_log(
                        run,
                        f"job {job.id} used up its {retries} retries: moved to the dead-letter queue",
                        "error",
                    )
        self.store.save_run(run)
        if next_run is not None:
            self.store.save_run(next_run)
            queue.settle(job, JobState.DELAYED, run_at=job.run_at)
        else:
            queue.settle(job, state)
        if self.bus.active:
            self.bus.publish(
                RunFinished(run.id, run.queue, run.workflow_name, str(run.status), run.error)
            )
            if next_run is not None:
                self.bus.publish(
                    RunQueued(next_run.id, next_run.queue, next_run.workflow_name, "delayed")
                )
        if next_run is None:
            self._job_finished(job)

    def _job_finished(self, job: Job) -> None:
        event = self._job_done.pop(job.id, None)
        if event is not None:
            event.set()

    # ---- housekeeping ----------------------------------------------------------------------
    async def _recover(self) -> None:
        """Boot recovery: runs that dead workers left `running` become crashed, their jobs go
        back to the queue, and pending runs of memory queues are queued again."""
        host = socket.gethostname()
        stale_before = utcnow() - timedelta(seconds=max(3 * self.heartbeat_interval, self.lease))
        dead = []
        for worker in await self.store.workers():
            if worker.id == self.worker.id or worker.id in _live_workers:
                continue
            if worker.host == host and worker.pid == os.getpid():
                gone = True  # an earlier engine of this very process that did not close
            elif worker.host == host:
                gone = not _pid_alive(worker.pid)
            else:
                gone = worker.heartbeat_at < stale_before
            if gone:
                dead.append(worker)
        if dead:
            ids = [w.id for w in dead]
            crashed = await self.store.mark_crashed(
                "crashed: its worker process "
                + ", ".join(ids)
                + " died before the run finished (found on boot)",
                workers=ids,
            )
            released = 0
            if self.db is not None:
                for worker_id in ids:
                    released += await _release_for_redelivery(self.db, worker_id)
            for worker_id in ids:
                await self.store.forget_worker(worker_id)
            if crashed or released:
                log.warning(
                    "boot recovery: %d run(s) of dead workers marked crashed, %d job(s) requeued",
                    len(crashed),
                    released,
                )
        self.store.heartbeat(self.worker)
        self._recovered_memory_runs = await self.store.pending_runs() if self.db else []

    async def _requeue_memory_runs(self) -> None:
        """Runs of memory queues survive in a durable store; queue them again after a restart."""
        for run in self._recovered_memory_runs:
            runtime = self._runtimes.get(run.queue)
            if runtime is None or runtime.queue.provider != "memory":
                continue
            job = Job(
                id=run.job_id,
                queue=run.queue,
                workflow_name=run.workflow_name,
                payload=run.input,
                headers=run.headers,
                priority=run.priority,
                run_at=run.wait_until or run.run_at,
                run_id=run.id,
                created_at=run.created_at,
                resume=run.status is RunStatus.WAITING,
                max_retries=runtime.workflow.trigger.retries if runtime.workflow.trigger else 0,
            )
            await runtime.queue.add([job], [run])
        self._recovered_memory_runs = []

    async def _heartbeat_loop(self) -> None:
        await self._requeue_memory_runs()
        while True:
            await anyio.sleep(self.heartbeat_interval)
            self.worker.heartbeat_at = utcnow()
            self.store.heartbeat(self.worker)
            for queue in self._queues.values():
                queue.renew(self.worker.id, self.lease)
            self.gates.renew()

    async def _janitor_loop(self) -> None:
        while True:
            await anyio.sleep(self.janitor_interval)
            await self.purge()

    async def purge(self) -> int:
        """Delete terminal runs older than the retention, and expired cache entries."""
        cutoff = utcnow() - self.retention
        total = 0
        while True:
            removed = await self.store.purge(cutoff, limit=500)
            total += removed
            if removed < 500:
                return total
            await anyio.lowlevel.checkpoint()  # let runs go between chunks

    async def _control_loop(self) -> None:
        assert isinstance(self.store, SqliteRunStore)
        while True:
            await anyio.sleep(0.2)
            for request in await self.store.take_control(self.worker.id):
                result = await self._handle_control(request)
                await self.store.finish_control(request.id, result)

    async def _handle_control(self, request: ControlRequest) -> dict[str, Any]:
        try:
            payload = request.payload
            if request.action == "cancel" and request.run_id:
                run = await self.cancel(request.run_id)
                return {"ok": True, "status": str(run.status)}
            if request.action == "replay" and request.run_id:
                new = await self.replay(
                    request.run_id,
                    from_step=payload.get("from_step"),
                    input=payload.get("input"),
                    force=bool(payload.get("force", False)),
                )
                return {"ok": True, "run_id": new}
            if request.action == "enqueue":
                job_id = await self.enqueue(
                    payload["queue"],
                    payload.get("payload"),
                    priority=payload.get("priority", 0),
                    delay=payload.get("delay"),
                    headers=payload.get("headers"),
                    force=bool(payload.get("force", False)),
                )
                return {"ok": True, "job_id": job_id}
            if request.action == "requeue":
                job_id = await self.requeue(payload["job_id"])
                return {"ok": True, "job_id": job_id}
            if request.action in ("pause", "resume"):
                await (self.pause if request.action == "pause" else self.resume)(payload["queue"])
                return {"ok": True}
            if request.action in ("retry_now", "start_job"):
                return await self._handle_operator_control(request)
            return {"ok": False, "error": f"unknown action {request.action!r}"}
        except EngineError as error:
            return {"ok": False, "error": str(error)}

    # ---- public API ------------------------------------------------------------------------
    def _check_payload(self, payload: Any) -> None:
        try:
            blob = json.dumps(payload)
        except (TypeError, ValueError) as error:
            raise EngineError(f"payload is not JSON-serialisable: {error}") from None
        if len(blob) > self.max_payload_bytes:
            raise EngineError(
                f"payload is {len(blob):,} bytes, above the {self.max_payload_bytes:,}-byte cap "
                "(Engine(max_payload_bytes=...) to raise it)"
            )

    def _runtime(self, queue: str) -> QueueRuntime:
        runtime = self._runtimes.get(queue)
        if runtime is None:
            known = ", ".join(sorted(self._runtimes)) or "none"
            raise UnknownQueue(f"unknown queue {queue!r} (queues: {known})")
        return runtime

    def _make_job(
        self,
        queue: str,
        payload: Any,
        *,
        priority: int = 0,
        delay: Any = None,
        job_id: str | None = None,
        headers: dict[str, str] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> tuple[QueueRuntime, Job, Run]:
        runtime = self._runtime(queue)
        self._check_payload(payload)
        if headers is not None and (
            not isinstance(headers, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
        ):
            raise EngineError("headers must be a dict of strings to strings")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise EngineError(f"priority must be an integer, not {priority!r}")
        run_at = None
        trigger = runtime.workflow.trigger
        if delay is None and trigger is not None and trigger.start_delay:
            delay = trigger.start_delay  # the delay gate: every job of this trigger waits
        if delay is not None:
            try:
                delay_ms = parse_duration(delay)
            except ValueError as error:
                raise EngineError(f"delay: {error}") from None
            if delay_ms > 0:
                run_at = utcnow() + timedelta(milliseconds=delay_ms)
        now = utcnow()
        wf = runtime.workflow
        job = construct(
            Job,
            dict(
                id=job_id or new_id("job"),
                queue=queue,
                workflow_name=wf.name,
                payload=payload,
                headers=headers or {},
                priority=priority,
                state=JobState.DELAYED if run_at else JobState.WAITING,
                run_at=run_at,
                attempts=0,
                max_retries=wf.trigger.retries if wf.trigger else 0,
                run_id=new_id("run"),
                created_at=now,
                finished_at=None,
                error=None,
                worker=None,
                resume=False,
                meta=meta or {},
            ),
        )
        run = self._new_run(job, status=RunStatus.DELAYED if run_at else RunStatus.QUEUED)
        return runtime, job, run

    async def enqueue(
        self,
        queue: str,
        payload: Any = None,
        *,
        priority: int = 0,
        delay: Any = None,
        job_id: str | None = None,
        headers: dict[str, str] | None = None,
        force: bool = False,
    ) -> str:
        """Add a job; returns its id once it is durable. A known `job_id` is not added twice.
        `force`: start it at once, even on a paused queue or past its delay (an operator's
        explicit "run this one")."""
        runtime, job, run = self._make_job(
            queue, payload, priority=priority, delay=delay, job_id=job_id, headers=headers
        )
        if job_id is not None and await runtime.queue.get_job(job_id) is not None:
            return job_id
        await self._add(runtime, [job], [run])
        if force:
            await self._start_now(runtime, job.id)
        return job.id

    async def enqueue_many(
        self, queue: str, payloads: Sequence[Any], *, priority: int = 0
    ) -> list[str]:
        """Add many jobs in one transaction."""
        made = [self._make_job(queue, p, priority=priority) for p in payloads]
        if not made:
            return []
        runtime = made[0][0]
        await self._add(runtime, [m[1] for m in made], [m[2] for m in made])
        return [m[1].id for m in made]

    async def _add(self, runtime: QueueRuntime, jobs: list[Job], runs: list[Run]) -> None:
        for run in runs:
            self.store.save_run(run)
        await runtime.queue.add(jobs, runs)
        if self.bus.active:
            for run in runs:
                self.bus.publish(RunQueued(run.id, run.queue, run.workflow_name, str(run.status)))

    async def _find_job(self, job_id: str) -> tuple[JobQueue, Job] | None:
        for queue in self._queues.values():
            job = await queue.get_job(job_id)
            if job is not None:
                return queue, job
        if self.db is not None:
            queue = self._queue_for("sqlite")
            job = await queue.get_job(job_id)
            if job is not None:
                return queue, job
        return None

    async def get_job(self, job_id: str) -> Job:
        found = await self._find_job(job_id)
        if found is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        return found[1]

    async def wait_for_job(self, job_id: str, timeout: float | None = None) -> Run:
        """The job's last run, once the job has ended (completed, cancelled, failed, dead)."""
        with anyio.fail_after(timeout):
            while True:
                # Registered before the read, so that a job ending during the read wakes us.
                event = self._job_done.setdefault(job_id, anyio.Event())
                job = await self.get_job(job_id)
                if job.state.terminal:
                    self._job_done.pop(job_id, None)
                    run = await self.store.get_run(job.run_id)
                    if run is None:
                        raise UnknownRun(f"job {job_id}'s run {job.run_id} is not in the store")
                    return run
                with anyio.move_on_after(0.25):  # the job may be run by another process
                    await event.wait()

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
        retrying: bool = False,
        stuck: float | None = None,
    ) -> list[Run]:
        """Newest first. `retrying`: still going with a failed attempt behind them; `stuck`:
        running longer than `stuck` × their workflow's median duration of completed runs."""
        try:
            where = RunFilter.of(status, workflow, queue, text, retrying=retrying, stuck=stuck)
        except ValueError as error:
            raise EngineError(f"bad filter: {error}") from None
        where = await resolve_stuck(self.store, where)
        return await self.store.list_runs(where, limit=limit, offset=offset)

    async def count_runs(self, where: RunFilter | None = None) -> int:
        if where is not None:
            where = await resolve_stuck(self.store, where)
        return await self.store.count_runs(where)

    async def cancel(self, run_id: str) -> Run:
        """Cancel a running, waiting, delayed or queued run; a finished run is an error. The
        child runs it waits on (subworkflow steps with wait=True) are cancelled with it."""
        run = await self._cancel_one(run_id)
        if run.status is RunStatus.CANCELLED:
            await cancel_waited_children(self, run)
        return run

    async def _cancel_one(self, run_id: str) -> Run:
        handle = self._handles.get(run_id)
        if handle is not None:
            handle.cancel()
            with anyio.move_on_after(5):
                await handle.done.wait()
            return await self.get_run(run_id)
        run = await self.get_run(run_id)
        if run.terminal:
            raise EngineError(f"run {run_id} has already ended ({run.status}); nothing to cancel")
        if run.status in PENDING_RUN_STATUSES:
            found = await self._find_job(run.job_id)
            if (
                found is not None
                and found[1].run_id == run_id
                and await found[0].cancel_pending(run.job_id)
            ):
                run.status = RunStatus.CANCELLED
                run.finished_at = utcnow()
                run.error = "cancelled by operator before it ran"
                self._close_open_step(
                    run, StepStatus.CANCELLED, AttemptStatus.CANCELLED, "cancelled"
                )
                self.store.save_run(run)
                await self.store.flush()
                self._job_finished(found[1])
                if self.bus.active:
                    self.bus.publish(
                        RunFinished(
                            run.id, run.queue, run.workflow_name, str(run.status), run.error
                        )
                    )
                return run
            holder = found[1].worker if found is not None else None
            if holder == self.worker.id:
                # Claimed here a moment ago; its task registers the run's handle at once.
                with anyio.move_on_after(2):
                    while run_id not in self._handles:  # noqa: ASYNC110 - a handoff within this loop
                        await anyio.sleep(0.005)
                if run_id in self._handles:
                    return await self._cancel_one(run_id)
            run = await self.get_run(run_id)
            if run.status in PENDING_RUN_STATUSES and holder and holder != self.worker.id:
                run.worker = holder  # claimed by another process, not started yet
                return await self._ask_worker("cancel", run)
        if run.status is RunStatus.RUNNING and run.worker and run.worker != self.worker.id:
            return await self._ask_worker("cancel", run)
        if run.terminal:
            return run
        raise EngineError(f"run {run_id} is {run.status} and could not be cancelled; try again")

    async def _ask_worker(self, action: str, run: Run) -> Run:
        """Hand a request to the worker process that holds the run, and wait for it."""
        request = await self.store.post_control(action, run.id, {}, target=run.worker)
        result = await wait_control(self.store, request, timeout=5)
        if result is not None and not result.get("ok"):
            raise EngineError(result.get("error", f"worker {run.worker} refused"))
        return await self.get_run(run.id)

    async def replay(
        self,
        run_id: str,
        *,
        from_step: str | None = None,
        input: Any = None,
        force: bool = False,
    ) -> str:
        """Start a new run with the same input (or `input`), `replay_of` pointing back. With
        `from_step`, steps before it are not run again: their outputs come from the source run.
        `force`: start it at once, even on a paused queue."""
        source = await self.get_run(run_id)
        runtime, job, run = self._replay_job(source, from_step=from_step, input=input)
        await self._add(runtime, [job], [run])
        if force:
            await self._start_now(runtime, job.id)
        return run.id

    def _replay_job(
        self, source: Run, *, from_step: str | None = None, input: Any = None
    ) -> tuple[QueueRuntime, Job, Run]:
        runtime = self._runtime(source.queue)
        payload = source.input if input is None else input
        meta: dict[str, Any] = {"replay_of": source.id}
        if from_step is not None:
            meta["replay_from_step"] = from_step
        _, job, run = self._make_job(
            source.queue, payload, priority=source.priority, headers=None, meta=meta
        )
        if from_step is not None:
            self._seed_from(runtime.workflow, source, run, from_step)
            job.resume = True
        return runtime, job, run

    def _seed_from(self, workflow: Workflow, source: Run, run: Run, from_step: str) -> None:
        names = [s.name for s in workflow.steps]
        if from_step not in names:
            raise EngineError(
                f"workflow {workflow.name} has no step {from_step!r} (steps: {', '.join(names)})"
            )
        index = names.index(from_step)
        done = {s.name: s for s in source.steps}
        Runner.prepare(workflow, run)
        for i in range(index):
            step = done.get(names[i])
            if step is None or step.status not in (StepStatus.COMPLETED, StepStatus.CACHED):
                raise EngineError(
                    f"cannot replay from {from_step!r}: step {names[i]!r} did not complete in "
                    f"run {source.id}"
                )
            record = run.steps[i]
            record.status = StepStatus.CACHED
            record.output = step.output
            record.input = step.input
            record.cached_from = source.id
            record.started_at = record.finished_at = utcnow()
            if workflow.steps[i].kind != "wait":  # nodes and primitives keep an output
                run.state[names[i]] = step.output
        run.cursor = [index]

    async def dead_letters(self, queue: str) -> list[Job]:
        runtime = self._runtime(queue)
        return await runtime.queue.dead_letters(queue)

    async def requeue(self, job_id: str) -> str:
        """Put a dead-lettered job back in its queue with a fresh run; returns the job id."""
        found = await self._find_job(job_id)
        if found is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        queue, job = found
        job.meta.pop("failures", None)
        try:
            runtime = self._runtime(job.queue)
        except UnknownQueue as error:
            raise EngineError(f"cannot requeue job {job_id}: {error}") from None
        job.run_id = new_id("run")
        job.run_at = None
        run = self._new_run(job)
        run.created_at = utcnow()
        try:
            await queue.requeue(job_id, run)
        except QueueError as error:
            raise EngineError(str(error)) from None
        self.store.save_run(run)
        await self.store.flush()
        runtime.queue.wake(job.queue)
        if self.bus.active:
            self.bus.publish(RunQueued(run.id, run.queue, run.workflow_name, str(run.status)))
        return job_id

    async def queue_stats(self, queue: str) -> QueueStats:
        runtime = self._runtime(queue)
        return await runtime.queue.stats(queue)

    async def queues(self) -> list[QueueInfo]:
        return [
            QueueInfo(
                name=r.name,
                workflow_name=r.workflow.name,
                provider=r.queue.provider,
                concurrency=r.concurrency,
                paused=r.paused,
            )
            for r in sorted(self._runtimes.values(), key=lambda r: r.name)
        ]

    async def throughput(self, queue: str, window: float = 10.0) -> float:
        """Completed jobs per second over the last `window` seconds, as seen by this engine."""
        runtime = self._runtimes.get(queue)
        if runtime is None:
            return 0.0
        cutoff = time.monotonic() - window
        times = runtime.completed_times
        count = len(times) - bisect.bisect_left(times, cutoff)
        return count / window

    async def workflows(self) -> list[WorkflowInfo]:
        return [
            WorkflowInfo(
                name=wf.name,
                version=wf.version,
                queue=wf.queue,
                path=wf.path,
                steps=[s.name for s in wf.steps],
            )
            for wf in sorted(self._workflows.values(), key=lambda w: w.name)
        ]

    def workflow(self, name: str) -> Workflow:
        try:
            return self._workflows[name]
        except KeyError:
            raise EngineError(f"unknown workflow {name!r}") from None

    async def workers(self) -> list[WorkerInfo]:
        return await self.store.workers()

    async def pause(self, queue: str) -> None:
        """Claim nothing new from the queue (running jobs finish); survives a restart."""
        runtime = self._runtime(queue)
        runtime.paused = True
        self._paused.add(queue)
        await self.store.set_paused(queue, True)
        runtime.poke()
        if self.bus.active:
            self.bus.publish(QueueChanged(queue))

    async def resume(self, queue: str) -> None:
        runtime = self._runtime(queue)
        runtime.paused = False
        self._paused.discard(queue)
        await self.store.set_paused(queue, False)
        runtime.poke()
        if self.bus.active:
            self.bus.publish(QueueChanged(queue))

    def events(self) -> Subscription:
        """Typed events, live, from this call on: `async for event in engine.events()`."""
        return self.bus.subscribe()

    async def serve_forever(self) -> None:
        """Block until cancelled (the CLI's worker wraps this with signal handling)."""
        await anyio.sleep_forever()

    # ---- operator tools --------------------------------------------------------------------
    async def retry_now(self, run_id: str) -> str:
        """Start at once a run that waits for its next attempt: a step sleeping in its retry
        backoff, a job in retry backoff (its next run is `delayed`), or a delayed run, even on
        a paused queue. For a failed run whose job is in backoff, the job's next run starts.
        Returns the id of the run that goes ahead."""
        wakeup = self.runner.backoff_wakeups.get(run_id)
        handle = self._handles.get(run_id)
        if wakeup is not None and handle is not None:
            self.runner.engine_log(handle.run, "retry now: the operator cut the backoff short")
            wakeup.set()
            return run_id
        run = await self.get_run(run_id)
        found = await self._find_job(run.job_id)
        if found is None:
            raise UnknownJob(f"run {run_id}'s job {run.job_id} is not in any queue")
        queue, job = found
        held = job.state is JobState.ACTIVE and job.run_id == run.id
        if handle is None and held and job.worker and job.worker != self.worker.id:
            # Another process runs it (its run row may not even say `running` yet).
            request = await self.store.post_control("retry_now", run.id, {}, target=job.worker)
            result = await wait_control(self.store, request, timeout=5)
            if result is None or not result.get("ok"):
                raise EngineError(
                    (result or {}).get("error") or f"worker {job.worker} did not answer"
                )
            return run_id
        if held or run.status is RunStatus.RUNNING:
            raise EngineError(f"run {run_id} is running an attempt; there is no backoff to skip")
        waits = job.state in (JobState.DELAYED, JobState.WAITING)
        if run.terminal and waits and job.run_id != run.id:
            run = await self.get_run(job.run_id)  # the job's next attempt
        if not waits or job.run_id != run.id or run.status not in RETRYABLE_NOW:
            raise EngineError(
                f"run {run.id} is {run.status}: retry now starts a run in retry backoff or a "
                "delayed run"
            )
        runtime = self._runtimes.get(run.queue)
        if runtime is not None and await self._start_now(runtime, job.id):
            return run.id
        if await queue.make_due(job.id) is None:
            raise EngineError(f"run {run.id} was taken by a worker meanwhile")
        return run.id

    async def cancel_many(
        self, runs: RunFilter | Sequence[str], *, progress: ProgressCallback | None = None
    ) -> BulkResult:
        """Cancel every run the filter matches (or these run ids) that has not ended."""
        targets = await self._bulk_targets(runs)

        async def cancel(target: Run | str) -> None:
            run = await self._bulk_run(target)
            if run.terminal:
                raise Skip("already ended")
            for _ in range(CANCEL_TRIES):
                try:
                    after = await self.cancel(run.id)
                    break
                except EngineError as error:
                    if "try again" not in str(error):
                        raise Skip(_reason(error, run.id)) from None
                    # Claimed this very moment: its task has not started yet.
                    await anyio.sleep(0.05)
            else:
                raise Skip("changed hands while being cancelled")
            if after.status is not RunStatus.CANCELLED:
                raise Skip(f"ended as {after.status} before the cancel took")

        return await run_bulk("cancel", targets, _target_id, cancel, progress)

    async def replay_many(
        self,
        runs: RunFilter | Sequence[str],
        *,
        from_step: str | None = None,
        progress: ProgressCallback | None = None,
    ) -> BulkResult:
        """Replay every finished run the filter matches (or these run ids), each as a new run
        with `replay_of` pointing back; `result.replayed` maps source run to new run."""
        targets = await self._bulk_targets(runs)

        async def replay(target: Run | str) -> str:
            source = await self._bulk_run(target, full=from_step is not None)
            if not source.terminal:
                raise Skip("not finished yet")
            try:
                runtime, job, run = self._replay_job(source, from_step=from_step)
            except EngineError as error:
                raise Skip(_reason(error, source.id)) from None
            await self._add(runtime, [job], [run])
            return run.id

        return await run_bulk("replay", targets, _target_id, replay, progress)

    async def requeue_many(
        self, jobs: RunFilter | Sequence[str], *, progress: ProgressCallback | None = None
    ) -> BulkResult:
        """Put dead-lettered (or failed) jobs back in their queues: these job ids, or the jobs
        of the runs a filter matches. Jobs that are not dead or failed are skipped."""
        if isinstance(jobs, RunFilter):
            runs = await matching_runs(self.store, await resolve_stuck(self.store, jobs))
            job_ids = list(dict.fromkeys(run.job_id for run in runs))
        else:
            job_ids = list(dict.fromkeys(jobs))

        async def requeue(job_id: str) -> None:
            try:
                await self.requeue(job_id)
            except UnknownJob:
                raise Skip("unknown job") from None
            except EngineError as error:
                raise Skip(_reason(error, job_id)) from None

        return await run_bulk("requeue", job_ids, str, requeue, progress)

    async def requeue_dead(
        self, queue: str, *, progress: ProgressCallback | None = None
    ) -> BulkResult:
        """Requeue every dead letter of the queue."""
        runtime = self._runtime(queue)
        dead = await runtime.queue.dead_letters(queue, limit=10_000_000)
        return await self.requeue_many([job.id for job in dead], progress=progress)

    async def stuck_runs(self, factor: float = 3.0, limit: int = 100) -> list[Run]:
        """Runs going longer than `factor` × their workflow's median completed duration."""
        return await self.runs(stuck=factor, limit=limit)

    async def _bulk_targets(self, runs: RunFilter | Sequence[str]) -> list[Run | str]:
        if isinstance(runs, RunFilter):
            return list(await matching_runs(self.store, await resolve_stuck(self.store, runs)))
        if isinstance(runs, str):
            raise EngineError("pass a RunFilter or a list of run ids, not one id")
        return list(dict.fromkeys(runs))

    async def _bulk_run(self, target: Run | str, *, full: bool = False) -> Run:
        """The run to act on: the filter's snapshot of it, or a fresh read."""
        if isinstance(target, Run) and not full:
            return target
        run = await self.store.get_run(_target_id(target))
        if run is None:
            raise Skip("unknown run")
        return run

    async def _start_now(self, runtime: QueueRuntime, job_id: str) -> bool:
        """Run this one job now, past the queue's pause, order and run_at: here if this engine
        works the queue, else through a worker process that does. False if none took it."""
        if self._serves(runtime):
            return await self._run_here(runtime, job_id)
        return await self._ask_any_worker("start_job", {"job_id": job_id, "queue": runtime.name})

    def _serves(self, runtime: QueueRuntime) -> bool:
        return self.consume and not self._stopping and self._runtimes.get(runtime.name) is runtime

    async def _run_here(self, runtime: QueueRuntime, job_id: str) -> bool:
        job = await runtime.queue.take(job_id, self.worker.id)
        if job is None:
            return False  # claimed meanwhile, ended, or a queue that cannot single one out
        runtime.active += 1  # may go above the concurrency for a moment: asked for explicitly
        self._jobs_tg.start_soon(self._work, runtime, job)
        return True

    async def _ask_any_worker(self, action: str, payload: dict[str, Any]) -> bool:
        if not isinstance(self.store, SqliteRunStore):
            return False
        for worker in await self.store.workers():
            if worker.id == self.worker.id:
                continue
            request = await self.store.post_control(action, None, payload, target=worker.id)
            result = await wait_control(self.store, request, timeout=5)
            if result is not None and result.get("ok"):
                return True
        return False

    async def _handle_operator_control(self, request: ControlRequest) -> dict[str, Any]:
        if request.action == "retry_now" and request.run_id:
            return {"ok": True, "run_id": await self.retry_now(request.run_id)}
        if request.action == "start_job":
            runtime = self._runtimes.get(request.payload.get("queue", ""))
            if runtime is None or not self._serves(runtime):
                return {"ok": False, "error": f"worker {self.worker.id} does not work that queue"}
            return {"ok": await self._run_here(runtime, request.payload["job_id"])}
        return {"ok": False, "error": f"unknown action {request.action!r}"}

    async def _pause_sync_loop(self) -> None:
        """Pauses live in the shared database: follow those made by other processes."""
        while True:
            await anyio.sleep(PAUSE_SYNC_INTERVAL)
            before = set(self._paused)
            stored = await self.store.paused_queues()
            if stored == before or self._paused != before:
                continue  # unchanged, or paused / resumed here meanwhile: next round
            self._paused = stored
            for runtime in self._runtimes.values():
                paused = runtime.name in stored
                if paused != runtime.paused:
                    runtime.paused = paused
                    runtime.poke()
                    if self.bus.active:
                        self.bus.publish(QueueChanged(runtime.name))


# Runs that retry_now can start: a delayed run (job backoff, or enqueued with a delay) and a
# queued one (on a paused queue).
RETRYABLE_NOW = frozenset({RunStatus.DELAYED, RunStatus.QUEUED})
PAUSE_SYNC_INTERVAL = 1.0
CANCEL_TRIES = 5


def _target_id(target: Run | str) -> str:
    return target.id if isinstance(target, Run) else target


def _reason(error: Exception, ident: str) -> str:
    """An error as a skip reason that many items share: without the item's id."""
    return str(error).replace(f" {ident}", "").replace(f" {ident!r}", "")


async def wait_control(store: RunStore, request: int, timeout: float) -> dict[str, Any] | None:
    """The result of a control request, or None if no worker answered in time."""
    with anyio.move_on_after(timeout):
        while True:
            result = await store.control_result(request)
            if result is not None:
                return result
            await anyio.sleep(0.05)  # another process writes it: there is no event to await
    return None


def _step_shape(steps: Sequence[Any]) -> list[Any]:
    """Names and kinds of steps, nested lists included: what a run's cursor refers to."""
    return [(s.name, s.kind, [_step_shape(branch) for branch in s.children()]) for s in steps]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def _release_for_redelivery(db: SqliteDatabase, worker_id: str) -> int:
    def release(conn: Any) -> int:
        # Only a job whose run was really crashed gets a new run; one that was claimed but not
        # started yet keeps its queued run.
        cursor = conn.execute(
            "UPDATE jobs SET state = 'waiting', worker = NULL, lease_until = NULL, resume = 0,"
            " meta = CASE WHEN (SELECT status FROM runs WHERE runs.id = jobs.run_id) = 'crashed'"
            " THEN json_set(coalesce(meta, '{}'), '$.redelivered', json('true')) ELSE meta END"
            " WHERE worker = ? AND state = 'active'",
            (worker_id,),
        )
        return cursor.rowcount

    return await db.run_claim(release)
