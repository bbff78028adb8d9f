"""Worker queues: the `JobQueue` interface and the in-memory implementation.

A queue hands jobs to workers (`claim`), takes them back when they are done (`settle`), and
keeps the counts that `queue_stats` shows. Settling is fire-and-forget, like the store's writes,
so that a finished job costs the runner nothing to hand back.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from datetime import datetime

import anyio

from .models import Job, JobState, QueueStats, Run, utcnow


class QueueError(ValueError):
    """A request the queue cannot carry out: unknown job, nothing to requeue…"""


class JobQueue(ABC):
    provider: str

    async def open(self) -> None:  # noqa: B027 - optional hook
        pass

    async def close(self) -> None:  # noqa: B027 - optional hook
        pass

    async def health(self) -> dict[str, object]:
        return {"provider": self.provider, "ok": True}

    @abstractmethod
    async def add(self, jobs: list[Job], runs: list[Run]) -> None:
        """Enqueue jobs together with their queued runs; returns once they are durable."""

    @abstractmethod
    async def claim(self, queue: str, limit: int, worker: str, timeout: float) -> list[Job]:
        """Up to `limit` due jobs, highest priority first; [] if none came within `timeout`."""

    def claim_nowait(self, queue: str, worker: str) -> Job | None:
        """The next due job if the queue can hand it over at once, without a round trip;
        None otherwise. A worker that finished a job asks this first, so that a busy queue
        costs no task switch and no claim round trip per job."""
        return None

    def return_ahead(self, queue: str) -> None:  # noqa: B027 - only a queue that claims ahead
        """Hand back jobs claimed ahead and not started (the queue was paused or stopped)."""

    @abstractmethod
    def settle(self, job: Job, state: JobState, *, run_at: datetime | None = None) -> None:
        """Hand a claimed job back: finished (completed, failed, cancelled, dead), or delayed
        / waiting again (a retry with `job.run_id` already pointing at the next run, a wait).
        The caller saves the job's run in the same breath, so both land together."""

    @abstractmethod
    async def cancel_pending(self, job_id: str) -> bool:
        """Cancel a job that no worker holds; False if a worker holds it or it has ended."""

    @abstractmethod
    async def get_job(self, job_id: str) -> Job | None: ...

    @abstractmethod
    async def stats(self, queue: str) -> QueueStats: ...

    @abstractmethod
    async def dead_letters(self, queue: str, limit: int = 1000) -> list[Job]: ...

    @abstractmethod
    async def requeue(self, job_id: str, run: Run) -> Job:
        """Put a dead (or failed) job back as waiting, with `run` as its next run."""

    def assign_run(self, job: Job) -> None:  # noqa: B027 - memory jobs are the same objects
        """Record that a claimed job now executes a new run (`job.run_id`), after a crash."""

    def renew(self, worker: str, lease_s: float) -> None:  # noqa: B027 - leases are optional
        pass

    async def release_worker(self, worker: str) -> int:
        """Put every job this worker holds back to waiting (after a crash or a drain)."""
        return 0

    def wake(self, queue: str) -> None:  # noqa: B027 - pollers need no wake-up
        pass

    # An operator's "run it now": these ignore the queue's order, pause and run_at.
    async def take(self, job_id: str, worker: str) -> Job | None:
        """Claim this one job at once if it waits (waiting or delayed) and no worker holds it;
        None otherwise, or when the queue cannot single one out."""
        return None

    async def make_due(self, job_id: str) -> Job | None:
        """Bring a waiting or delayed job's run_at forward to now, for whichever worker claims
        next; None if the job is not waiting."""
        return None


