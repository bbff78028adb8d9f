"""The backend seam: where runs, jobs and what worker processes share are kept.

A `Backend` opens three things, each an interface with one contract test suite that every
implementation passes (tests/backends/):

- `RunStore`: run records with their steps, attempts and logs; the idempotency cache; the change
  feed an attached console follows.
- `JobQueue`: jobs, claimed under a lease with a fencing token (`Job.epoch`). Every write a
  worker makes for a job it holds (its run's progress, its settle) names the epoch it claimed
  the job at, and is dropped once the job has moved on (another worker took it over after the
  lease expired, an operator cancelled it). A job's change of state and its run's record commit
  together: `JobQueue.apply` takes both.
- `SharedState`: what the processes serving one database share — pauses, concurrency slots,
  debounce windows, the worker registry and what each worker serves, leader leases for cluster
  chores, and a change token that moves whenever anything was written.

Nothing outside `engine/backends/` knows which backend it has, imports a database driver or holds
SQL. The engine's logic (which state follows which: engine/ledger.py) is written once, against
these interfaces.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from ..filters import RunFilter
from ..models import Job, JobState, LogLine, QueueStats, Run, WorkerInfo, WorkflowInfo

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CacheHit:
    output: Any
    run_id: str


# ---- fencing -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Fence:
    """The right to write a job and its run: the job, and the epoch it was claimed at."""

    job_id: str
    epoch: int


@dataclass(slots=True)
class Claim:
    """A job handed to a worker. `job.epoch` is the fencing token of every write the worker
    makes for it; `held_since` (time.monotonic, taken before the claim or the last renewal was
    asked) tells the worker when it must consider the lease lost if no renewal confirmed it."""

    job: Job
    lease_s: float
    held_since: float
    taken_from: str | None = None  # the worker whose expired lease this claim took over

    @property
    def fence(self) -> Fence:
        return Fence(self.job.id, self.job.epoch)

    def lease_lost(self, now: float | None = None) -> bool:
        """True once the lease may have run out: the worker must not start the job, and a
        job it is running is no longer its own to record."""
        return (time.monotonic() if now is None else now) - self.held_since >= self.lease_s


@dataclass(slots=True, kw_only=True)
class JobUpdate:
    """A job's next state. Applying it bumps the epoch, clears the worker, its lease and its
    signals; `finished_at` is set for a terminal state and cleared otherwise.

    `state=ACTIVE` is the holder's own update while it keeps the job (a takeover that gives the
    job a new run): only `run_id` and `meta` change; the epoch, worker and lease stay."""

    state: JobState
    run_id: str | None = None  # the run the job now points at (None: unchanged)
    run_at: datetime | None = None  # waiting/delayed: not before this (None: due now)
    resume: bool = False  # the next delivery resumes `run_id` (after a wait)
    error: str | None = None
    meta: dict[str, Any] | None = None  # replaces the job's meta (None: unchanged)
    fresh_budget: bool = False  # deliveries back to 0: a requeue gives a fresh retry budget
    force: bool = False  # due now even on a paused queue (an operator's "run it now")
    headers: dict[str, str] | None = None  # replaces the job's headers (None: unchanged)


@dataclass(slots=True)
class Transition:
    """A job's change of state and the run records that go with it, applied together or not
    at all: only if the job is still at `epoch`."""

    job_id: str
    epoch: int
    update: JobUpdate | None  # None: only the runs are written (still fenced)
    runs: tuple[Run, ...] = ()
    logs: tuple[tuple[str, LogLine], ...] = ()  # (run id, line): engine lines for the runs
    # For `submit`: told, once the commit that decided it is done, whether the transition
    # landed (True) or was refused at its epoch (False), so that the process which submitted
    # it knows without reading the job back. Called in the event loop's thread, at most once;
    # not at all if the process goes down first.
    landed: Callable[[bool], None] | None = None


@dataclass(frozen=True, slots=True)
class Renewal:
    """What a lease renewal found: the jobs the worker still holds (id → epoch) and the
    operator requests waiting for it (id → {signal: requested at})."""

    held: dict[str, int]
    signals: dict[str, dict[str, float]]


# ---- the change feed ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class FeedCursor:
    """Where a reader of the change feed is: the last run revision and log line it saw."""

    rev: int = 0
    log_id: int = 0


@dataclass(frozen=True, slots=True)
class FeedLog:
    id: int
    run_id: str
    step: int | None
    level: str
    message: str


@dataclass(slots=True)
class FeedPage:
    """Runs written since the cursor (with steps and attempts, without logs), in commit order,
    and log lines after it. `lagged`: more changed than one page holds; the reader skipped to
    the end (`cursor`) and should re-read what it shows."""

    runs: list[Run]
    logs: list[FeedLog]
    cursor: FeedCursor
    lagged: int = 0


# ---- what workers serve ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ServedQueue:
    """A queue as a worker declared it: enough for another process to enqueue to it."""

    name: str
    workflow_name: str
    workflow_version: str
    provider: str
    concurrency: int
    retries: int
    start_delay_ms: int | None = None  # the trigger's start_delay: every job waits this long
    timeout_ms: int | None = None


@dataclass(frozen=True, slots=True)
class WorkerCatalog:
    """What one worker serves: its queues, its workflows (with their top-level steps as
    (name, kind)) and the workflow files that failed to load there."""

    worker: str
    queues: tuple[ServedQueue, ...]
    workflows: tuple[WorkflowInfo, ...]
    step_kinds: dict[str, tuple[tuple[str, str], ...]]  # workflow → ((step, kind), ...)
    reload_errors: dict[str, str]
    updated_at: float


# ---- debounce windows --------------------------------------------------------------------
@dataclass(slots=True)
class Window:
    """An open debounce window of one (workflow, key, mode)."""

    run_id: str
    job_id: str
    created_at: float  # of the job that holds the window: the newest of the burst
    opened_at: float
    until: float  # trailing: when the held run fires; leading: when the window closes


# ---- the interfaces ----------------------------------------------------------------------
class RunStore(ABC):
    """Run records. Writes do not block: an implementation persists them in order and
    `flush()` waits until it has. A write with a `fence` lands only if the fenced job is still
    at that epoch, checked where the write commits (stores that commit apart from their job
    queue are handed only writes their queue has checked, with no fence)."""

    @abstractmethod
    def save_run(self, run: Run, fence: Fence | None = None) -> None:
        """Persist the run as it is now, with its steps and attempts."""

    @abstractmethod
    def add_log(self, run_id: str, line: LogLine, fence: Fence | None = None) -> None: ...

    @abstractmethod
    def cache_put(
        self, workflow: str, step: str, key: str, output: Any, run_id: str, ttl_ms: int
    ) -> None: ...

    @abstractmethod
    async def cache_get(self, workflow: str, step: str, key: str) -> CacheHit | None: ...

    @abstractmethod
    async def flush(self) -> None:
        """Wait until every write made so far is committed."""

    @abstractmethod
    async def get_run(self, run_id: str) -> Run | None:
        """The run with its steps, attempts and logs: a snapshot the caller may keep, which
        never changes afterwards. A store may hand the same record to every reader (a memory
        store does, for a run that ended), so a caller must not change it: it changes a copy
        (`engine.records.copy_run`) and saves that."""

    @abstractmethod
    async def list_runs(
        self, where: RunFilter | None = None, limit: int = 100, offset: int = 0
    ) -> list[Run]:
        """Newest first (by created_at), without steps and logs (get_run has them)."""

    @abstractmethod
    async def count_runs(self, where: RunFilter | None = None) -> int: ...

    @abstractmethod
    async def runs_by_id(self, run_ids: list[str]) -> list[Run]:
        """These runs (those that exist), without steps and logs."""

    @abstractmethod
    async def pending_runs(self, queues: list[str]) -> list[Run]:
        """Runs of these queues that wait (queued, delayed, waiting, throttled), without
        steps: the runs of in-memory queues, queued again after a restart."""

    @abstractmethod
    async def purge(self, finished_before: datetime, limit: int = 500) -> int:
        """Delete up to `limit` terminal runs that finished before the cut-off, and expired
        cache entries; the number of runs deleted."""

    @abstractmethod
    async def feed(self, cursor: FeedCursor, limit: int = 1000) -> FeedPage:
        """What changed since `cursor`: runs in the order their writes committed, and log
        lines. A reader polls this when the backend's change token moved."""

    @abstractmethod
    async def feed_cursor(self) -> FeedCursor:
        """The cursor of the newest change: where a new reader starts."""


