"""The Engine: one `async with` that opens a backend and puts together the catalog of workflows,
the worker that runs them, and the operator API.

    async with Engine(workflows="workflows/", database=".blok/blok.db") as engine:
        job_id = await engine.enqueue("orders", {...})

With no workflows (or `consume=False`) it runs nothing: it is a producer and an operator client
of the workers that share its database, and follows what they write as events.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup

from . import telemetry
from .backends import describe, open_backend
from .backends.base import Backend, EventMessage
from .catalog import Catalog, WorkflowSource
from .chores import Chores
from .durations import parse_duration
from .errors import DatabaseError, EngineError, UnknownJob, UnknownRun, ambiguous_start
from .events import EventBus, Subscription
from .feed import Follower
from .filters import RunFilter
from .health import Health
from .ledger import Ledger
from .liveness import Orphan, orphaned, this_process, worker_alive, worker_state
from .loader import import_limit
from .mailbox import Mailbox
from .models import (
    LIVE_RUN_STATUSES,
    EventSent,
    Job,
    QueueInfo,
    QueueStats,
    Run,
    WorkerInfo,
    WorkflowInfo,
    utcnow,
)
from .operations import BulkResult, ProgressCallback, median_duration
from .operator import DEFAULT_MAX_PAYLOAD_BYTES, Operator
from .primitives import global_middleware, run_middleware
from .runner import Runner
from .scheduler import ScheduleInfo, Scheduler, Schedules, scheduling_disabled
from .versions import version_splits
from .waiting import WaitReason, explain
from .watchdog import WATCHDOG_S
from .whereabouts import ask_where
from .worker import Worker
from .workflow import Workflow

log = logging.getLogger("blok.engine")

_live_workers: set[str] = set()  # engines alive in this process, for recovery
EXIT_CODE_RUNNING = 3  # the process exits with this when a stopped run's code still ran


def _worker_id() -> str:
    """Host, pid and a random tag, as Sidekiq names its processes. Host and pid alone are not
    unique: machines share host names (VMs cloned from one image, containers on the host's
    network) and cloned machines starting the same service often give it the same pid. Two
    workers under one id renewed each other's leases (a renewal is by worker), so the jobs of
    the one that died were never taken over while the other lived."""
    while True:
        worker_id = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        if worker_id not in _live_workers:  # another engine of this process: tell them apart
            return worker_id


def switched_on(value: bool | None, disabled_by: str) -> bool:
    """An operator switch: the Engine argument when given, else on unless the seed's
    environment variable `disabled_by` is set ("1", "true", "yes" or "on")."""
    if value is not None:
        return value
    return os.environ.get(disabled_by, "").strip().lower() not in ("1", "true", "yes", "on")


def _ms(value: str | int | float | timedelta, what: str) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds() * 1000
    try:
        return float(parse_duration(value))
    except ValueError as error:
        raise EngineError(f"{what}: {error}") from None


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an engine can do, for a UI that adapts to it instead of probing."""

    runs_workflows: bool  # it runs jobs here (else it is a client of other workers)
    hot_reload: bool  # it reloads workflow files as they change
    shared: bool  # other processes can serve (and act on) the same database
    location: str  # "memory", a path, or a URL without its password


