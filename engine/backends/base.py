"""The backend seam: where runs, jobs and what worker processes share are kept.

A `Backend` opens three things, each an interface with one contract test suite that every
implementation passes (tests/backends/):

- `RunStore`: run records with their steps, attempts and logs; the idempotency cache; the change
  feed an attached console follows; each run's event mailbox.
- `JobQueue`: jobs, claimed under a lease with a fencing token (`Job.epoch`). Every write a
  worker makes for a job it holds (its run's progress, its settle) names the epoch it claimed
  the job at, and is dropped once the job has moved on (another worker took it over after the
  lease expired, an operator cancelled it). A job's change of state and its run's record commit
  together: `JobQueue.apply` takes both.
- `SharedState`: what the processes serving one database share — pauses, concurrency slots,
  debounce windows, schedules and their ticks, rate-limit windows, the worker registry and what
  each worker serves, leader leases for cluster chores, and a change token that moves whenever
  anything was written.

Nothing outside `engine/backends/` knows which backend it has, imports a database driver or holds
SQL. The engine's logic (which state follows which: engine/ledger.py) is written once, against
these interfaces.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

from ..clock import Clock
from ..filters import RunFilter
from ..models import Job, JobState, LogLine, QueueStats, Run, WorkerInfo, WorkflowInfo
from .places import RateDecision

T = TypeVar("T")


@dataclass(slots=True, eq=False)  # one reader's: the same pace only if the same object
class Pace:
    """One reader's pace through the changes (`Backend.wait_for_change`), for a reader that
    reads everything that changed (a worker's signals and pauses, a console's feed): once it
    comes back to find changes waiting already, twice running (they keep coming while it reads
    the last ones: the database is busy), it is told at most every so often, not once per
    change. Each such reader keeps its own: one reader's window does not hold up another, and a
    `wait_for_job` (no pace: told at once) is held up by none."""

    last_return: float = 0.0
    was_busy: bool = False
    urgent_seen: int = 0  # the backend's count of urgent changes (signals) at its last return


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
    makes for it; `held_since` (time.monotonic, taken no later than the claim set the lease or
    the last renewal was asked) tells the worker when it must consider the lease lost if no
    renewal confirmed it."""

    job: Job
    lease_s: float
    held_since: float
    taken_from: str | None = None  # the worker whose expired lease this claim took over
    # The worker whose lease this claim took over had been handed the job (`Job.handed`): its
    # run may have begun even if its record still says queued.
    taken_handed: bool = False

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
    job a new run, a stopped run recorded): only `run_id` and `meta` change, and the job is no
    longer `handed` (the run's record says where it is); the epoch, worker and lease stay."""

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


NOTHING_LEFT: Mapping[str, int] = MappingProxyType({})


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

    def names(self) -> tuple[list[str], list[str]]:
        """Its workflows' names and its queues' names: a stopped worker's catalog that shares
        one of either with a running worker's is forgotten (`SharedState.publish_catalog`)."""
        return [w.name for w in self.workflows], [q.name for q in self.queues]

    def overlaps(self, other: WorkerCatalog) -> bool:
        workflows, queues = other.names()
        return any(w.name in workflows for w in self.workflows) or any(
            q.name in queues for q in self.queues
        )


# ---- debounce windows --------------------------------------------------------------------
@dataclass(slots=True)
class Window:
    """An open debounce window of one (workflow, key, mode)."""

    run_id: str
    job_id: str
    created_at: float  # of the job that holds the window: the newest of the burst
    opened_at: float
    until: float  # trailing: when the held run fires; leading: when the window closes


# ---- event mailboxes ---------------------------------------------------------------------
def payload_key(payload: Any, path: tuple[str, ...]) -> str | None:
    """The delivery key an event's payload carries at `path` ("order_id" of a wait with
    match="$.body.order_id"), as text; None when the payload has nothing there. Every backend
    compares keys with this one function, so a key means the same on all of them."""
    value = payload
    for part in path:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif (
            isinstance(value, list)
            and part.lstrip("-").isdigit()
            and -len(value) <= int(part) < len(value)
        ):
            value = value[int(part)]
        else:
            return None
    return key_text(value)


def key_text(value: Any) -> str | None:
    """A key value as text, the same for a waiting run's `match` and an event's payload:
    None for nothing or a structure (no key), booleans as JSON writes them."""
    if value is None or isinstance(value, dict | list):
        return None
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True, slots=True)
class EventMessage:
    """One event in a run's mailbox (or, sent by key with nobody waiting, in nobody's yet).

    `taken_by` names the wait step that took it (its record's index and name, "3:approval"),
    None while nobody has: such an event stays visible with the run until the run is purged."""

    id: int  # increasing in the order events were sent (per database)
    run_id: str | None  # None: sent by key, kept for the first run that waits on its key
    event: str
    payload: Any
    sent_at: float  # epoch seconds
    taken_by: str | None = None
    taken_at: float | None = None


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where a sent event went: `run_id`'s mailbox, as message `message_id`. `waiting`: the
    run was registered as waiting for this event when the message committed, so the sender
    must bring its job forward (the run will not look again by itself before its timeout)."""

    run_id: str
    message_id: int
    waiting: bool


@dataclass(frozen=True, slots=True)
class EventWaiter:
    """A run parked in a wait for an event: registered by `take_event` when its mailbox had
    nothing, until the wait takes a message or gives up. With `path`, it waits for a message
    whose payload holds `key` at `path` (sent by key, with no run id)."""

    run_id: str
    step: str
    event: str
    key: str | None = None
    path: tuple[str, ...] = ()


# ---- schedules ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A schedule as a worker declared it: enough for any process (a client with no
    workflows) to list it, compute its next tick and run it now."""

    workflow: str
    schedule: str  # the schedule's id within its workflow ("every 30s", "cron 0 * * * * UTC")
    queue: str
    cron: str | None
    every_ms: int | None
    timezone: str
    catch_up: str  # latest | all | none
    payload: Any = None


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """A schedule and what it did: the newest tick claimed (epoch seconds; a tick skipped by
    catch_up="none" counts as claimed, with no job), the last job it enqueued and that job's
    run (a tick's or an operator's "run now"), and whether it is paused."""

    spec: ScheduleSpec
    last_tick: float
    paused: bool = False
    last_fired_at: float | None = None
    last_job_id: str | None = None
    last_run_id: str | None = None


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
    def add_log(self, run_id: str, line: LogLine, fence: Fence | None = None) -> None:
        """Persist a line the caller has also put on the run (`run.logs`, or its step's
        `logs`): `get_run` shows it once, and the change feed hands it to followers."""

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
        self, where: RunFilter | None = None, limit: int | None = 100, offset: int = 0
    ) -> list[Run]:
        """Newest first (by created_at), no steps nor logs (get_run has them); limit None: all."""

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
    async def adopt_runs(self, runs: Sequence[tuple[str, str | None]], worker: str) -> set[str]:
        """Record `worker` as the holder of pending runs (a memory queue's, whose jobs were in
        the memory of a process that is gone), each given as its id and the worker its record
        was read naming (None: no worker): each one that is still pending and still names that
        worker. The ids of those it did, in one write; a run another worker adopted first, or
        that moved on, is not among them. Committed when it returns: of two workers adopting
        one run, one has it."""

    @abstractmethod
    async def purge(self, finished_before: datetime, limit: int = 500) -> int:
        """Delete up to `limit` terminal runs that finished before the cut-off, and expired
        cache entries; the number of runs deleted. A dead letter's last run is kept with its
        job: its error and traceback say why it died, and a replay starts from it."""

    @abstractmethod
    async def feed(self, cursor: FeedCursor, limit: int = 1000) -> FeedPage:
        """What changed since `cursor`: runs in the order their writes committed, and log
        lines. A reader polls this when the backend's change token moved."""

    @abstractmethod
    async def feed_cursor(self) -> FeedCursor:
        """The cursor of the newest change: where a new reader starts."""

    # ---- event mailboxes (engine/mailbox.py) ----------------------------------------------
    @abstractmethod
    async def post_event(
        self, event: str, payload: Any, *, run_id: str | None
    ) -> list[Delivery] | None:
        """Put an event in mailboxes, durably (committed when this returns), atomically with
        respect to `take_event`: a waiter registered before this commits is reported
        `waiting`, one that registers after it finds the message.

        With `run_id`: one message in that run's mailbox; None (nothing written) if the run
        does not exist or has ended (a terminal status) when it commits.
        With `run_id=None` (delivery by key): one message per run registered waiting for
        `event` with a `path` at which the payload holds the waiter's key
        (`payload_key(payload, path) == key`), each marked `waiting`; if none matches, one
        message with no run, kept for the first run that waits on a matching key (`[]`)."""

    @abstractmethod
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
        """The message a wait step takes, in one atomic step:
        1. the message this (run_id, step) already took, if any (a wait that resumes again,
           or re-runs after a crash, gets the same one);
        2. else the oldest message in the run's mailbox for `event` that nobody took;
        3. else, with `path`, the oldest message with no run for `event` whose payload holds
           `key` at `path` (it becomes this run's);
        the message found is marked taken by `step` and the run's waiter is dropped.
        If none: with `register`, (run_id, step, event, key, path) is registered as a waiter
        (replacing the run's previous one) and None returned; without, the waiter is dropped
        (the wait gave up) and None returned."""

    @abstractmethod
    async def events_of(self, run_id: str) -> list[EventMessage]:
        """Every message of the run's mailbox, taken or not, oldest first."""

    @abstractmethod
    async def event_waiters(self, run_ids: list[str] | None = None) -> list[EventWaiter]:
        """The registered waiters (of these runs, or all), for the console's "waiting for"."""

    @abstractmethod
    async def purge_events(self, sent_before: float) -> int:
        """Forget messages with no run sent before the cut-off, waiters and messages of runs
        that no longer exist, and waiters of runs that ended; the number of messages deleted.
        (`purge` deletes the messages of the runs it deletes.)"""