class JobQueue(ABC):
    """Jobs of one provider ("memory": in this process; "sqlite", "postgres": in the database).

    Claims are fenced: each bumps the job's epoch and hands the job with it. A job whose lease
    ran out (its worker stopped renewing) is claimed again by the ordinary claim, with
    `Claim.taken_from` naming the worker that lost it. `apply` and `record` write only while the
    job is still at the epoch they name."""

    provider: ClassVar[str]

    @abstractmethod
    async def add(self, jobs: list[Job], runs: list[Run]) -> list[str]:
        """Enqueue jobs together with their first runs; returns, once durable, the ids of the
        jobs added (a job whose id is already known is not added again, nor its run)."""

    @abstractmethod
    async def claim(
        self,
        queue: str,
        limit: int,
        worker: str,
        lease_s: float,
        *,
        forced_only: bool = False,
        timeout: float = 0.0,
    ) -> list[Claim]:
        """Up to `limit` due jobs (waiting or delayed past run_at; or active with an expired
        lease), highest priority first then oldest; [] if none came within `timeout` seconds.
        `forced_only`: only jobs an operator asked to run now (the queue is paused)."""

    def claim_nowait(self, queue: str, worker: str, lease_s: float) -> Claim | None:
        """The next due job if the queue can hand it over at once, without a round trip (a
        queue that claims ahead keeps a few); None otherwise."""
        return None

    def return_ahead(self, queue: str) -> None:  # noqa: B027 - only a queue that claims ahead
        """Hand back jobs claimed ahead and not started (the queue was paused or stopped)."""

    @abstractmethod
    def submit(self, transition: Transition) -> None:
        """Apply a transition with the next commit, without waiting (a worker's settle); then
        call `transition.landed`, if any, with whether it landed."""

    @abstractmethod
    async def apply(self, transition: Transition) -> bool:
        """Apply a transition now: True once committed, False if the job was not at the
        transition's epoch (or does not exist) and nothing was written."""

    @abstractmethod
    def record(self, run: Run, fence: Fence) -> None:
        """Persist the run of a job held at `fence` (its progress); dropped if stale."""

    @abstractmethod
    def record_log(self, run_id: str, line: LogLine, fence: Fence) -> None: ...

    @abstractmethod
    async def renew(self, worker: str, lease_s: float) -> Renewal:
        """Extend the lease of every job `worker` holds; what it still holds and the signals
        waiting for it."""

    @abstractmethod
    async def signal(self, job_id: str, epoch: int, name: str) -> bool:
        """Leave a request ("cancel", "retry_now") for the worker holding the job; False if
        the job is not held at that epoch."""

    @abstractmethod
    async def signals_for(self, worker: str) -> dict[str, dict[str, float]]:
        """The signals waiting on jobs `worker` holds (a read: nothing is renewed)."""

    @abstractmethod
    async def get_job(self, job_id: str) -> Job | None: ...

    @abstractmethod
    async def held_by(self, workers: list[str]) -> list[Job]:
        """Active jobs these workers hold (boot recovery of dead workers)."""

    @abstractmethod
    async def stats(self, queue: str) -> QueueStats:
        """Counts by state; `waiting` are due now, `delayed` wait for their run_at."""

    @abstractmethod
    async def dead_letters(self, queue: str, limit: int = 1000) -> list[Job]:
        """Dead jobs, the last to die first."""

    @abstractmethod
    async def purge(self, finished_before: datetime) -> int:
        """Forget finished jobs (completed, failed, cancelled) that ended before the cut-off;
        dead letters stay until requeued."""

    def wake(self, queue: str) -> None:  # noqa: B027 - a queue that polls needs no wake-up
        """Something became due on `queue` in this process: idle claims may look now."""


