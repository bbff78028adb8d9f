"""Everything in this process's memory: fast, and gone when the process ends.

`MemoryQueue` is also the queue of `provider="memory"` workflows on a database backend: its
jobs live here while their runs go to the database's run store.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, ClassVar

import anyio

from ..clock import Clock
from ..filters import RunFilter
from ..models import (
    PENDING_RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
    Job,
    JobState,
    LogLine,
    QueueStats,
    Run,
)
from ..records import construct, copy_run
from .base import (
    NOTHING_LEFT,
    Backend,
    CacheHit,
    Claim,
    Delivery,
    EventMessage,
    EventWaiter,
    FeedCursor,
    FeedLog,
    FeedPage,
    Fence,
    JobQueue,
    JobUpdate,
    Renewal,
    RunStore,
    Transition,
    payload_key,
)
from .memory_shared import MemoryShared
from .providers import provider_refusal

FEED_LOG_LINES = 100_000  # log lines the in-memory change feed remembers


def summary(run: Run) -> Run:
    """The run's own fields, as a listing returns them (no steps, no logs), in a record of its
    own: the stored one may still be changing."""
    fields = dict(run.__dict__)
    fields.update(steps=[], logs=[], cursor=list(run.cursor), state=dict(run.state))
    return construct(Run, fields)


def _without_logs(run: Run) -> Run:
    copy = copy_run(run)
    copy.logs = []
    for step in copy.steps:
        step.logs = []
    return copy


def copy_job(job: Job) -> Job:
    """A snapshot of a job: the queue keeps changing its own object."""
    fields = dict(job.__dict__)
    fields["meta"] = dict(job.meta)
    fields["signals"] = dict(job.signals)
    return construct(Job, fields)


# ---- runs --------------------------------------------------------------------------------
class MemoryRunStore(RunStore):
    """Runs in a dict. `check` tells whether a fence still holds (the memory queue's)."""

    def __init__(
        self,
        check: Callable[[Fence], bool] | None = None,
        dead_letter: Callable[[Run], bool] | None = None,
    ) -> None:
        self._runs: dict[str, Run] = {}
        self._dead_letter = dead_letter  # whether a run is a dead job's last (kept by purge)
        self._cache: dict[tuple[str, str, str], tuple[Any, str, float]] = {}
        self._check = check
        self._rev = itertools.count(1)
        self._changed: OrderedDict[str, int] = OrderedDict()  # run id → rev, oldest first
        self._logs: deque[FeedLog] = deque(maxlen=FEED_LOG_LINES)
        self._log_ids = itertools.count(1)
        self._messages: dict[int, EventMessage] = {}  # by id: dicts keep the order sent
        self._message_ids = itertools.count(1)
        self._waiters: dict[str, EventWaiter] = {}  # by run id

    def _fenced_out(self, fence: Fence | None) -> bool:
        return fence is not None and self._check is not None and not self._check(fence)

    def save_run(self, run: Run, fence: Fence | None = None) -> None:
        if fence is not None and self._fenced_out(fence):  # most writes carry no fence
            return
        # The worker mutates this very object, so it only needs recording once.
        self._runs[run.id] = run
        self._changed[run.id] = next(self._rev)
        self._changed.move_to_end(run.id)

    def add_log(self, run_id: str, line: LogLine, fence: Fence | None = None) -> None:
        # The line is on the run object already; the feed keeps it for followers.
        if self._fenced_out(fence):
            return
        self._logs.append(FeedLog(next(self._log_ids), run_id, line.step, line.level, line.message))

    def cache_put(
        self, workflow: str, step: str, key: str, output: Any, run_id: str, ttl_ms: int
    ) -> None:
        # Kept as JSON, so a hit hands out a copy, as a database would.
        self._cache[(workflow, step, key)] = (
            json.dumps(output),
            run_id,
            time.time() + ttl_ms / 1000,
        )

    async def cache_get(self, workflow: str, step: str, key: str) -> CacheHit | None:
        entry = self._cache.get((workflow, step, key))
        if entry is None or entry[2] <= time.time():
            return None
        return CacheHit(json.loads(entry[0]), entry[1])

    async def flush(self) -> None:
        pass

    async def get_run(self, run_id: str) -> Run | None:
        # An ended run's record is final: the worker that settled it is done with it, and
        # whoever changes a run it read (the ledger) changes a copy and saves that. So it is
        # handed out as it is, to every reader. A live run's record is the worker's own object,
        # still changing: readers get a copy of it as it is now.
        run = self._runs.get(run_id)
        if run is None:
            return None
        return run if run.status in TERMINAL_RUN_STATUSES else copy_run(run)

    def _select(self, where: RunFilter | None) -> list[Run]:
        runs = list(self._runs.values())
        if where:
            runs = [run for run in runs if where.matches(run)]
        return runs

    async def list_runs(
        self, where: RunFilter | None = None, limit: int | None = 100, offset: int = 0
    ) -> list[Run]:
        runs = self._select(where)
        runs.sort(key=lambda run: run.created_at, reverse=True)
        end = None if limit is None else offset + limit
        return [summary(run) for run in runs[offset:end]]

    async def count_runs(self, where: RunFilter | None = None) -> int:
        return len(self._select(where)) if where else len(self._runs)

    async def runs_by_id(self, run_ids: list[str]) -> list[Run]:
        found = (self._runs.get(run_id) for run_id in run_ids)
        return [summary(run) for run in found if run is not None]

    async def pending_runs(self, queues: list[str]) -> list[Run]:
        wanted = set(queues)
        return [
            summary(run)
            for run in self._runs.values()
            if run.queue in wanted and run.status in PENDING_RUN_STATUSES
        ]

    async def adopt_runs(self, runs: Sequence[tuple[str, str | None]], worker: str) -> set[str]:
        adopted: set[str] = set()
        for run_id, was in runs:
            run = self._runs.get(run_id)
            if run is None or run.worker != was or run.status not in PENDING_RUN_STATUSES:
                continue
            changed = copy_run(run)
            changed.worker = worker
            self.save_run(changed)
            adopted.add(run_id)
        return adopted

    async def purge(self, finished_before: datetime, limit: int = 500) -> int:
        doomed = [
            run.id
            for run in self._runs.values()
            if run.status in TERMINAL_RUN_STATUSES
            and run.finished_at is not None
            and run.finished_at < finished_before
            and not (self._dead_letter is not None and self._dead_letter(run))
        ][:limit]
        for run_id in doomed:
            del self._runs[run_id]
            self._changed.pop(run_id, None)
            self._waiters.pop(run_id, None)
        gone = set(doomed)
        for message in [m for m in self._messages.values() if m.run_id in gone]:
            del self._messages[message.id]
        now = time.time()
        for key in [k for k, entry in self._cache.items() if entry[2] <= now]:
            del self._cache[key]
        return len(doomed)

    async def feed(self, cursor: FeedCursor, limit: int = 1000) -> FeedPage:
        changed: list[str] = []
        for run_id, rev in reversed(self._changed.items()):
            if rev <= cursor.rev:
                break
            changed.append(run_id)
        changed.reverse()
        lagged = max(0, len(changed) - limit)
        changed = changed[lagged:]
        runs = [_without_logs(self._runs[run_id]) for run_id in changed]
        logs = [line for line in self._logs if line.id > cursor.log_id]
        lagged += max(0, len(logs) - limit)
        logs = logs[-limit:] if len(logs) > limit else logs
        top = await self.feed_cursor()
        return FeedPage(runs, logs, top, lagged)

    async def feed_cursor(self) -> FeedCursor:
        rev = next(reversed(self._changed.values()), 0) if self._changed else 0
        log_id = self._logs[-1].id if self._logs else 0
        return FeedCursor(rev, log_id)

    # ---- event mailboxes -------------------------------------------------------------------
    # Each method runs to its end without awaiting anything: atomic in this one process.
    async def post_event(
        self, event: str, payload: Any, *, run_id: str | None
    ) -> list[Delivery] | None:
        encoded = json.dumps(payload)  # kept as JSON: each reader gets its own copy
        now = time.time()
        if run_id is not None:
            run = self._runs.get(run_id)
            if run is None or run.status in TERMINAL_RUN_STATUSES:
                return None
            message = self._post(event, encoded, run_id, now)
            waiter = self._waiters.get(run_id)
            # Delivered unless an earlier event is there for the wait already (that one it
            # takes; this is kept).
            first = not any(
                m.run_id == run_id and m.event == event and m.taken_by is None
                for m in self._messages.values()
                if m.id < message.id
            )
            delivered = waiter is not None and waiter.event == event and first
            return [Delivery(run_id, message.id, delivered)]
        deliveries = []
        for waiter in list(self._waiters.values()):
            if waiter.event != event or not waiter.path or waiter.key is None:
                continue
            run = self._runs.get(waiter.run_id)
            if run is None or run.status in TERMINAL_RUN_STATUSES:
                continue
            if payload_key(payload, waiter.path) == waiter.key:
                message = self._post(event, encoded, waiter.run_id, now)
                deliveries.append(Delivery(waiter.run_id, message.id, True))
        if not deliveries:
            self._post(event, encoded, None, now)
        return deliveries

    def _post(self, event: str, encoded: str, run_id: str | None, now: float) -> EventMessage:
        message = EventMessage(next(self._message_ids), run_id, event, encoded, now)
        self._messages[message.id] = message
        return message

    def _out(self, message: EventMessage) -> EventMessage:
        return replace(message, payload=json.loads(message.payload))

    async def take_event(
        self,
        run_id: str,
        step: str,
        event: str,
        *,
        key: str | None = None,
        path: tuple[str, ...] = (),
        register: bool = True,
    ) -> EventMessage | None:
        found: EventMessage | None = None
        for message in self._messages.values():
            if message.run_id == run_id and message.taken_by == step:
                self._waiters.pop(run_id, None)
                return self._out(message)
            if (
                found is None
                and message.run_id == run_id
                and message.event == event
                and message.taken_by is None
            ):
                found = message
        if found is None and path and key is not None:
            for message in self._messages.values():
                if (
                    message.run_id is None
                    and message.event == event
                    and payload_key(json.loads(message.payload), path) == key
                ):
                    found = message
                    break
        if found is None:
            if register:
                self._waiters[run_id] = EventWaiter(run_id, step, event, key, path)
            else:
                self._waiters.pop(run_id, None)
            return None
        taken = replace(found, run_id=run_id, taken_by=step, taken_at=time.time())
        self._messages[found.id] = taken
        self._waiters.pop(run_id, None)
        return self._out(taken)

    async def events_of(self, run_id: str) -> list[EventMessage]:
        return [self._out(m) for m in self._messages.values() if m.run_id == run_id]

    async def event_waiters(self, run_ids: list[str] | None = None) -> list[EventWaiter]:
        if run_ids is None:
            return list(self._waiters.values())
        return [self._waiters[r] for r in run_ids if r in self._waiters]

    async def purge_events(self, sent_before: float) -> int:
        doomed = [
            m.id
            for m in self._messages.values()
            if (m.run_id is None and m.sent_at < sent_before)
            or (m.run_id is not None and m.run_id not in self._runs)
        ]
        for message_id in doomed:
            del self._messages[message_id]
        for run_id in list(self._waiters):
            run = self._runs.get(run_id)
            if run is None or run.status in TERMINAL_RUN_STATUSES:
                del self._waiters[run_id]
        return len(doomed)


# ---- jobs --------------------------------------------------------------------------------
class MemoryQueue(JobQueue):
    """Jobs in heaps. Heap entries carry the epoch they were pushed at: an entry whose job has
    moved on since is skipped when it comes up."""

    provider: ClassVar[str] = "memory"
    durable: ClassVar[bool] = False

    def _last_of_a_dead_job(self, run: Run) -> bool:
        job = self._jobs.get(run.job_id)
        return job is not None and job.state is JobState.DEAD and job.run_id == run.id

    def __init__(self, runs: RunStore | None = None, clock: Clock | None = None) -> None:
        # Where the runs of these jobs are written: this backend's store, or a database's.
        self.runs: RunStore = (
            runs if runs is not None else MemoryRunStore(self.holds, self._last_of_a_dead_job)
        )
        # Its backend's: the engine computes a job's run_at on it (a database's: the server's).
        self.clock = clock if clock is not None else Clock()
        self._jobs: dict[str, Job] = {}
        self._ready: dict[str, list[tuple[int, int, str, int]]] = {}
        # The forced ones of the ready (retry-now, run-now), apart: what a paused queue claims,
        # found without going through the rest of its backlog at every claim. Their entries
        # stay in `_ready` too; whichever heap hands a job out, its entry in the other is stale
        # (the job's epoch moved on) and skipped there.
        self._forced: dict[str, list[tuple[int, int, str, int]]] = {}
        self._delayed: dict[str, list[tuple[float, int, str, int]]] = {}
        self._leases: list[tuple[float, int, str, int]] = []
        self._active: dict[str, Job] = {}
        self._finished: deque[tuple[float, str]] = deque()
        self._signals: dict[str, anyio.Event] = {}
        self._wakes_due: set[str] = set()
        self._seq = itertools.count()
        self._counts: dict[str, dict[JobState, int]] = {}
        self.changes = 0  # bumped by every write: the backend's change token
        self.owner: str | None = None  # the worker serving it, on a durable store (`serve_as`)

    # ---- bookkeeping -----------------------------------------------------------------------
    def serve_as(self, worker: str) -> None:
        self.owner = worker

    def _owned(self, run: Run) -> Run:
        """The run, naming the worker whose memory holds its job if it is pending and names
        none (a run not started, or a retry's next): `memory_runs` reads it."""
        if self.owner is not None and run.worker is None and run.status in PENDING_RUN_STATUSES:
            run.worker = self.owner
        return run

    def holds(self, fence: Fence) -> bool:
        job = self._jobs.get(fence.job_id)
        return job is not None and job.epoch == fence.epoch

    def _count(self, queue: str, state: JobState, delta: int) -> None:
        counts = self._counts.get(queue)
        if counts is None:
            counts = self._counts[queue] = dict.fromkeys(JobState, 0)
        counts[state] += delta

    def _push(self, job: Job) -> None:
        """Queue a waiting or delayed job (its count is the caller's)."""
        if job.run_at is not None and job.run_at.timestamp() > self.clock.time():
            job.__dict__["state"] = JobState.DELAYED  # the queue's own record (see _hand_out)
            heapq.heappush(
                self._delayed.setdefault(job.queue, []),
                (job.run_at.timestamp(), next(self._seq), job.id, job.epoch),
            )
        else:
            job.__dict__["state"] = JobState.WAITING
            entry = (-job.priority, next(self._seq), job.id, job.epoch)
            heapq.heappush(self._ready.setdefault(job.queue, []), entry)
            if job.force:
                heapq.heappush(self._forced.setdefault(job.queue, []), entry)
            self._wake_if_unclaimed_soon(job.queue)
            return
        self.wake(job.queue)

    def _live(self, job_id: str, epoch: int, state: JobState) -> Job | None:
        job = self._jobs.get(job_id)
        if job is None or job.epoch != epoch or job.state is not state:
            return None
        return job

    def wake(self, queue: str) -> None:
        signal = self._signals.pop(queue, None)
        if signal is not None:
            signal.set()

    # A job added while a slot of the queue is finishing another is usually taken by that slot
    # (`claim_nowait`) when it is back, in the event loop's next turn. Waking the claim loop
    # at once would have it run only to find the job gone: a task's turn and a claim for
    # nothing at every job of a busy queue. So the claim loop is woken from the next turn, and
    # only if the job is still waiting then.
    def _wake_if_unclaimed_soon(self, queue: str) -> None:
        if queue not in self._signals or queue in self._wakes_due:
            return  # no claim waits (a claim looks before it waits), or one is on its way
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on the event loop: nothing to wait a turn for
            self.wake(queue)
            return
        self._wakes_due.add(queue)
        loop.call_soon(self._wake_if_unclaimed, queue)

    def _wake_if_unclaimed(self, queue: str) -> None:
        self._wakes_due.discard(queue)
        if self._ready.get(queue):
            self.wake(queue)

    # ---- adding and claiming ---------------------------------------------------------------
    async def add(self, jobs: list[Job], runs: list[Run]) -> list[str]:
        added: list[str] = []
        by_job = {run.job_id: run for run in runs}
        for job in jobs:
            if job.id in self._jobs:
                continue
            self._jobs[job.id] = job
            self._push(job)
            self._count(job.queue, job.state, 1)
            run = by_job.get(job.id)
            if run is not None:
                self.runs.save_run(self._owned(run))
            added.append(job.id)
        self.changes += 1
        # A checkpoint, as a database queue's add is (it waits for its commit): a producer
        # enqueuing in a loop lets this process's workers run between its calls, not only
        # after its last one. (asyncio's own: anyio's checkpoint is this same sleep behind three
        # calls that look up the event loop's library, and this runs once a job.)
        await asyncio.sleep(0)
        return added

    def _promote(self, queue: str) -> float | None:
        """Move due delayed jobs to ready; seconds until the next one is due."""
        delayed = self._delayed.get(queue)
        if not delayed:
            return None
        now = self.clock.time()
        while delayed and delayed[0][0] <= now:
            _, _, job_id, epoch = heapq.heappop(delayed)
            job = self._live(job_id, epoch, JobState.DELAYED)
            if job is None:
                continue
            self._count(queue, JobState.DELAYED, -1)
            job.state = JobState.WAITING
            self._count(queue, JobState.WAITING, 1)
            entry = (-job.priority, next(self._seq), job_id, epoch)
            heapq.heappush(self._ready.setdefault(queue, []), entry)
            if job.force:
                heapq.heappush(self._forced.setdefault(queue, []), entry)
        return delayed[0][0] - now if delayed else None

    def _hand_out(
        self, job: Job, worker: str, lease_s: float, since: float, taken_from: str | None
    ) -> Claim:
        # The queue's own records: their fields written straight into their dict (every field
        # is set already; pydantic's __setattr__ would cost several times as much).
        fields = job.__dict__
        fields["epoch"] += 1
        fields["worker"] = worker
        fields["attempts"] += 1
        fields["lease_until"] = datetime.fromtimestamp(self.clock.time() + lease_s, UTC)
        fields["signals"] = {}
        self._active[job.id] = job
        self._watch_lease(job)
        return Claim(copy_job(job), lease_s, since, taken_from)

    def _watch_lease(self, job: Job) -> None:
        """Note when the job's lease runs out (a claim, a renewal). Entries of jobs settled or
        renewed since are dropped as they come up, or all at once when they outnumber the
        jobs held: otherwise a lease's worth of finished jobs would stay listed."""
        assert job.lease_until is not None
        leases = self._leases
        if len(leases) > 2 * len(self._active) + 1024:
            live: dict[str, tuple[float, int, str, int]] = {}
            for entry in leases:
                held = self._active.get(entry[2])
                if held is not None and held.epoch == entry[3]:
                    live[entry[2]] = max(live.get(entry[2], entry), entry)
            self._leases = leases = list(live.values())
            heapq.heapify(leases)
        heapq.heappush(leases, (job.lease_until.timestamp(), next(self._seq), job.id, job.epoch))

    def _take_expired(self, queue: str, limit: int, worker: str, lease_s: float) -> list[Claim]:
        now = self.clock.time()
        since = time.monotonic()
        taken: list[Claim] = []
        kept: list[tuple[float, int, str, int]] = []
        while self._leases and self._leases[0][0] < now and len(taken) < limit:
            entry = heapq.heappop(self._leases)
            job = self._live(entry[2], entry[3], JobState.ACTIVE)
            if job is None or job.lease_until is None or job.lease_until.timestamp() >= now:
                continue  # settled, re-claimed or renewed since
            if job.queue != queue:
                kept.append(entry)
                continue
            taken.append(self._hand_out(job, worker, lease_s, since, job.worker))
        for entry in kept:
            heapq.heappush(self._leases, entry)
        return taken

    def _take_due(
        self, queue: str, limit: int, worker: str, lease_s: float, forced_only: bool
    ) -> list[Claim]:
        ready = (self._forced if forced_only else self._ready).get(queue)
        claimed: list[Claim] = []
        if not ready:
            return claimed
        since = time.monotonic()
        counts = self._counts[queue]
        while ready and len(claimed) < limit:
            entry = heapq.heappop(ready)
            job = self._live(entry[2], entry[3], JobState.WAITING)
            if job is None:
                continue  # handed out from the other heap, or moved on
            counts[JobState.WAITING] -= 1
            job.__dict__["state"] = JobState.ACTIVE
            counts[JobState.ACTIVE] += 1
            claimed.append(self._hand_out(job, worker, lease_s, since, None))
        if not forced_only and not ready:
            self._forced.pop(queue, None)  # no job waits: every forced entry left is stale
        return claimed

    def _claim_now(
        self, queue: str, limit: int, worker: str, lease_s: float, forced_only: bool
    ) -> list[Claim]:
        claimed = self._take_expired(queue, limit, worker, lease_s) if self._leases else []
        if len(claimed) < limit:
            if self._delayed.get(queue):
                self._promote(queue)
            claimed += self._take_due(queue, limit - len(claimed), worker, lease_s, forced_only)
        if claimed:
            self.changes += 1
        return claimed

    def claim_nowait(self, queue: str, worker: str, lease_s: float) -> Claim | None:
        claimed = self._claim_now(queue, 1, worker, lease_s, False)
        return claimed[0] if claimed else None

    async def claim(
        self,
        queue: str,
        limit: int,
        worker: str,
        lease_s: float,
        *,
        forced_only: bool = False,
        timeout: float = 0.0,
        interrupted: Callable[[], bool] | None = None,
    ) -> list[Claim]:
        deadline = time.monotonic() + timeout
        with anyio.move_on_after(timeout):
            while True:
                claimed = self._claim_now(queue, limit, worker, lease_s, forced_only)
                if claimed:
                    return claimed
                if time.monotonic() >= deadline:
                    # Timed out. Not left to the scope alone: while wake-ups keep coming (a
                    # busy queue whose slots take every job first), its cancellation never
                    # finds this task waiting and is tried again at every turn of the loop.
                    return []
                next_due = self._promote(queue)
                if self._leases:
                    expiry = self._leases[0][0] - self.clock.time()
                    next_due = expiry if next_due is None else min(next_due, expiry)
                signal = self._signals.get(queue)
                if signal is None:  # not setdefault: that would make an Event every time
                    signal = self._signals[queue] = anyio.Event()
                if next_due is None or next_due >= deadline - time.monotonic():
                    # The claim's own timeout comes first (the common case: the next lease to
                    # run out is far off): no second scope to enter and leave at every wake.
                    await signal.wait()
                else:
                    with anyio.move_on_after(next_due):
                        await signal.wait()
                if interrupted is not None and interrupted():
                    return []
        return []

    # ---- transitions -----------------------------------------------------------------------
    def _update(self, job: Job, update: JobUpdate) -> None:
        fields = job.__dict__  # the queue's own record (see _hand_out)
        if update.state is JobState.ACTIVE:  # the holder keeps it: a new run, nothing else
            if update.run_id is not None:
                fields["run_id"] = update.run_id
            if update.meta is not None:
                fields["meta"] = dict(update.meta)
            return
        self._count(job.queue, job.state, -1)
        self._active.pop(job.id, None)
        fields["epoch"] += 1
        fields["worker"] = None
        fields["lease_until"] = None
        fields["signals"] = {}
        fields["force"] = update.force
        if update.run_id is not None:
            fields["run_id"] = update.run_id
        fields["resume"] = update.resume
        fields["error"] = update.error
        if update.meta is not None:
            fields["meta"] = dict(update.meta)
        if update.fresh_budget:
            fields["attempts"] = 0
        if update.headers is not None:
            fields["headers"] = update.headers
        if update.state in (JobState.WAITING, JobState.DELAYED):
            fields["finished_at"] = None
            fields["run_at"] = None if update.force else update.run_at
            self._push(job)
        else:
            fields["state"] = update.state
            now = self.clock.time()
            fields["finished_at"] = datetime.fromtimestamp(now, UTC)
            self._finished.append((now, job.id))
        self._count(job.queue, job.state, 1)

    def _apply(self, transition: Transition) -> bool:
        job = self._jobs.get(transition.job_id)
        if job is None or job.epoch != transition.epoch:
            return False
        if transition.update is not None:
            self._update(job, transition.update)
        for run in transition.runs:
            self.runs.save_run(self._owned(run))
        for run_id, line in transition.logs:
            self.runs.add_log(run_id, line)
        self.changes += 1
        return True

    def submit(self, transition: Transition) -> None:
        landed = self._apply(transition)
        if transition.landed is not None:
            transition.landed(landed)

    async def apply(self, transition: Transition) -> bool:
        return self._apply(transition)

    def record(self, run: Run, fence: Fence) -> None:
        job = self._jobs.get(fence.job_id)  # `holds`, inline: a job's every step passes here
        if job is not None and job.epoch == fence.epoch:
            self.runs.save_run(run)

    def record_log(self, run_id: str, line: LogLine, fence: Fence) -> None:
        if self.holds(fence):
            self.runs.add_log(run_id, line)

    async def renew(
        self, worker: str, lease_s: float, leave: Mapping[str, int] = NOTHING_LEFT
    ) -> Renewal:
        until = self.clock.time() + lease_s
        held: dict[str, int] = {}
        signals: dict[str, dict[str, float]] = {}
        for job in self._active.values():
            if job.worker != worker or leave.get(job.id) == job.epoch:
                continue
            job.lease_until = datetime.fromtimestamp(until, UTC)
            self._watch_lease(job)
            held[job.id] = job.epoch
            if job.signals:
                signals[job.id] = dict(job.signals)
        return Renewal(held, signals)

    async def signal(self, job_id: str, epoch: int, name: str) -> bool:
        job = self._active.get(job_id)
        if job is None or job.epoch != epoch:
            return False
        job.signals[name] = self.clock.time()
        self.changes += 1
        return True

    async def signals_for(self, worker: str) -> dict[str, dict[str, float]]:
        return {
            job.id: dict(job.signals)
            for job in self._active.values()
            if job.worker == worker and job.signals
        }

    # ---- reads -----------------------------------------------------------------------------
    async def get_job(self, job_id: str) -> Job | None:
        job = self._jobs.get(job_id)
        return copy_job(job) if job else None

    async def get_jobs(self, job_ids: Sequence[str]) -> list[Job]:
        return [copy_job(job) for job_id in job_ids if (job := self._jobs.get(job_id))]

    async def held_by(self, workers: list[str]) -> list[Job]:
        wanted = set(workers)
        return [copy_job(job) for job in self._active.values() if job.worker in wanted]

    async def stats(self, queue: str) -> QueueStats:
        self._promote(queue)
        return QueueStats.of(queue, self._counts.get(queue) or dict.fromkeys(JobState, 0))

    async def oldest_waiting(self, queue: str) -> datetime | None:
        self._promote(queue)
        oldest: datetime | None = None
        for _, _, job_id, epoch in self._ready.get(queue, ()):
            job = self._live(job_id, epoch, JobState.WAITING)
            if job is None:
                continue
            due = max(job.created_at, job.run_at) if job.run_at else job.created_at
            if oldest is None or due < oldest:
                oldest = due
        return oldest

    async def dead_letters(self, queue: str, limit: int = 1000) -> list[Job]:
        dead = [j for j in self._jobs.values() if j.queue == queue and j.state is JobState.DEAD]
        dead.sort(key=lambda job: job.finished_at or job.created_at, reverse=True)
        return [copy_job(job) for job in dead[:limit]]

    async def gated(self, queue: str, key: str, limit: int) -> list[Job]:
        found = []
        for _, _, job_id, epoch in self._delayed.get(queue, ()):
            job = self._live(job_id, epoch, JobState.DELAYED)
            if job is not None and _held_behind(job, key):
                found.append(job)
        found.sort(key=lambda job: (-job.priority, job.created_at))
        return [copy_job(job) for job in found[:limit]]

    async def purge(self, finished_before: datetime, limit: int = 2000) -> int:
        cutoff = finished_before.timestamp()
        purged = 0
        while self._finished and self._finished[0][0] < cutoff and purged < limit:
            _, job_id = self._finished.popleft()
            job = self._jobs.get(job_id)
            if job is None or job.state not in _PURGEABLE or job.finished_at is None:
                continue  # requeued since, or already gone
            if job.finished_at.timestamp() >= cutoff:
                continue
            del self._jobs[job_id]
            self._count(job.queue, job.state, -1)
            purged += 1
        return purged


_PURGEABLE = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})


# ---- the backend -------------------------------------------------------------------------


class MemoryBackend(Backend):
    kind: ClassVar[str] = "memory"
    durable: ClassVar[bool] = False
    multi_process: ClassVar[bool] = False

    def __init__(self) -> None:
        self.location = "memory"
        self.clock = Clock()
        self._queue = MemoryQueue(clock=self.clock)
        self.runs = self._queue.runs
        self.shared = MemoryShared()

    async def __aenter__(self) -> MemoryBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def queue(self, provider: str | None) -> JobQueue:
        if provider in (None, "memory"):
            return self._queue
        raise ValueError(provider_refusal(provider, self.kind))

    @property
    def queues(self) -> tuple[JobQueue, ...]:
        return (self._queue,)

    async def change_token(self) -> int:
        return self._queue.changes

    async def health(self) -> dict[str, Any]:
        return {"ok": True, "backend": "memory"}


__all__ = [
    "MemoryBackend",
    "MemoryQueue",
    "MemoryRunStore",
    "MemoryShared",
    "copy_job",
    "summary",
]


def _held_behind(job: Job, key: str) -> bool:
    """The concurrency gate held the job back behind `key`."""
    gate = job.gated_by("concurrency")
    return gate is not None and gate.get("key") == key