class JobQueue(ABC):
    """Jobs of one provider ("memory": in this process; "sqlite", "postgres": in the database).

    Claims are fenced: each bumps the job's epoch and hands the job with it. A job whose lease
    ran out (its worker stopped renewing) is claimed again by the ordinary claim, with
    `Claim.taken_from` naming the worker that lost it. `apply` and `record` write only while the
    job is still at the epoch they name."""

    provider: ClassVar[str]
    # Its jobs outlive this process (they are in a database); a memory queue's die with it.
    durable: ClassVar[bool] = True
    # Keeps jobs claimed ahead of free slots, for `claim_nowait` (a round trip to the database
    # saved at each job); the worker then tops them up while its slots are busy.
    claims_ahead: ClassVar[bool] = False

    def serve_as(self, worker: str) -> None:
        """`worker`, of this process, serves the queue. A queue whose jobs live in this
        process's memory names it on the pending runs it saves to a durable store, so that
        other processes can tell which process holds their jobs (`memory_runs`); a database's
        queue has nothing to do."""
        return None

    @abstractmethod
    async def add(self, jobs: list[Job], runs: list[Run]) -> list[str]:
        """Enqueue jobs together with their first runs; returns, once durable, the ids of the
        jobs added (a job whose id is already known is not added again, nor its run). A
        checkpoint on every queue: other tasks run before it returns."""

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
        interrupted: Callable[[], bool] | None = None,
    ) -> list[Claim]:
        """Up to `limit` due jobs (waiting or delayed past run_at; or active with an expired
        lease), highest priority first then oldest; [] if none came within `timeout` seconds.
        `forced_only`: only jobs an operator asked to run now (the queue is paused).
        `interrupted`: asked whenever the claim is woken (`wake`) while it waits; once it
        holds, the claim returns [] at once (its caller has news: a stop, a pause). Never
        cancelled half-way, a claim leaves no job leased to nobody."""

    def claim_nowait(self, queue: str, worker: str, lease_s: float) -> Claim | None:
        """The next due job if the queue can hand it over at once, without a round trip (a
        queue that claims ahead keeps a few); None otherwise."""
        return None

    def return_ahead(self, queue: str) -> None:  # noqa: B027 - only a queue that claims ahead
        """Hand back jobs claimed ahead and not started (the queue was paused or stopped)."""

    def ahead(self, queue: str) -> int:
        """How many jobs of `queue` this queue keeps claimed ahead (0 if it never does)."""
        return 0

    def drop_ahead(self, queue: str, job_id: str) -> Claim | None:
        """The claim of a job kept ahead and not started, no longer kept (an operator cancels
        it); None if this queue keeps no such claim. Its job is still held: the caller ends
        it or gives it back."""
        return None

    async def claim_ahead(self, queue: str, limit: int, worker: str, lease_s: float) -> int:
        """Claim up to `limit` more due jobs to keep ahead for `claim_nowait`, each `handed`
        (the worker asks only while its jobs are short, so they start within moments: their
        starts are not committed before their code runs); how many it claimed. 0 from a queue
        that does not claim ahead."""
        return 0

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
    async def renew(
        self, worker: str, lease_s: float, leave: Mapping[str, int] = NOTHING_LEFT
    ) -> Renewal:
        """Extend the lease of every job `worker` holds but those in `leave` (id → epoch: the
        claims it gave up without a word to the database; their leases run out, and whoever
        claims them next records what became of them); what it still holds and the signals
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
    async def get_jobs(self, job_ids: Sequence[str]) -> list[Job]:
        """The jobs of these ids this queue has, in one read; ids it lacks are left out."""

    @abstractmethod
    async def held_by(self, workers: list[str]) -> list[Job]:
        """Active jobs these workers hold (boot recovery of dead workers)."""

    @abstractmethod
    async def stats(self, queue: str) -> QueueStats:
        """Counts by state; `waiting` are due now, `delayed` wait for their run_at."""

    @abstractmethod
    async def oldest_waiting(self, queue: str) -> datetime | None:
        """Since when the longest-waiting job that is due now and not started has been due:
        the later of its `created_at` and its `run_at`; None when no job waits. Jobs claimed
        ahead and not started count as waiting, as in `stats`."""

    @abstractmethod
    async def dead_letters(self, queue: str, limit: int = 1000) -> list[Job]:
        """Dead jobs, the last to die first."""

    @abstractmethod
    async def gated(self, queue: str, key: str, limit: int) -> list[Job]:
        """Delayed jobs of `queue` the concurrency gate held back behind `key` (their
        `meta["gate"]`), in the order claims take them (priority, then the first enqueued):
        a slot of that key came free."""

    @abstractmethod
    async def purge(self, finished_before: datetime, limit: int = 2000) -> int:
        """Forget up to `limit` finished jobs (completed, failed, cancelled) that ended before
        the cut-off; dead letters stay until requeued or discarded. The number forgotten."""

    def wake(self, queue: str) -> None:  # noqa: B027 - a queue that polls needs no wake-up
        """Something became due on `queue` in this process: idle claims may look now."""


class SharedState(ABC):
    """What the processes serving one database share, beside runs and jobs."""

    # workers
    @abstractmethod
    def heartbeat(self, worker: WorkerInfo) -> None: ...

    @abstractmethod
    async def workers(self, *, own_writes: bool = True) -> list[WorkerInfo]:
        """Every registered worker. `own_writes=False`: as the database holds them now,
        without waiting for this process's queued writes (its own heartbeat) to commit; a
        look for dead peers at every heartbeat must not break up the writer's batches."""

    @abstractmethod
    async def forget_worker(self, worker_id: str, *, listed: bool = False) -> list[tuple[str, str]]:
        """Drop the worker's concurrency slots, and the worker unless `listed` (a dead one
        stays listed a while, as gone): the (run id, key) of each slot freed. Its catalog
        stays: what it served stays known until another worker publishes its own."""

    @abstractmethod
    def publish_catalog(self, catalog: WorkerCatalog) -> None:
        """Declare what a worker serves (it has sent its heartbeat); catalogs of workers no
        longer registered go."""

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
        decide: Callable[[Window | None, float], tuple[T, Window | None, bool]],
    ) -> T:
        """Read the window of (workflow, key, mode) and let `decide` return (result, window,
        write); when `write`, store the window (None: delete it). Atomic with respect to every
        other process; `decide` runs inside the transaction, so it does no I/O. It gets the
        window and the moment (epoch seconds) on the clock windows are kept by: the one every
        process sharing them reads (the database server's, where processes on several
        machines share them)."""

    @abstractmethod
    async def close_windows(self, before: float) -> None:
        """Forget leading windows that closed before `before` (history only), and not one
        still open by the clock `update_window` reads (a caller's clock may run ahead of it)."""

    # cluster chores
    @abstractmethod
    async def try_lead(self, chore: str, worker: str, ttl_s: float) -> bool:
        """Hold (or renew) the lease on a chore for `ttl_s`; False while another live worker
        holds it. One worker at a time runs each chore."""

    @abstractmethod
    async def resign(self, chore: str, worker: str) -> None: ...

    # schedules (engine/scheduler.py)
    @abstractmethod
    async def declare_schedules(
        self, workflow: str, specs: list[tuple[ScheduleSpec, float]]
    ) -> None:
        """Make `workflow`'s schedules these: each (spec, first tick) is added if its
        (workflow, schedule) is new, with `last_tick` = the first tick given (no catch-up of
        ticks before it existed), else its spec is updated and its state kept; the workflow's
        schedules not in the list are removed. An empty list removes them all."""

    @abstractmethod
    async def schedules(self) -> list[ScheduleState]:
        """Every declared schedule with its state, by (workflow, schedule)."""

    @abstractmethod
    async def claim_tick(
        self,
        workflow: str,
        schedule: str,
        tick: float,
        job_id: str | None = None,
        run_id: str | None = None,
    ) -> bool:
        """Claim the tick at `tick` (epoch seconds) of a schedule: True for exactly one caller
        among all processes, and only if the schedule exists, is not paused and its last tick
        is earlier than `tick` (ticks are claimed in order, each once: a unique key per
        (workflow, schedule, tick)). The winner enqueues `job_id` (None: the tick is skipped);
        last_tick, last_job_id, last_run_id and last_fired_at are set with the claim."""

    @abstractmethod
    async def note_fired(
        self, workflow: str, schedule: str, job_id: str, run_id: str, at: float
    ) -> bool:
        """An operator's "run now" of the schedule: its last job and run are these (its ticks
        are untouched). False if the schedule is not declared."""

    @abstractmethod
    async def set_schedule_paused(
        self, workflow: str, schedule: str, paused: bool, resume_from: float | None = None
    ) -> bool:
        """Pause or resume a schedule (shared by every process); on resume, a `resume_from`
        later than its last tick becomes its last tick (the ticks of the pause are not caught
        up). False if the schedule is not declared."""

    # rate limits (engine/gates.py)
    @abstractmethod
    async def acquire_start(
        self,
        scope: str,
        key: str,
        limit: int,
        period_s: float,
        run_id: str,
        now: float | None = None,
    ) -> RateDecision:
        """Record that `run_id` starts now under the rate limit (scope, key) if fewer than
        `limit` starts were recorded in the sliding window (now - period_s, now]; atomic with
        respect to every process. A run already recorded in the window is allowed again
        without counting twice (a redelivery of the same start).

        `now` None (the engine's case): the clock, read once the window is held. A start that
        waited for another process's (or behind other writes) counts from when it was let
        through, not from before it waited: counted earlier than it began, it would leave the
        window early, and let the next start in less than a period after it. The clock is the
        one every process that shares the window reads: the database server's, where processes
        on several machines share it. Tests pass a fixed moment."""

    @abstractmethod
    async def recent_starts(self, scope: str, key: str, since: float) -> list[tuple[str, float]]:
        """(run id, started at) of the starts recorded for (scope, key) after `since`, oldest
        first: the runs holding the window's slots."""

    @abstractmethod
    async def forget_starts(self, before: float) -> None:
        """Drop recorded starts whose window ended before `before` (they count no more), and
        not one still in its window by the clock `acquire_start` reads (a caller's clock may
        run ahead of it)."""