class SharedState(ABC):
    """What the processes serving one database share, beside runs and jobs."""

    # workers
    @abstractmethod
    def heartbeat(self, worker: WorkerInfo) -> None: ...

    @abstractmethod
    async def workers(self) -> list[WorkerInfo]: ...

    @abstractmethod
    async def forget_worker(self, worker_id: str) -> None:
        """Drop the worker and its concurrency slots. Its catalog stays: what it served stays
        known (a producer can still enqueue to it) until another worker publishes its own."""

    @abstractmethod
    def publish_catalog(self, catalog: WorkerCatalog) -> None:
        """Declare what a worker serves; catalogs of workers no longer registered go."""

    @abstractmethod
    async def catalogs(self) -> list[WorkerCatalog]:
        """Every worker's catalog, oldest first (a later declaration of a queue wins)."""

    # pauses
    @abstractmethod
    async def paused_queues(self) -> set[str]: ...

    @abstractmethod
    async def set_paused(self, queue: str, paused: bool) -> None: ...

    # concurrency slots
    @abstractmethod
    async def acquire_slot(
        self, workflow: str, key: str, limit: int, run_id: str, worker: str, lease_s: float
    ) -> tuple[bool, int]:
        """Take one of `limit` slots of (workflow, key) for the run: (taken, holders now). A
        run that holds one keeps it; slots whose worker's lease ran out are free again."""

    @abstractmethod
    def release_slot(self, run_id: str) -> None: ...

    @abstractmethod
    def renew_slots(self, worker: str, lease_s: float) -> None: ...

    @abstractmethod
    async def slot_holders(self, workflow: str, key: str) -> list[str]:
        """Run ids holding a live slot of (workflow, key)."""

    # debounce windows
    @abstractmethod
    async def update_window(
        self,
        workflow: str,
        key: str,
        mode: str,
        decide: Callable[[Window | None], tuple[T, Window | None, bool]],
    ) -> T:
        """Read the window of (workflow, key, mode) and let `decide` return (result, window,
        write); when `write`, store the window (None: delete it). Atomic with respect to every
        other process; `decide` runs inside the transaction, so it does no I/O."""

    @abstractmethod
    async def close_windows(self, before: float) -> None:
        """Forget leading windows that closed before `before` (history only)."""

    # cluster chores
    @abstractmethod
    async def try_lead(self, chore: str, worker: str, ttl_s: float) -> bool:
        """Hold (or renew) the lease on a chore for `ttl_s`; False while another live worker
        holds it. One worker at a time runs each chore."""

    @abstractmethod
    async def resign(self, chore: str, worker: str) -> None: ...


