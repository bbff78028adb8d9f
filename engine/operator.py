"""The operator API: enqueue, inspect, cancel, replay, retry now, pause — over a Backend (the
dead-letter queue's requeue and discard: `dead_letters.py`).

One implementation serves the in-process engine, an engine with no workflows (a producer or an
attached console) and the command line alike. An action on a job that no worker holds is a
fenced write through the ledger; an action on a run another worker holds (cancel, retry now)
is a signal written on its job, which that worker picks up — not a remote call. So everything
works with no worker alive, except what only a worker can do: stop code that runs.

Queues are known from this engine's catalog or the catalogs that workers sharing the database
declared: a producer enqueues to a queue another process serves without importing its workflows.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import anyio

from . import telemetry
from .backends.base import Backend, EventMessage, JobQueue, ServedQueue, WorkerCatalog
from .cancelling import Canceller
from .catalog import Catalog
from .dead_letters import DeadLetters, skip_reason
from .errors import EngineError, UnknownJob, UnknownQueue, UnknownRun
from .filters import RunFilter
from .health import DEFAULT_MAX_AGE_S, Health
from .health import check as check_health
from .known_jobs import known_job
from .ledger import JobWaiter, Ledger, make_job, make_run
from .liveness import SERVING, elsewhere, worker_alive, worker_state
from .models import (
    LIVE_RUN_STATUSES,
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
)
from .operations import (
    BulkResult,
    ProgressCallback,
    Skip,
    bulk_run,
    bulk_targets,
    resolve_stuck,
    run_bulk,
    target_id,
)
from .replay_seed import seed_from_step
from .replays import replay_warning, replayed_among
from .turns import TimeSlice
from .unknown_queue import unknown_queue
from .validation import (
    InvalidInput,
    check_delay,
    check_headers,
    check_job_id,
    check_limit,
    check_lookup_id,
    check_payload_list,
    check_priority,
    check_retries,
    check_timeout,
    check_wait_timeout,
    checked,
    json_value,
)
from .versions import shared_queues_in
from .waiting import explain
from .worker import Worker
from .workflow import Workflow

log = logging.getLogger("blok.operator")

DEFAULT_MAX_PAYLOAD_BYTES = 1_048_576
CATALOG_TTL_S = 1.0  # a producer re-reads what the workers serve at most this often
STRANDED_LOOKED_AT = 200  # runs read to find the queues no worker declares that hold some
STRANDED_TTL_S = 5.0  # and how often they are read
# How long a `wait_for_job` that timed out reads what the job is at, for its message.
WHAT_IT_DOES_READ_S = 1.0
# Runs that retry_now can start: delayed (a backoff or a delay), queued (paused), throttled.
RETRYABLE_NOW = frozenset({RunStatus.DELAYED, RunStatus.QUEUED, RunStatus.THROTTLED})


@dataclass(frozen=True, slots=True)
class QueueTarget:
    """A queue this process can enqueue to: where its jobs go and what runs them."""

    name: str
    workflow_name: str
    version: str
    retries: int
    start_delay_ms: int | None
    queue: JobQueue
    workflow: Workflow | None  # when the workflow is loaded here
    steps: tuple[tuple[str, str], ...]  # top-level (name, kind)


class Operator:
    def __init__(
        self,
        backend: Backend,
        ledger: Ledger,
        catalog: Catalog,
        *,
        provider_of: Any,
        worker: Worker | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        scheduling: bool = True,
    ) -> None:
        self.backend = backend
        self.scheduling = scheduling  # False (BLOK_SCHEDULING_DISABLED): no start_delay
        self.store = backend.runs
        self.ledger = ledger
        self.catalog = catalog
        self.provider_of = provider_of  # Workflow -> provider name (None: the default)
        self.worker = worker
        self.max_payload_bytes = max_payload_bytes
        self._catalogs: tuple[float, list[WorkerCatalog]] = (0.0, [])
        # The stranded queues' last read: when, for which declared queues, and what it found.
        self._strands: tuple[float, tuple[str, ...], list[Run]] = (0.0, (), [])
        self._served: dict[str, QueueTarget] = {}  # the last target of each queue served here
        self.cancels = Canceller(backend, ledger, self.get_run, lambda: self.worker)
        self.dead = DeadLetters(backend, ledger, self.target, self.run_target, self._queue_names)
        # A caller's reads that find what they want at once give the loop away once a slice.
        self._turns = TimeSlice()

    # ---- queues ----------------------------------------------------------------------------
    async def _declared(self, fresh: bool = False) -> list[WorkerCatalog]:
        at, catalogs = self._catalogs
        if fresh or time.monotonic() - at > CATALOG_TTL_S:
            catalogs = await self.backend.shared.catalogs()
            self._catalogs = (time.monotonic(), catalogs)
        return catalogs

    async def target(self, queue: str) -> QueueTarget:
        """The queue as this engine serves it, else as a worker on the database declared it."""
        wf = self.catalog.served().get(queue)
        if wf is not None:
            try:
                jobs = self.backend.queue(self.provider_of(wf))
            except ValueError as error:
                raise EngineError(str(error)) from None
            cached = self._served.get(queue)
            if cached is not None and cached.workflow is wf and cached.queue is jobs:
                return cached  # a target never changes; a reload makes a new workflow
            trigger = wf.trigger
            target = self._served[queue] = QueueTarget(
                queue,
                wf.name,
                wf.version,
                trigger.retries if trigger else 0,
                trigger.start_delay if trigger else None,
                jobs,
                wf,
                tuple((s.name, s.kind) for s in wf.steps),
            )
            return target
        for fresh in (False, True):
            declared: ServedQueue | None = None
            steps: tuple[tuple[str, str], ...] = ()
            for catalog in await self._declared(fresh):
                for served in catalog.queues:
                    if served.name == queue:
                        declared = served
                        steps = catalog.step_kinds.get(served.workflow_name, ())
            if declared is not None:
                break
        if declared is None:
            raise await unknown_queue(queue, self.catalog, await self._declared(), self.backend)
        if declared.provider == "memory":
            raise EngineError(
                f"queue {queue!r} is a memory queue: its jobs live in the process of the worker "
                "serving it, so only that process can add to or act on them"
            )
        try:
            jobs = self.backend.queue(declared.provider or None)
        except ValueError as error:
            raise EngineError(f"queue {queue!r}: {error}") from None
        return QueueTarget(
            queue,
            declared.workflow_name,
            declared.workflow_version,
            declared.retries,
            declared.start_delay_ms,
            jobs,
            None,
            steps,
        )

    async def run_target(self, queue: str, workflow_name: str) -> QueueTarget:
        """Where a run of `workflow_name` on `queue` goes: the queue's own workflow, or a
        helper workflow (one with no trigger) that a sub-workflow step ran on its parent's
        queue — a job of that queue that runs the helper (the worker finds it by the job's
        workflow name), with no retries nor gates, as it has no trigger."""
        base = await self.target(queue)
        if workflow_name == base.workflow_name:
            return base
        wf = self.catalog.workflow(workflow_name)
        if wf is not None and wf.trigger is None:
            steps = tuple((s.name, s.kind) for s in wf.steps)
            version, workflow = wf.version, wf
        else:
            for catalog in reversed(await self._declared()):
                found = [i for i in catalog.workflows if i.name == workflow_name and not i.queue]
                if found:
                    steps = catalog.step_kinds.get(workflow_name, ())
                    version, workflow = found[0].version, None
                    break
            else:
                return base  # renamed since: the queue's workflow runs it, as any job of it
        return dataclasses.replace(
            base,
            workflow_name=workflow_name,
            version=version,
            retries=0,
            start_delay_ms=None,
            workflow=workflow,
            steps=steps,
        )

    async def _declared_names(self) -> set[str]:
        return {q.name for c in await self._declared() for q in c.queues}

    async def _queue_names(self) -> list[str]:
        return [queue.name for queue in await self.queues()]

    async def queues(self) -> list[QueueInfo]:
        """Every queue served here or declared by a worker on the database; its concurrency
        summed over the workers serving it as `health` counts them (alive, heartbeat recent,
        not stopping), the workflows they serve it with, paused as the database says."""
        paused = await self.backend.shared.paused_queues()
        now = self.backend.clock.now()
        live = {
            w.id for w in await self.backend.shared.workers() if worker_state(w, now) == SERVING
        }
        merged: dict[str, QueueInfo] = {}
        widths: dict[str, int] = {}
        catalogs = await self._declared(fresh=True)
        for catalog in catalogs:
            for served in catalog.queues:
                merged[served.name] = QueueInfo(
                    name=served.name,
                    workflow_name=served.workflow_name,
                    provider=served.provider,
                    concurrency=served.concurrency,
                    paused=served.name in paused,
                    served=False,
                )
                if catalog.worker in live:
                    widths[served.name] = widths.get(served.name, 0) + served.concurrency
        for name, width in widths.items():
            merged[name].concurrency = width
            merged[name].served = True
        for name, names in shared_queues_in([c for c in catalogs if c.worker in live]).items():
            merged[name].workflow_names = sorted(names)
        for name, wf in self.catalog.served().items():
            if name in merged:
                continue
            # Loaded here but not served by a worker (yet): as this engine would serve it.
            try:
                provider = self.backend.queue(self.provider_of(wf)).provider
            except ValueError:
                continue
            merged[name] = QueueInfo(
                name=name,
                workflow_name=wf.name,
                provider=provider,
                concurrency=wf.trigger.concurrency if wf.trigger else 1,
                paused=name in paused,
                served=self.worker is not None,
            )
        for info in await self._stranded(tuple(merged), paused):
            merged[info.name] = info
        return [merged[name] for name in sorted(merged)]

    async def _stranded(self, known: tuple[str, ...], paused: set[str]) -> list[QueueInfo]:
        """Queues no worker declares that hold runs not ended: a queue renamed, or its
        workflow file removed, with jobs left on it. They vanished from `queues()`, and with
        them from the console's queues view and from `health`, while their runs waited for
        a worker that would never come."""
        at, before, runs = self._strands
        # Read again at most every STRANDED_TTL_S: the read goes through every run not ended
        # (a backlog of 100,000 on a served queue too), and the console asks every second.
        if before != known or time.monotonic() - at > STRANDED_TTL_S:
            runs = await self.backend.runs.list_runs(
                RunFilter(status=LIVE_RUN_STATUSES, not_queues=known), limit=STRANDED_LOOKED_AT
            )
            self._strands = (time.monotonic(), known, runs)
        found: dict[str, QueueInfo] = {}
        for run in runs:
            if run.queue not in found:
                found[run.queue] = QueueInfo(
                    name=run.queue,
                    workflow_name=run.workflow_name,
                    provider=self.backend.queue(None).provider,
                    concurrency=0,
                    paused=run.queue in paused,
                    served=False,
                )
        return list(found.values())

    async def workflows(self) -> list[WorkflowInfo]:
        latest: dict[str, WorkflowInfo] = {}
        for catalog in await self._declared():
            for info in catalog.workflows:
                latest[info.name] = info
        for info in self.catalog.infos():
            latest[info.name] = info
        return [latest[name] for name in sorted(latest)]

    async def reload_errors(self) -> dict[str, str]:
        errors: dict[str, str] = {}
        for catalog in await self._declared():
            errors.update(catalog.reload_errors)
        errors.update(self.catalog.reload_errors)
        return errors

    async def queue_stats(self, queue: str) -> QueueStats:
        try:
            target = await self.target(queue)
        except UnknownQueue as unknown:
            return await self._stranded_stats(queue, unknown)
        except EngineError:
            return await self._stats_from_runs(queue)  # a memory queue of another process
        return await target.queue.stats(queue)

    async def _stranded_stats(self, queue: str, unknown: UnknownQueue) -> QueueStats:
        """A queue no worker declares, counted where its jobs are (`_stranded`); one that
        holds none is `unknown` (a mistyped name)."""
        stats = await self.backend.queue(None).stats(queue)
        if not any(stats.model_dump(exclude={"queue"}).values()):
            raise unknown
        return stats

    async def oldest_waiting(self, queue: str) -> datetime | None:
        """Since when the queue's longest-waiting due job has been due (None: none waits)."""
        try:
            target = await self.target(queue)
        except UnknownQueue as unknown:
            await self._stranded_stats(queue, unknown)  # it holds jobs, or it is unknown
            return await self.backend.queue(None).oldest_waiting(queue)
        return await target.queue.oldest_waiting(queue)

    async def health(self, max_age_s: float = DEFAULT_MAX_AGE_S) -> Health:
        """The database answers, a worker is alive, no queue's oldest waiting job is older
        than `max_age_s` (engine/health.py)."""
        return await check_health(self, max_age_s)

    async def _stats_from_runs(self, queue: str) -> QueueStats:
        async def count(*statuses: str) -> int:
            return await self.store.count_runs(RunFilter(status=statuses, queue=queue))

        return QueueStats(
            queue=queue,
            waiting=await count("queued"),
            active=await count("running"),
            completed=await count("completed"),
            failed=await count("failed", "timed_out", "crashed"),
            delayed=await count("delayed", "waiting"),
            cancelled=await count("cancelled"),
        )

    async def throughput(self, queue: str, window: float = 10.0) -> float:
        """Completed jobs per second over the last `window` seconds: as this engine saw them
        if it serves the queue, else from the store (every worker)."""
        if self.worker is not None and queue in self.worker.runtimes:
            return self.worker.throughput(queue, window)
        since = self.backend.clock.time() - window
        where = RunFilter(status=(str(RunStatus.COMPLETED),), queue=queue, finished_after=since)
        return await self.store.count_runs(where) / window

    async def pause(self, queue: str) -> None:
        """Claim nothing new from the queue (running jobs finish); survives a restart."""
        await self._set_paused(queue, True)

    async def resume(self, queue: str) -> None:
        await self._set_paused(queue, False)

    async def _set_paused(self, queue: str, paused: bool) -> None:
        if queue not in self.catalog.served() and queue not in await self._declared_names():
            await self.target(queue)  # raises UnknownQueue with the known ones
        await self.backend.shared.set_paused(queue, paused)
        if self.worker is not None:
            self.worker.set_paused(queue, paused)

    # ---- workers ---------------------------------------------------------------------------
    async def workers(self) -> list[WorkerInfo]:
        return await self.backend.shared.workers()

    async def live_workers(self) -> list[WorkerInfo]:
        now = self.backend.clock.now()  # the clock heartbeats are on
        return [w for w in await self.backend.shared.workers() if worker_alive(w, now)]

    # ---- enqueue ---------------------------------------------------------------------------
    def json_payload(self, payload: Any, what: str = "payload") -> Any:
        return checked(json_value, payload, self.max_payload_bytes, what=what)

    def _job(
        self,
        target: QueueTarget,
        payload: Any,
        *,
        priority: int = 0,
        delay: Any = None,
        job_id: str | None = None,
        headers: dict[str, str] | None = None,
        meta: dict[str, Any] | None = None,
        what: str = "payload",
        retries: int | None = None,
        timeout: Any = None,
    ) -> tuple[Job, Run]:
        payload = self.json_payload(payload, what)
        if delay is None and target.start_delay_ms and self.scheduling:
            delay = target.start_delay_ms  # the delay gate: every job of this trigger waits
        try:
            headers = check_headers(headers)
            priority = check_priority(priority)
            delay_ms = check_delay(delay) if delay is not None else 0
            max_retries = check_retries(retries) if retries is not None else target.retries
            timeout_ms = check_timeout(timeout) if timeout is not None else None
        except InvalidInput as error:
            raise EngineError(str(error)) from None
        now = self.backend.clock.now()
        run_at = now + timedelta(milliseconds=delay_ms) if delay_ms > 0 else None
        if delay_ms or timeout_ms is not None:
            # The job's own settings (ctx.job shows them; the worker applies the timeout).
            meta = dict(meta or {})
            if delay_ms:
                meta["delay_ms"] = delay_ms
            if timeout_ms is not None:
                meta["timeout_ms"] = timeout_ms
        job = make_job(
            queue=target.name,
            workflow_name=target.workflow_name,
            payload=payload,
            headers=headers,
            priority=priority,
            run_at=run_at,
            max_retries=max_retries,
            job_id=job_id,
            meta=meta,
            now=now,
        )
        telemetry.OBSERVE.enqueuing(job)
        status = RunStatus.DELAYED if run_at else RunStatus.QUEUED
        return job, make_run(job, workflow_version=target.version, status=status)

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
        """Add a job; its id. A `job_id` the queue knows already is not added twice: its id
        comes back (the job stays as it is; `known_job`); one that another queue has is an
        EngineError."""
        if job_id is not None:
            job_id = checked(check_job_id, job_id)
        target = await self.target(queue)
        job, run = self._job(
            target,
            payload,
            priority=priority,
            delay=delay,
            job_id=job_id,
            headers=headers,
            retries=retries,
            timeout=timeout,
        )
        added = await self.ledger.add(target.queue, [job], [run], watch=True)
        if not added:
            await known_job(self.backend, job, queue)
        elif force:
            await self._start_now(target.queue, job.id)
        return job.id

    async def enqueue_many(
        self, queue: str, payloads: Sequence[Any], *, priority: int = 0
    ) -> list[str]:
        payloads = checked(check_payload_list, payloads)
        target = await self.target(queue)
        made = [self._job(target, p, priority=priority) for p in payloads]
        if made:  # watched, as an `enqueue` is: a script collects a batch's runs without reads
            jobs, runs = [m[0] for m in made], [m[1] for m in made]
            await self.ledger.add(target.queue, jobs, runs, watch=True)
        return [m[0].id for m in made]

    async def _start_now(self, queue: JobQueue, job_id: str) -> bool:
        """Make a pending job due now, past its run_at and a pause."""
        for _ in range(3):
            job = await queue.get_job(job_id)
            if job is None or job.state not in (JobState.WAITING, JobState.DELAYED):
                return False
            run = await self.store.get_run(job.run_id)
            if await self.ledger.make_due(queue, job, run, force=True):
                return True
        return False

    # ---- reads -----------------------------------------------------------------------------
    async def get_job(self, job_id: str) -> Job:
        if type(job_id) is not str:  # only then: a call less on a hot path
            checked(check_lookup_id, job_id, "job id")
        found = await self.backend.find_job(job_id)
        if found is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        await self._turns.share()
        return found[1]

    async def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        return await self.backend.find_jobs(job_ids)

    async def get_run(self, run_id: str) -> Run:
        if type(run_id) is not str:  # only then: a call less on a hot path
            checked(check_lookup_id, run_id, "run id")
        run = await self.store.get_run(run_id)
        if run is None:
            found = await self.backend.find_job(run_id)  # a job's id, as find_run takes
            its = f" ({run_id!r} is a job id: its run is {found[1].run_id})" if found else ""
            raise UnknownRun(f"unknown run {run_id!r}{its}")
        await self._turns.share()
        return run

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
        """Newest first, at most `limit` (None: all) after `offset`. `retrying`: still going
        with a failed attempt behind them; `stuck`: running longer than `stuck` × their
        workflow's median completed duration; `replay_of`: the replays of that run; `since`:
        created at or after that moment."""
        limit = checked(check_limit, limit)
        offset = checked(check_limit, offset, "offset") or 0
        try:
            where = RunFilter.of(
                status, workflow, queue, text, None, retrying, stuck, replay_of, since
            )
        except ValueError as error:
            raise EngineError(f"bad filter: {error}") from None
        where = await resolve_stuck(self.store, where)
        return await self.store.list_runs(where, limit=limit, offset=offset)

    async def count_runs(self, where: RunFilter | None = None) -> int:
        if where is not None:
            where = await resolve_stuck(self.store, where)
        return await self.store.count_runs(where)

    async def wait_for_job(self, job_id: str, timeout: float | None = None) -> Run:
        """The job's last run, once the job has ended (completed, cancelled, failed, dead).

        No polling: a job ending here wakes its waiters once the transition that ended it is
        committed, with its run (none if the fence refused it: they read the job again); a job
        another process ends is read again when the database reports a change.

        A job still going after `timeout` seconds: a TimeoutError that says what its run does."""
        try:
            timeout = check_wait_timeout(timeout)
        except InvalidInput as error:
            raise EngineError(f"wait_for_job: {error}") from None
        run = self.ledger.parked(job_id)
        if run is not None:
            await self._turns.share()
            return run  # enqueued here and completed here since: nothing to read
        waiter = self.ledger.job_waiter(job_id)  # before the read: an end during it wakes us
        # A job enqueued here and not ended here yet is not read now: it ends here (the waiter
        # hears it) or elsewhere, after a commit that moved the change token read before its add.
        token = self.ledger.pending_since(job_id)
        if token is None:
            run = await self._if_ended(job_id, waiter)
            if run is not None:
                await self._turns.share()
                return run
            token = await self.backend.change_token() if self.backend.multi_process else 0
        with anyio.move_on_after(timeout):
            while True:
                if not self.backend.multi_process:
                    await waiter.event.wait()
                else:
                    # Another process may settle it: wake on our own settle or on any change.
                    token = await self._settled_or_changed(waiter, token)
                run = await self._if_ended(job_id, waiter)
                if run is not None:
                    return run
                if waiter.ended:  # ended here, then requeued meanwhile: wait again
                    waiter = self.ledger.job_waiter(job_id)
        # The time ran out (the loop leaves by a return or an error only). A TimeoutError still,
        # which callers catch, saying which job, how long and what it is at.
        assert timeout is not None
        doing = await self._what_the_job_does(job_id)
        raise TimeoutError(f"job {job_id} did not finish within {timeout:g}s{doing}")

    async def _what_the_job_does(self, job_id: str) -> str:
        """What a job that did not end in time is at, for the timeout's message: " (its run
        run_… is running)"; "" when a read does not say it at once (the caller waited enough)."""
        with anyio.move_on_after(WHAT_IT_DOES_READ_S):
            found = await self.backend.find_job(job_id)
            if found is None:
                return ""
            job = found[1]
            run = await self.store.get_run(job.run_id)
            if run is None:
                return f" (the job is {job.state})"
            # What holds a run not started or not going on: a paused queue, no live worker…
            why = await explain(self.backend, run, job) if not run.terminal else None
            held = f": {why.summary}" if why and why.gate not in ("queued", "running") else ""
            return f" (its run {run.id} is {run.status}{held})"
        return ""

    async def _if_ended(self, job_id: str, waiter: JobWaiter) -> Run | None:
        """The job's last run if the job has ended, else None."""
        if waiter.run is not None:
            return waiter.run  # the transition that ended it landed, with this run
        found = await self.backend.find_ended(job_id)  # one read where the backend can
        if found is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        if not found[0].state.terminal:
            return None
        self.ledger.forget_waiter(job_id)
        if found[1] is None:
            raise UnknownRun(f"job {job_id}'s run {found[0].run_id} is not in the store")
        return found[1]

    async def _settled_or_changed(self, waiter: JobWaiter, token: int) -> int:
        """Wait until this process ends the job (`waiter` is told) or the database changed.
        The waiter, told, stops the wait. (A task that awaited the waiter beside it was made
        and cancelled at every change another process made: a reference cycle each time, in
        anyio's own frames, left to the cyclic collector.)"""
        if waiter.ended:
            return token
        with anyio.CancelScope() as told:
            waiter.wakes.append(told.cancel)
            try:
                token = await self.backend.wait_for_change(token, 1.0)
            finally:
                waiter.wakes.remove(told.cancel)
        return token

    # ---- cancel ----------------------------------------------------------------------------
    async def cancel(self, run_id: str) -> Run:
        """Cancel a running, waiting, delayed or queued run; a finished run is an error. The
        child runs it waits on (subworkflow steps with wait=True) are cancelled with it."""
        run = await self.cancels.cancel_one(run_id)
        if run.status is RunStatus.CANCELLED:
            await self._cancel_waited_children(run)
        return run

    async def _cancel_waited_children(self, run: Run) -> None:
        """Cancel the child runs a cancelled run was waiting on (wait=True subworkflow
        steps); detached children (wait=False) go on."""
        for record in run.steps:
            if record.kind != "subworkflow" or "sub" not in record.tags:
                continue
            if not record.child_run_id:
                continue
            child = await self.store.get_run(record.child_run_id)
            if child is None or child.terminal:
                continue
            try:
                await self.cancel(child.id)
            except EngineError as error:  # it ended between the look and the cancel
                log.info("child run %s of %s was not cancelled: %s", child.id, run.id, error)

    def _tell_local(self, job_id: str, signal: str) -> None:
        """The job may be held by this very process: no need to wait for it to notice."""
        if self.worker is not None:
            self.worker.deliver(job_id, signal, self.backend.clock.time())

    # ---- replay, requeue, retry now --------------------------------------------------------
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
        target = await self.run_target(source.queue, source.workflow_name)
        job, run = self._replay_job(target, source, from_step=from_step, input=input)
        await self.ledger.add(target.queue, [job], [run])
        if force:
            await self._start_now(target.queue, job.id)
        return run.id

    async def replay_warning(self, run_id: str) -> str | None:
        """Why a replay of the run would do again what is done or under way (replays.py)."""
        return await replay_warning(self.backend, await self.get_run(run_id))

    async def replayed_among(self, runs: Sequence[Run | str]) -> set[str]:
        return await replayed_among(self.store, runs)

    def _replay_job(
        self, target: QueueTarget, source: Run, *, from_step: str | None, input: Any = None
    ) -> tuple[Job, Run]:
        payload = source.input if input is None else input
        meta: dict[str, Any] = {"replay_of": source.id, **telemetry.OBSERVE.replay_link(source)}
        if from_step is not None:
            meta["replay_from_step"] = from_step
        job, run = self._job(
            target,
            payload,
            priority=source.priority,
            meta=meta,
            what="payload" if input is None else "input",
        )
        if from_step is not None:
            seed_from_step(
                target.workflow_name, target.steps, target.workflow, source, run, from_step
            )
            job.resume = True
        return job, run

    async def retry_now(self, run_id: str) -> str:
        """Start at once a run that waits for its next attempt: a step sleeping in its retry
        backoff, a job in retry backoff (its next run is `delayed`), or a delayed, queued or
        throttled run, even on a paused queue. For a failed run whose job is in backoff, the
        job's next run starts. Returns the id of the run that goes ahead."""
        run = await self.get_run(run_id)
        found = await self.backend.find_job(run.job_id)
        if found is None:
            if run.terminal:  # its job went with the runs that ended before the retention
                raise UnknownJob(f"run {run_id}'s job {run.job_id} is no longer kept")
            raise UnknownJob(elsewhere(run))
        queue, job = found
        if job.state is JobState.ACTIVE and job.run_id == run.id:
            local = self.worker is not None and job.id in self.worker.by_job
            in_backoff = self.worker.in_backoff(run_id) if local else _in_step_backoff(run)  # type: ignore[union-attr]
            if not in_backoff:
                raise EngineError(
                    f"run {run_id} is running an attempt; there is no backoff to skip"
                )
            if not await queue.signal(job.id, job.epoch, "retry_now"):
                raise EngineError(f"run {run_id} changed hands; try again")
            self._tell_local(job.id, "retry_now")
            return run_id
        waits = job.state in (JobState.DELAYED, JobState.WAITING)
        if run.terminal and waits and job.run_id != run.id:
            run = await self.get_run(job.run_id)  # the job's next attempt
        if not waits or job.run_id != run.id or run.status not in RETRYABLE_NOW:
            raise EngineError(
                f"run {run.id} is {run.status}: retry now starts a run in retry backoff or a "
                "delayed run"
            )
        gate = job.gated_by("concurrency")
        if gate is not None:  # made due, it would find the key full again
            raise EngineError(
                f"run {run.id} waits for a slot of concurrency key {gate.get('key')!r}: it "
                "starts when a run of that key ends; retry now cannot make room"
            )
        if not await self.ledger.make_due(queue, job, run, force=True):
            raise EngineError(f"run {run.id} was taken by a worker meanwhile")
        return run.id

    # ---- bulk ------------------------------------------------------------------------------
    async def cancel_many(
        self, runs: RunFilter | Sequence[str], *, progress: ProgressCallback | None = None
    ) -> BulkResult:
        """Cancel every run the filter matches (or these run ids) that has not ended."""
        targets = await bulk_targets(self.store, runs)

        async def cancel(target: Run | str) -> None:
            run = await bulk_run(self.store, target)
            if run.terminal:
                raise Skip("already ended")
            try:
                after = await self.cancel(run.id)
            except EngineError as error:
                raise Skip(skip_reason(error, run.id)) from None
            if not after.terminal:  # its worker has not read the cancel yet (CANCEL_WAIT_S)
                raise Skip(f"cancel asked, still {after.status}: its worker stops it on reading it")
            if after.status is not RunStatus.CANCELLED:
                raise Skip(f"ended as {after.status} before the cancel took")

        return await run_bulk("cancel", targets, target_id, cancel, progress)

    async def replay_many(
        self,
        runs: RunFilter | Sequence[str],
        *,
        from_step: str | None = None,
        progress: ProgressCallback | None = None,
    ) -> BulkResult:
        """Replay every finished run the filter matches (or these run ids), each as a new run
        with `replay_of` pointing back; `result.replayed` maps source run to new run. A run
        replayed already is skipped: its newest replay is the one to replay."""
        targets = await bulk_targets(self.store, runs)
        replayed = await replayed_among(self.store, targets)

        async def replay(target: Run | str) -> str:
            source = await bulk_run(self.store, target, full=from_step is not None)
            if not source.terminal:
                raise Skip("not finished yet")
            if source.id in replayed:
                raise Skip("replayed already")
            try:
                queue = await self.run_target(source.queue, source.workflow_name)
                job, run = self._replay_job(queue, source, from_step=from_step)
            except EngineError as error:
                raise Skip(skip_reason(error, source.id)) from None
            await self.ledger.add(queue.queue, [job], [run])
            return run.id

        return await run_bulk("replay", targets, target_id, replay, progress)

    async def stuck_runs(self, factor: float = 3.0, limit: int | None = 100) -> list[Run]:
        """Runs going longer than `factor` × their workflow's median completed duration."""
        return await self.runs(stuck=factor, limit=limit)

    # ---- services for the runner -----------------------------------------------------------
    def workflow(self, name: str) -> Workflow | None:
        return self.catalog.workflow(name)

    async def cache_get(self, workflow: str, step: str, key: str) -> Any:
        return await self.store.cache_get(workflow, step, key)

    def cache_put(
        self, workflow: str, step: str, key: str, output: Any, run_id: str, ttl_ms: int
    ) -> None:
        self.store.cache_put(workflow, step, key, output, run_id, ttl_ms)

    async def find_job(self, job_id: str) -> Job | None:
        found = await self.backend.find_job(job_id)
        return found[1] if found else None

    def workflow_names(self) -> list[str]:
        return list(self.catalog.workflows)

    async def take_event(
        self, run_id: str, step: str, event: str, **how: Any
    ) -> EventMessage | None:
        return await self.store.take_event(run_id, step, event, **how)

    async def dispatch(
        self, workflow: Workflow, payload: Any, job_id: str, meta: dict[str, Any], queue: str
    ) -> str:
        existing = await self.find_job(job_id)
        if existing is not None:
            return existing.run_id
        if workflow.queue is not None:
            target = await self.target(workflow.queue)
        else:
            target = await self.run_target(queue, workflow.name)
        job, run = self._job(target, payload, job_id=job_id, meta=meta)
        added = await self.ledger.add(target.queue, [job], [run])
        if not added:  # added by an earlier pass meanwhile
            existing = await self.find_job(job_id)
            assert existing is not None
            return existing.run_id
        return run.id

    # ---- pending runs of a queue (for the console's "why is it waiting") -----------------
    async def pending(self, queue: str, limit: int | None = 100) -> list[Run]:
        return await self.store.list_runs(
            RunFilter(status=tuple(str(s) for s in PENDING_RUN_STATUSES), queue=queue),
            limit=checked(check_limit, limit),
        )


def _in_step_backoff(run: Run) -> bool:
    """The run's record says a step sleeps before its next attempt: it is running, and its
    last attempt failed with a backoff."""
    for step in run.steps:
        if step.status is StepStatus.RUNNING and step.attempts:
            last = step.attempts[-1]
            if last.status is not AttemptStatus.RUNNING and last.backoff_ms is not None:
                return True
    return False