class Backend(ABC):
    """One database (or this process's memory): a run store, job queues, and shared state.

    Use as `async with backend:`; background work (a batching writer, a listener) runs inside.
    """

    kind: ClassVar[str]  # memory | sqlite | postgres
    location: str  # what to show the user: a path or a URL without its password
    shared: SharedState
    runs: RunStore
    # The clock its moments are on (run_at, wait_until, leases, windows, ticks): whoever
    # computes one reads this clock, so that every process on the database agrees.
    clock: Clock
    # Several processes (on one host, or several) can serve the same database.
    multi_process: ClassVar[bool] = False
    # Its runs outlive this process (they are in a database).
    durable: ClassVar[bool] = True

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

    def out_of_reach_since(self) -> float | None:
        """Since when (epoch seconds) the database cannot be reached, its connections lost and
        none made again since; None while it can be (a file or memory always can). Meanwhile
        reads and writes wait for it."""
        return None

    async def find_job(self, job_id: str) -> tuple[JobQueue, Job] | None:
        """The job and the queue that has it, looking in every queue."""
        for queue in self.queues:
            job = await queue.get_job(job_id)
            if job is not None:
                return queue, job
        return None

    async def find_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """Job id → job, for the ids any queue has: one read a queue, each asked only for the
        ids the queues before it lacked."""
        found: dict[str, Job] = {}
        for queue in self.queues:
            wanted = [job_id for job_id in dict.fromkeys(job_ids) if job_id not in found]
            if not wanted:
                break
            found.update((job.id, job) for job in await queue.get_jobs(wanted))
        return found

    async def find_ended(self, job_id: str) -> tuple[Job, Run | None] | None:
        """The job, looking in every queue, and its last run if the job has ended (None while
        it has not, or if the store lacks it): what a `wait_for_job` reads."""
        for queue in self.queues:
            found = await self._job_and_run(queue, job_id)
            if found is not None:
                return found
        return None

    async def _job_and_run(self, queue: JobQueue, job_id: str) -> tuple[Job, Run | None] | None:
        """`find_ended` in one queue: the job, then its run. A backend whose queue and run store
        are one database reads both in one statement."""
        job = await queue.get_job(job_id)
        if job is None:
            return None
        return job, await self.runs.get_run(job.run_id) if job.state.terminal else None

    @abstractmethod
    async def change_token(self) -> int:
        """A number that moves whenever another process committed something."""

    async def change_mark(self) -> int:
        """A change token to compare a later one with, cheaply: never newer than
        `change_token()`'s (a change after it always shows as a move), but it may be older
        (then a change from before shows too: one more look, nothing missed)."""
        return await self.change_token()

    async def wait_for_change(self, token: int, timeout: float, pace: Pace | None = None) -> int:
        """Return the change token once it moved from `token`, or after `timeout` seconds. A
        backend that is told of changes as they happen may hold back a reader with a `pace`
        while the database is busy; one that polls for them (every `change_poll_s`) is paced
        by its polling already."""
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
    "Delivery",
    "EventMessage",
    "EventWaiter",
    "FeedCursor",
    "FeedLog",
    "FeedPage",
    "Fence",
    "JobQueue",
    "JobUpdate",
    "Pace",
    "RateDecision",
    "Renewal",
    "RunStore",
    "ScheduleSpec",
    "ScheduleState",
    "ServedQueue",
    "SharedState",
    "Transition",
    "Window",
    "WorkerCatalog",
    "key_text",
    "payload_key",
]