class Backend(ABC):
    """One database (or this process's memory): a run store, job queues, and shared state.

    Use as `async with backend:`; background work (a batching writer, a listener) runs inside.
    """

    kind: ClassVar[str]  # memory | sqlite | postgres
    location: str  # what to show the user: a path or a URL without its password
    shared: SharedState
    runs: RunStore
    # Several processes (on one host, or several) can serve the same database.
    multi_process: ClassVar[bool] = False

    @abstractmethod
    async def __aenter__(self) -> Backend: ...

    @abstractmethod
    async def __aexit__(self, *exc: object) -> None: ...

    @abstractmethod
    def queue(self, provider: str | None) -> JobQueue:
        """The queue of a provider: "memory" (jobs in this process), the database's own kind,
        or None (the backend's default). Raises ValueError with the reason for any other."""

    @property
    @abstractmethod
    def queues(self) -> tuple[JobQueue, ...]:
        """Every queue opened so far, the database's first."""

    async def find_job(self, job_id: str) -> tuple[JobQueue, Job] | None:
        """The job and the queue that has it, looking in every queue."""
        for queue in self.queues:
            job = await queue.get_job(job_id)
            if job is not None:
                return queue, job
        return None

    @abstractmethod
    async def change_token(self) -> int:
        """A number that moves whenever another process committed something."""

    async def wait_for_change(self, token: int, timeout: float) -> int:
        """Return the change token once it moved from `token`, or after `timeout` seconds."""
        import anyio

        with anyio.move_on_after(timeout):
            while True:
                current = await self.change_token()
                if current != token:
                    return current
                await anyio.sleep(self.change_poll_s)
        return token

    change_poll_s: ClassVar[float] = 0.05

    @abstractmethod
    async def health(self) -> dict[str, Any]:
        """{"ok": bool, ...}: the database answers and is sound."""

    def flush_now(self) -> None:  # noqa: B027 - nothing buffered by default
        """Commit what is pending from the calling thread, without the event loop: for a
        process going down on an unhandled error."""


__all__ = [
    "Backend",
    "CacheHit",
    "Claim",
    "FeedCursor",
    "FeedLog",
    "FeedPage",
    "Fence",
    "JobQueue",
    "JobUpdate",
    "Renewal",
    "RunStore",
    "ServedQueue",
    "SharedState",
    "Transition",
    "Window",
    "WorkerCatalog",
]