class Engine:
    """The workflow engine. Use as `async with Engine(workflows=..., database=...) as engine`."""

    def __init__(
        self,
        workflows: WorkflowSource = None,
        database: str | os.PathLike[str] | None = None,
        *,
        provider: str | None = None,
        watch: bool = False,
        lease: str | int | float | timedelta = "30s",
        retention: str | int | float | timedelta = timedelta(days=7),
        janitor_interval: float = 60.0,
        grace_period: float = 10.0,
        heartbeat: float | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        snapshot_cap: int | None = None,
        consume: bool = True,
        follow: bool | None = None,
        create: bool = True,
        import_timeout: float | None = None,
        state_snapshots: bool | None = None,
        concurrency_keys: bool | None = None,
        scheduling: bool | None = None,
        janitor: bool | None = None,
        crash_recovery: bool | None = None,
        watchdog: float | None = WATCHDOG_S,
        exit_when_stuck: bool = True,
    ) -> None:
        """`lease`: how long a claimed job stays this worker's without a renewal (a number is
        seconds; a string a duration). `consume=False`: run nothing here. `follow`: publish
        what other processes write as events (default: when this engine runs nothing itself).
        `create=False`: refuse a database that does not exist instead of making one.

        The seed's operator switches, each on unless turned off here or by its environment
        variable: `state_snapshots` (BLOK_STATE_SNAPSHOT_DISABLED: ctx.state is not saved at
        a wait; a run resuming in another process starts with an empty state),
        `concurrency_keys` (BLOK_CONCURRENCY_DISABLED: WorkerTrigger.concurrency_key limits
        nothing), `scheduling` (BLOK_SCHEDULING_DISABLED: no debounce, start_delay or ttl),
        `janitor` (BLOK_JANITOR_DISABLED: nothing is purged), `crash_recovery`
        (BLOK_CRASH_AUTOFLIP_DISABLED: runs of dead workers are not recorded crashed and
        their jobs released at boot; jobs whose lease ran out are still taken over).

        `import_timeout`: seconds a workflow file's import may take before it is reported as
        failed (default: BLOK_IMPORT_TIMEOUT, else 30).

        `watchdog`: seconds the event loop may stand still before a thread logs which step
        blocks it (None: no watchdog)."""
        self.database: Path | str | None = (
            None
            if database is None
            else (os.fspath(database) if "://" in os.fspath(database) else Path(database))
        )
        self._database = database
        self._default_provider = provider
        self.watch = watch
        self.lease = lease if isinstance(lease, int | float) else _ms(lease, "lease") / 1000
        if not self.lease > 0:
            raise EngineError(f"lease must be above 0, not {lease!r}")
        self.retention = timedelta(milliseconds=_ms(retention, "retention"))
        self.janitor_interval = janitor_interval
        self.grace_period = grace_period
        # A run whose code does not stop at a stop: exit the process (the code ends with it)
        # rather than let its job be taken over while it still runs. An app that embeds the
        # engine may prefer to keep its process and accept that risk.
        self.exit_when_stuck = exit_when_stuck
        # Leases are renewed well before they run out: three times per lease at least.
        self.heartbeat_interval = min(heartbeat or 2.0, self.lease / 3)
        self.max_payload_bytes = max_payload_bytes
        self.consume = consume
        self._follow = follow
        self._create = create
        self.bus = EventBus()
        self.worker = WorkerInfo(
            id=_worker_id(),
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=utcnow(),
            heartbeat_at=utcnow(),
            process=this_process(),
        )
        self.catalog = Catalog(
            workflows,
            self.bus,
            check=self._check_provider,
            import_timeout=import_limit() if import_timeout is None else import_timeout,
        )
        env_cap = os.environ.get("BLOK_STATE_SNAPSHOT_MAX_BYTES", "")
        self._snapshot_cap = snapshot_cap or (int(env_cap) if env_cap.isdigit() else None)
        self.state_snapshots = switched_on(state_snapshots, "BLOK_STATE_SNAPSHOT_DISABLED")
        self.concurrency_keys = switched_on(concurrency_keys, "BLOK_CONCURRENCY_DISABLED")
        self.scheduling = switched_on(scheduling, "BLOK_SCHEDULING_DISABLED")
        self.janitor = switched_on(janitor, "BLOK_JANITOR_DISABLED")
        self.crash_recovery = switched_on(crash_recovery, "BLOK_CRASH_AUTOFLIP_DISABLED")
        self.watchdog = watchdog
        self._backend: Backend | None = None
        self._operator: Operator | None = None
        self._serving: Worker | None = None
        self._follower: Follower | None = None
        self._chores: Chores | None = None
        self._mailbox: Mailbox | None = None
        self._schedules: Schedules | None = None
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None
        self._stopping = False
        self._writing: anyio.CancelScope | None = None  # a stop's last flush (force_stop cuts it)
        self._forced = False  # force_stop was called: every later wait of the stop is cut

    # ---- configuration ---------------------------------------------------------------------
    @property
    def import_timeout(self) -> float:
        return self.catalog.import_timeout

    @import_timeout.setter
    def import_timeout(self, value: float) -> None:
        self.catalog.import_timeout = value

    @property
    def default_provider(self) -> str | None:
        return self._default_provider or os.environ.get("BLOK_WORKER_ADAPTER") or None

    def _provider_of(self, wf: Workflow) -> str | None:
        return (wf.trigger.provider if wf.trigger else None) or self.default_provider

    def _check_provider(self, wf: Workflow) -> None:
        if wf.trigger is None or self._backend is None:
            return
        try:
            self._backend.queue(self._provider_of(wf))
        except ValueError as error:
            if not (wf.trigger.provider or self._default_provider):
                # Named nowhere in the code: the user has to be told where it came from.
                adapter = os.environ.get("BLOK_WORKER_ADAPTER")
                raise EngineError(f"BLOK_WORKER_ADAPTER={adapter!r}: {error}") from None
            raise EngineError(str(error)) from None

    @property
    def capabilities(self) -> Capabilities:
        backend = self.backend
        return Capabilities(
            runs_workflows=self._serving is not None,
            hot_reload=self.watch and self.catalog.folder is not None,
            shared=backend.multi_process,
            location=describe(self._database),
        )

    def now(self) -> datetime:
        """Now, on the clock this engine's times are on: its database's (PostgreSQL: the
        server's, so a run started on another machine reads "3s ago" here too)."""
        return self.backend.clock.now()

    def out_of_reach_since(self) -> datetime | None:
        """Since when the database cannot be reached (PostgreSQL: its connections lost, none
        made again since); None while it can be. Reads and writes wait for it meanwhile, so
        what a reader shows is from before."""
        since = self.backend.out_of_reach_since()
        return datetime.fromtimestamp(since, UTC) if since is not None else None

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise EngineError("the engine is not started: use `async with Engine(...)`")
        return self._backend

    @property
    def operator(self) -> Operator:
        if self._operator is None:
            raise EngineError("the engine is not started: use `async with Engine(...)`")
        return self._operator

    @property
    def reload_errors(self) -> dict[str, str]:
        """{path: message} for workflow files that failed to load (here, or in the workers
        this engine follows)."""
        errors = dict(self._follower.reload_errors) if self._follower is not None else {}
        errors.update(self.catalog.reload_errors)
        return errors

    # ---- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> Engine:
        stack = AsyncExitStack()
        await stack.__aenter__()
        self._stack = stack
        try:
            _live_workers.add(self.worker.id)
            stack.callback(_live_workers.discard, self.worker.id)
            serving = self.consume and self.catalog.source is not None
            backend = open_backend(
                self._database, create=self._create, lease_s=self.lease, worker=serving
            )
            await stack.enter_async_context(backend)
            self._backend = backend
            self.worker.started_at = self.worker.heartbeat_at = backend.clock.now()
            ledger = Ledger(backend, self.bus)
            ledger.on_run_ended.append(telemetry.activate().run_finished)
            self._tg = tg = await stack.enter_async_context(anyio.create_task_group())
            self.catalog.load_initial()
            self._operator = operator = Operator(
                backend,
                ledger,
                self.catalog,
                provider_of=self._provider_of,
                max_payload_bytes=self.max_payload_bytes,
                scheduling=self.scheduling,
            )
            self._mailbox = Mailbox(backend, ledger)
            self._schedules = Schedules(backend, operator)
            if serving:
                runner = Runner(
                    operator, self.bus, snapshots=self.state_snapshots, clock=backend.clock
                )
                if self._snapshot_cap:
                    runner.snapshot_cap = self._snapshot_cap
                runner.backoffs.takes_over = self.catalog.takes_over
                self.catalog.on_change.append(runner.backoffs.reloaded)
                runner.middleware = functools.partial(
                    run_middleware, global_names=global_middleware()
                )
                self._serving = operator.worker = Worker(
                    backend=backend,
                    ledger=ledger,
                    catalog=self.catalog,
                    runner=runner,
                    bus=self.bus,
                    info=self.worker,
                    lease_s=self.lease,
                    renew_s=self.heartbeat_interval,
                    provider=self._provider_of,
                    guard=self._guard,
                    scheduling=self.scheduling,
                    concurrency=self.concurrency_keys,
                    watchdog_s=self.watchdog,
                    memory_runs_s=self.janitor_interval,
                )
            if self._serving is not None:
                self._chores = Chores(
                    backend,
                    ledger,
                    self.worker,
                    lease_s=self.lease,
                    heartbeat_s=self.heartbeat_interval,
                    retention=self.retention,
                    janitor_interval=self.janitor_interval,
                    alive_here=_live_workers,
                    janitor=self.janitor,
                    recovery=self.crash_recovery,
                )
                await self._chores.recover()  # before claiming: dead workers' jobs go back
                scheduler = None
                if not scheduling_disabled():
                    scheduler = Scheduler(backend, ledger, operator, self.catalog)
                    await scheduler.declare()  # its schedules are listed once it has started
                await self._serving.start(tg)
                # Started means seen: what it serves is committed before `async with` enters.
                await backend.runs.flush()
                tg.start_soon(self._guard(self._chores.loop))
                # A task of its own, not nested in the loop's: an error of either (a database
                # dropped) reaches the guard as itself, not in an exception group.
                tg.start_soon(self._guard(self._chores.dead_here))
                if scheduler is not None:
                    tg.start_soon(self._guard(scheduler.loop))
                telemetry.OBSERVE.sample_queues(tg, operator, self._serving.runtimes.keys)
            follow = self._follow
            if follow is None:
                follow = self._serving is None and backend.multi_process
            if follow:
                self._follower = Follower(backend, self.bus)
                ledger.told = self._follower.told
                await self._follower.prime()
                tg.start_soon(self._guard(self._follower.loop))
            folder = self.catalog.folder
            if self.watch and folder is not None:
                from .reload import watch_folder

                tg.start_soon(self._guard(watch_folder), self.catalog, folder)
        except BaseException:
            # The housekeepers already started (a writer) would keep the task group open.
            if self._tg is not None:
                self._tg.cancel_scope.cancel()
            await stack.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        assert self._stack is not None
        cancelled = anyio.get_cancelled_exc_class()
        if exc is not None and not isinstance(exc, cancelled):
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
                # The body's own exception is not the background tasks' business: the stack
                # is closed as if the body ended well, so the task group does not wrap it.
                suppressed = await self._stack.__aexit__(
                    *((exc_type, exc, tb) if isinstance(exc, cancelled) else (None, None, None))
                )
            except BaseException as error:
                # One of the engine's own tasks failed: the task group re-raises it here.
                if not isinstance(error, cancelled):
                    self._crash_in_flight(error)
                if exc is not None and not isinstance(exc, cancelled):
                    raise exc from error
                raise
            finally:
                self.bus.close()
        # Only a cancellation is ever ours to swallow (`shutdown()` called in the body).
        return bool(suppressed) and isinstance(exc, cancelled)

    async def shutdown(self, grace_period: float | None = None) -> None:
        """Stop claiming, let running jobs finish within the grace period (cut short by
        `force_stop()`), then stop the rest: each such run is recorded where it stopped and
        its job goes back to the queue, to go on from there — a stop is not a crash.

        A run whose code does not stop (a sync node's thread, async code ignoring the cancel)
        is recorded but its job is not handed back while that code runs: the process exits
        (status 3) once everything is written, which ends the code; the job's lease then runs
        out, or a worker starting on the database finds this process gone, and the run goes on
        there."""
        if self._stopping:
            return
        self._stopping = True
        grace = self.grace_period if grace_period is None else grace_period
        # A database out of reach is waited for a lease past the grace, not for ever.
        until = anyio.current_time() + grace + self.lease
        held: list[str] = []
        if self._serving is not None:
            held = await self._serving.drain(grace, until)
        if self._backend is not None:
            # Shielded, but not for ever: a database out of reach held the stop until it came
            # back (a second signal cuts it, as the worker's waits).
            with anyio.CancelScope(deadline=until, shield=True) as writing:
                self._writing = writing
                if self._forced:
                    writing.cancel()  # a second signal came before this wait: it cuts it too
                await self._backend.runs.flush()
            if writing.cancelled_caught:
                log.error("stopped with writes the database did not take: it did not answer")
        if held and not self.exit_when_stuck:
            log.critical(
                "run(s) %s did not stop; their jobs stay this worker's until the lease runs "
                "out (Engine(exit_when_stuck=False)): another worker may then run them while "
                "this code still does",
                ", ".join(held),
            )
        elif held:
            log.critical(
                "exiting the process now: the code of run(s) %s did not stop and cannot be "
                "stopped otherwise; their jobs go on elsewhere once this process is gone",
                ", ".join(held),
            )
            logging.shutdown()
            os._exit(EXIT_CODE_RUNNING)
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    @property
    def in_flight(self) -> int:
        """Runs this engine is running right now (0 for a client of other workers): what a
        stop interrupts."""
        return len(self._serving.handles) if self._serving is not None else 0

    def force_stop(self) -> None:
        """Cut the grace period of a shutdown under way short (a second SIGTERM or Ctrl-C):
        runs still going are stopped now, recorded, and their jobs handed back if their code
        stopped."""
        self._forced = True
        if self._serving is not None:
            self._serving.force()
        if self._writing is not None:
            self._writing.cancel()

    def _guard(
        self, task: Callable[..., Awaitable[None]]
    ) -> Callable[..., Coroutine[Any, Any, None]]:
        """One of the engine's own tasks: if it fails, the runs in flight are recorded as
        crashed with its error before the task group tears everything down."""

        async def guarded(*args: Any) -> None:
            try:
                await task(*args)
            except Exception as error:
                name = getattr(task, "__name__", task)
                if isinstance(error, DatabaseError):  # one line: what the database said
                    log.error("engine task %s stopped: %s", name, error)
                else:
                    log.exception("engine task %s failed", name)
                self._crash_in_flight(error)
                raise

        return guarded

    def _crash_in_flight(self, error: BaseException) -> None:
        """The process is going down with an error: record the runs it holds as crashed and
        hand their jobs back, committed now, before anything else can fail."""
        if self._serving is not None:
            self._serving.crash_in_flight(error)
        if self._backend is not None:
            try:
                self._backend.flush_now()
            except Exception:
                log.exception("could not record the in-flight runs as crashed")

    async def serve_forever(self) -> None:
        """Block until cancelled (the CLI's worker wraps this with signal handling)."""
        await anyio.sleep_forever()

    def events(self) -> Subscription:
        """Typed events, live, from this call on: `async for event in engine.events()`."""
        return self.bus.subscribe()

    async def purge(self) -> int:
        """Delete terminal runs older than the retention, and expired cache entries."""
        chores = self._chores or Chores(
            self.backend,
            Ledger(self.backend, self.bus),
            self.worker,
            lease_s=self.lease,
            heartbeat_s=self.heartbeat_interval,
            retention=self.retention,
            janitor_interval=self.janitor_interval,
        )
        return await chores.purge()

    async def flush(self) -> None:
        """Wait until everything written so far is committed (visible to other processes)."""
        await self.backend.runs.flush()

    # ---- workflows -------------------------------------------------------------------------
    def workflow(self, name: str) -> Workflow:
        wf = self.catalog.workflow(name)
        if wf is None:
            raise EngineError(f"unknown workflow {name!r}")
        return wf

    async def workflows(self) -> list[WorkflowInfo]:
        return await self.operator.workflows()

    # ---- the operator API ------------------------------------------------------------------
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
        retries: int | None = None,
        timeout: Any = None,
    ) -> str:
        """Add a job; returns its id once it is durable. A known `job_id` is not added twice.
        `force`: start it at once, even on a paused queue or past its delay (an operator's
        explicit "run this one"). `retries` and `timeout` (a duration) replace the trigger's
        for this job (the seed's dispatch options)."""
        return await self.operator.enqueue(
            queue,
            payload,
            priority=priority,
            delay=delay,
            job_id=job_id,
            headers=headers,
            force=force,
            retries=retries,
            timeout=timeout,
        )

    async def enqueue_many(
        self, queue: str, payloads: Sequence[Any], *, priority: int = 0
    ) -> list[str]:
        """Add many jobs in one transaction."""
        return await self.operator.enqueue_many(queue, payloads, priority=priority)

    async def get_job(self, job_id: str) -> Job:
        return await self.operator.get_job(job_id)

    async def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """Job id → job, read at once (one read a queue); an id no queue has is left out."""
        return await self.operator.get_jobs(job_ids)

    async def wait_for_job(self, job_id: str, timeout: float | None = None) -> Run:
        """The job's last run, once the job has ended (completed, cancelled, failed, dead)."""
        return await self.operator.wait_for_job(job_id, timeout)

    async def get_run(self, run_id: str) -> Run:
        return await self.operator.get_run(run_id)

    async def find_run(self, word: str, *, going: bool = False) -> Run:
        """The run `word` names: its id, the start of its id (with or without `run_`, as the
        console shows ids shortened and git finds a commit) or its job's id (the job's current
        run). The console's `:run` and the command line's RUN_ID arguments go through here.
        None found, or the start of several ids: an EngineError that says so. `going`: the
        start of several ids of which one run has not ended is that one (`where`, `cancel`:
        the console shortens an id only among the runs it lists, and its "1a24c873" of a
        stuck run was the start of 40 in the database)."""
        try:
            return await self.operator.get_run(word)
        except UnknownRun:
            if not word:
                raise
        if word.startswith("job_"):
            return await self._run_of_job(word)
        prefix = word if word.startswith("run_") else f"run_{word}"
        found = await self.backend.runs.list_runs(RunFilter(id_prefix=prefix), limit=6)
        if len(found) > 1 and going:
            live = RunFilter(id_prefix=prefix, status=LIVE_RUN_STATUSES)
            found = await self.backend.runs.list_runs(live, limit=6) or found
        if not found:
            how = "" if word.startswith("run_") else ": no run id starts with it"
            raise UnknownRun(f"unknown run {word!r}{how}")
        if len(found) > 1:
            # Each with what tells it apart: the console shows ids only as short as its rows
            # need, and "1a24c873" of a stuck run was the start of forty.
            named = [f"{run.id} {run.workflow_name} {run.status}" for run in found]
            raise ambiguous_start(word, "run ids", named, more=len(found) > 5)
        return await self.operator.get_run(found[0].id)

    async def _run_of_job(self, word: str) -> Run:
        """The current run of the job `word` names: its id, or the start of one job's id (the
        runs view shows a job's id as it shows a run's: `show job_1a24d10d5db6` was refused)."""
        try:
            job = await self.operator.get_job(word)
        except UnknownJob:
            found = await self.backend.runs.list_runs(RunFilter(job_id_prefix=word), limit=50)
            jobs = sorted({run.job_id for run in found})
            if not jobs:
                raise
            if len(jobs) > 1:
                raise ambiguous_start(word, "job ids", jobs) from None
            job = await self.operator.get_job(jobs[0])
        return await self.operator.get_run(job.run_id)

    async def runs(
        self,
        status: str | list[str] | None = None,
        workflow: str | None = None,
        queue: str | None = None,
        limit: int | None = 100,
        *,
        text: str | None = None,
        offset: int = 0,
        retrying: bool = False,
        stuck: float | None = None,
        replay_of: str | None = None,
        since: datetime | None = None,
    ) -> list[Run]:
        """Newest first, at most `limit` (None: every run that matches). `text`: in the id,
        job id, workflow, version, queue, status, error or input; `retrying`: still going with
        a failed attempt behind them; `stuck`: running longer than `stuck` × their workflow's
        median duration of completed runs; `replay_of`: the replays of that run; `since`:
        created at or after that moment."""
        return await self.operator.runs(
            status,
            workflow,
            queue,
            limit,
            text=text,
            offset=offset,
            retrying=retrying,
            stuck=stuck,
            replay_of=replay_of,
            since=since,
        )

    async def count_runs(self, where: RunFilter | None = None) -> int:
        return await self.operator.count_runs(where)

    async def cancel(self, run_id: str) -> Run:
        """Cancel a running, waiting, delayed or queued run; a finished run is an error. The
        child runs it waits on (subworkflow steps with wait=True) are cancelled with it."""
        return await self.operator.cancel(run_id)

    async def replay(
        self,
        run_id: str,
        *,
        from_step: str | None = None,
        input: Any = None,
        force: bool = False,
    ) -> str:
        """Start a new run with the same input (or `input`), `replay_of` pointing back."""
        return await self.operator.replay(run_id, from_step=from_step, input=input, force=force)

    async def replay_warning(self, run_id: str) -> str | None:
        """Why replaying the run would do again what is done or under way, in a clause ("its
        job job_… completed on a later delivery (run run_…)", "it was replayed as run run_…,
        which is throttled and has not ended"), else None. Asked about; never refused."""
        return await self.operator.replay_warning(run_id)

    async def replayed_among(self, runs: Sequence[Run]) -> set[str]:
        """The ids of those runs replayed already: a bulk replay leaves them out."""
        return await self.operator.replayed_among(runs)

    async def requeue(self, job_id: str, *, force: bool = False) -> str:
        """Put a dead-lettered job back in its queue with a fresh run and retry budget. Refused
        (`ReplayedAlready`) if a replay of its run completed or has not ended yet, unless `force`:
        it would run the job's steps again."""
        return await self.operator.dead.requeue(job_id, force=force)

    async def find_dead_letter(self, word: str) -> Job:
        """The job `word` names: its id, or the start of a dead letter's id (with or without
        `job_`), as the console shows it (`requeue` and `discard` take either)."""
        return await self.operator.dead.find(word)

    async def discard(self, job_id: str) -> str:
        """Take a dead-lettered job out of the dead-letter queue for good: it is cancelled and
        never runs again; its runs stay readable until the retention takes them."""
        return await self.operator.dead.discard(job_id)

    async def retry_now(self, run_id: str) -> str:
        """Start at once a run waiting for its next attempt; the id of the run that goes."""
        return await self.operator.retry_now(run_id)

    async def cancel_many(
        self, runs: RunFilter | Sequence[str], *, progress: ProgressCallback | None = None
    ) -> BulkResult:
        return await self.operator.cancel_many(runs, progress=progress)

    async def replay_many(
        self,
        runs: RunFilter | Sequence[str],
        *,
        from_step: str | None = None,
        progress: ProgressCallback | None = None,
    ) -> BulkResult:
        return await self.operator.replay_many(runs, from_step=from_step, progress=progress)

    async def requeue_many(
        self,
        jobs: RunFilter | Sequence[str],
        *,
        force: bool = False,
        progress: ProgressCallback | None = None,
    ) -> BulkResult:
        return await self.operator.dead.requeue_many(jobs, force=force, progress=progress)

    async def requeue_dead(
        self, queue: str, *, force: bool = False, progress: ProgressCallback | None = None
    ) -> BulkResult:
        return await self.operator.dead.requeue_dead(queue, force=force, progress=progress)

    async def discard_many(
        self, jobs: RunFilter | Sequence[str], *, progress: ProgressCallback | None = None
    ) -> BulkResult:
        return await self.operator.dead.discard_many(jobs, progress=progress)

    async def discard_dead(
        self, queue: str, *, progress: ProgressCallback | None = None
    ) -> BulkResult:
        return await self.operator.dead.discard_dead(queue, progress=progress)

    async def stuck_runs(self, factor: float = 3.0, limit: int | None = 100) -> list[Run]:
        return await self.operator.stuck_runs(factor, limit)

    async def dead_letters(self, queue: str, *, limit: int | None = 1000) -> list[Job]:
        """The queue's dead jobs, the last to die first: at most `limit` (None: all)."""
        return await self.operator.dead.listed(queue, limit=limit)

    async def queue_stats(self, queue: str) -> QueueStats:
        return await self.operator.queue_stats(queue)

    def served_queues(self) -> list[str]:
        """The queues this engine's own workflows serve, by name; `queues()` lists every queue
        of the database, other workers' too."""
        return sorted(self.catalog.served()) if self.consume else []

    async def queues(self) -> list[QueueInfo]:
        return await self.operator.queues()

    async def throughput(self, queue: str, window: float = 10.0) -> float:
        """Completed jobs per second over the last `window` seconds."""
        return await self.operator.throughput(queue, window)

    async def workers(self) -> list[WorkerInfo]:
        return await self.operator.workers()

    async def live_workers(self) -> list[WorkerInfo]:
        return await self.operator.live_workers()

    def worker_alive(self, worker: WorkerInfo) -> bool:
        """Whether a worker of `workers()` is alive, as `live_workers` judges it (its process
        runs, on this machine; its heartbeat is recent, on others): for a caller that has the
        list already and would otherwise read it twice."""
        return worker_alive(worker, self.now())

    def worker_state(self, worker: WorkerInfo) -> str:
        """What a worker of `workers()` is doing, for an operator: "alive" (it serves), "gone",
        or, alive by `worker_alive` but with no recent heartbeat, "suspended", "stalled" or
        "suspended or stalled" (`liveness.worker_state`): such a worker claims nothing."""
        return worker_state(worker, self.now())

    def orphaned(self, run: Run, job: Job | None, workers: Sequence[WorkerInfo]) -> Orphan | None:
        """Whether nobody runs a run recorded `running` any more: its worker is gone (dead, or
        it let the lease on the job run out), and why, in a sentence (`.why`: "its worker … is
        gone (…)"), with what becomes of it (`.then`: a live worker takes its job over, or,
        for a memory queue's job, records the run crashed). None while a worker may run it.
        `job`: the run's, as `get_jobs` read it (None if no queue has it); `workers`: as
        `workers()` read them, once for many runs."""
        return orphaned(run, job, workers, self.now())

    async def health(self, max_age: str | int | float | timedelta = "5m") -> Health:
        """Healthy: the database answers, at least one worker is alive on it, and no queue's
        oldest waiting job has waited longer than `max_age` (paused queues aside). `.reason`
        says what is wrong in one line."""
        return await self.operator.health(_ms(max_age, "max_age") / 1000)

    async def pause(self, queue: str) -> None:
        """Claim nothing new from the queue (running jobs finish); survives a restart."""
        await self.operator.pause(queue)

    async def resume(self, queue: str) -> None:
        await self.operator.resume(queue)

    # ---- events, schedules, why a run waits ------------------------------------------------
    @property
    def mailbox(self) -> Mailbox:
        if self._mailbox is None:
            raise EngineError("the engine is not started: use `async with Engine(...)`")
        return self._mailbox

    async def send_event(self, run_id: str | None, event: str, payload: Any = None) -> EventSent:
        """Send `event` to the run: a `wait.for_event(event)` in it takes `payload` as its
        output, now if it waits, else when it gets there. With `run_id=None`, to the runs
        waiting on the key the payload carries (`match=`), or kept for the first one to wait
        on it. The ids of the runs it went to, and whether a wait took it or it was kept (an
        `EventSent`: a list of run ids). An unknown or finished run is an EngineError."""
        payload = self.operator.json_payload(payload, "event payload")
        return await self.mailbox.send(run_id, event, payload)

    async def events_of(self, run_id: str) -> list[EventMessage]:
        """Every event sent to the run, oldest first; `taken_by` None: nobody took it yet."""
        return await self.mailbox.events_of(run_id)

    @property
    def _schedule_ops(self) -> Schedules:
        if self._schedules is None:
            raise EngineError("the engine is not started: use `async with Engine(...)`")
        return self._schedules

    async def schedules(self) -> list[ScheduleInfo]:
        """Every schedule the workers on this database declared: next and last fire time, and
        the status of the last run it enqueued."""
        return await self._schedule_ops.list()

    async def pause_schedule(self, workflow: str, schedule: str | None = None) -> str:
        """Fire no more ticks of the schedule (its id; may be left out when the workflow has
        one) until resumed; returns its id. Shared by every process on the database."""
        return await self._schedule_ops.set_paused(workflow, schedule, True)

    async def resume_schedule(self, workflow: str, schedule: str | None = None) -> str:
        """Fire its ticks again from the next one (the paused ones are not caught up)."""
        return await self._schedule_ops.set_paused(workflow, schedule, False)

    async def run_schedule(self, workflow: str, schedule: str | None = None) -> str:
        """Enqueue one run of the schedule now, with its payload; the run's id."""
        return await self._schedule_ops.run_now(workflow, schedule)

    async def overruled_schedules(self) -> dict[str, tuple[str, ...]]:
        """Workflow → the live workers whose own schedules for it are not those that fire
        (another version of its file declared last, with other schedules or none)."""
        return await self._schedule_ops.overruled()

    async def version_splits(self) -> dict[str, dict[str, list[str]]]:
        """Workflow → version → the live workers serving it there, for the workflows served
        at more than one (a rolling deploy under way, a worker left with old files)."""
        return await version_splits(self.backend)

    async def usual_duration(self, workflow: str) -> float | None:
        """How long the workflow's runs usually take, in seconds: the median of its latest
        completed runs (None before it has one), the measure `runs(stuck=)` compares with."""
        return await median_duration(self.backend.runs, workflow)

    async def where(self, run_id: str, timeout: float = 10.0) -> str:
        """Where a running run's code is now: a `where: …` line for each of its nodes that
        runs (the step, the line of the workflow file, then its own frames), as the worker
        holding it answers, on any machine; the answer also lands on the run's log."""
        run = await self.operator.get_run(run_id)
        return await ask_where(self.backend, run, self.operator.worker, timeout)

    async def why_waiting(self, run_id: str) -> WaitReason:
        """What holds a run that has not started or does not go on: the gate or wait, its
        key, the runs holding the slots it waits for, and when it may start."""
        run = await self.operator.get_run(run_id)
        found = await self.backend.find_job(run.job_id)
        return await explain(self.backend, run, found[1] if found else None)