class MemoryQueue(JobQueue):
    """Heaps in memory: fast, and nothing is kept when the process ends."""

    provider = "memory"

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._ready: dict[str, list[tuple[int, int, str]]] = {}
        self._delayed: dict[str, list[tuple[float, int, str]]] = {}
        self._signals: dict[str, anyio.Event] = {}
        self._seq = itertools.count()
        self._counts: dict[str, dict[JobState, int]] = {}

    def _count(self, queue: str, state: JobState, delta: int) -> None:
        counts = self._counts.get(queue)
        if counts is None:
            counts = self._counts[queue] = dict.fromkeys(JobState, 0)
        counts[state] += delta

    def _push(self, job: Job) -> None:
        if job.run_at is not None and job.run_at > utcnow():
            job.state = JobState.DELAYED
            heapq.heappush(
                self._delayed.setdefault(job.queue, []),
                (job.run_at.timestamp(), next(self._seq), job.id),
            )
        else:
            job.state = JobState.WAITING
            heapq.heappush(
                self._ready.setdefault(job.queue, []),
                (-job.priority, next(self._seq), job.id),
            )
        self._count(job.queue, job.state, 1)
        self.wake(job.queue)

    async def add(self, jobs: list[Job], runs: list[Run]) -> None:
        for job in jobs:
            self._jobs[job.id] = job
            self._push(job)

    def wake(self, queue: str) -> None:
        signal = self._signals.pop(queue, None)
        if signal is not None:
            signal.set()

    def _promote(self, queue: str) -> float | None:
        """Move due delayed jobs to ready; return seconds until the next one is due."""
        delayed = self._delayed.get(queue)
        if not delayed:
            return None
        now = utcnow().timestamp()
        while delayed and delayed[0][0] <= now:
            _, _, job_id = heapq.heappop(delayed)
            job = self._jobs.get(job_id)
            if job is None or job.state is not JobState.DELAYED:
                continue  # cancelled or requeued meanwhile
            self._count(queue, JobState.DELAYED, -1)
            job.state = JobState.WAITING
            self._count(queue, JobState.WAITING, 1)
            heapq.heappush(
                self._ready.setdefault(queue, []), (-job.priority, next(self._seq), job_id)
            )
        return delayed[0][0] - now if delayed else None

    def _take_due(self, queue: str, limit: int, worker: str) -> list[Job]:
        ready = self._ready.get(queue)
        claimed: list[Job] = []
        if not ready:
            return claimed
        counts = self._counts[queue]
        while ready and len(claimed) < limit:
            _, _, job_id = heapq.heappop(ready)
            job = self._jobs.get(job_id)
            if job is None or job.state is not JobState.WAITING:
                continue
            counts[JobState.WAITING] -= 1
            job.state = JobState.ACTIVE
            job.worker = worker
            job.attempts += 1
            counts[JobState.ACTIVE] += 1
            claimed.append(job)
        return claimed

    def claim_nowait(self, queue: str, worker: str) -> Job | None:
        if self._delayed.get(queue):
            self._promote(queue)
        claimed = self._take_due(queue, 1, worker)
        return claimed[0] if claimed else None

    async def claim(self, queue: str, limit: int, worker: str, timeout: float) -> list[Job]:
        with anyio.move_on_after(timeout):
            while True:
                next_due = self._promote(queue)
                claimed = self._take_due(queue, limit, worker)
                if claimed:
                    return claimed
                signal = self._signals.setdefault(queue, anyio.Event())
                with anyio.move_on_after(next_due if next_due is not None else timeout):
                    await signal.wait()
        return []

    def settle(self, job: Job, state: JobState, *, run_at: datetime | None = None) -> None:
        current = self._jobs.get(job.id)
        if current is None:
            return
        self._count(job.queue, current.state, -1)
        current.worker = None
        if state in (JobState.WAITING, JobState.DELAYED):
            current.run_at = run_at
            self._push(current)
            return
        current.state = state
        current.finished_at = utcnow()
        self._count(job.queue, state, 1)

    async def cancel_pending(self, job_id: str) -> bool:
        job = self._jobs.get(job_id)
        if job is None or job.state not in (JobState.WAITING, JobState.DELAYED):
            return False
        self._count(job.queue, job.state, -1)
        job.state = JobState.CANCELLED
        job.finished_at = utcnow()
        self._count(job.queue, JobState.CANCELLED, 1)
        return True

    async def get_job(self, job_id: str) -> Job | None:
        job = self._jobs.get(job_id)
        return job.model_copy() if job else None

    async def stats(self, queue: str) -> QueueStats:
        self._promote(queue)
        counts = self._counts.get(queue) or dict.fromkeys(JobState, 0)
        return QueueStats(
            queue=queue,
            waiting=counts[JobState.WAITING],
            active=counts[JobState.ACTIVE],
            completed=counts[JobState.COMPLETED],
            failed=counts[JobState.FAILED],
            delayed=counts[JobState.DELAYED],
            dead=counts[JobState.DEAD],
            cancelled=counts[JobState.CANCELLED],
        )

    async def dead_letters(self, queue: str, limit: int = 1000) -> list[Job]:
        dead = [j for j in self._jobs.values() if j.queue == queue and j.state is JobState.DEAD]
        dead.sort(key=lambda job: job.finished_at or job.created_at, reverse=True)
        return [job.model_copy() for job in dead[:limit]]

    async def requeue(self, job_id: str, run: Run) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise QueueError(f"no job {job_id!r}")
        if job.state not in (JobState.DEAD, JobState.FAILED):
            raise QueueError(f"job {job_id} is {job.state}, only dead or failed jobs are requeued")
        self._count(job.queue, job.state, -1)
        job.run_id = run.id
        job.attempts = 0
        job.run_at = None
        job.finished_at = None
        job.error = None
        job.resume = False
        self._push(job)
        return job.model_copy()

    async def release_worker(self, worker: str) -> int:
        held = [j for j in self._jobs.values() if j.state is JobState.ACTIVE and j.worker == worker]
        for job in held:
            self.settle(job, JobState.WAITING)
        return len(held)

    def _unqueue(self, job: Job) -> None:
        """Take a waiting or delayed job out of the heaps, so no stale entry promotes or hands
        it out later."""
        self._count(job.queue, job.state, -1)
        for heaps in (self._ready, self._delayed):
            heap = heaps.get(job.queue)
            if heap:
                heap[:] = [entry for entry in heap if entry[2] != job.id]
                heapq.heapify(heap)

    async def take(self, job_id: str, worker: str) -> Job | None:
        job = self._jobs.get(job_id)
        if job is None or job.state not in (JobState.WAITING, JobState.DELAYED):
            return None
        self._unqueue(job)
        job.state = JobState.ACTIVE
        job.worker = worker
        job.attempts += 1
        self._count(job.queue, JobState.ACTIVE, 1)
        return job

    async def make_due(self, job_id: str) -> Job | None:
        job = self._jobs.get(job_id)
        if job is None or job.state not in (JobState.WAITING, JobState.DELAYED):
            return None
        self._unqueue(job)
        job.run_at = None
        self._push(job)
        return job.model_copy()
