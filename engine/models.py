"""The records the engine keeps: runs, their steps and attempts, jobs and queue stats.

These are what the store persists, what `Engine.get_run` returns and what the console shows.
Times are timezone-aware UTC datetimes; the store keeps them as epoch seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class RunStatus(StrEnum):
    QUEUED = "queued"
    DELAYED = "delayed"
    DEBOUNCED = "debounced"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    CRASHED = "crashed"
    THROTTLED = "throttled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_RUN_STATUSES


TERMINAL_RUN_STATUSES = frozenset(
    {
        RunStatus.COMPLETED,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
        RunStatus.TIMED_OUT,
        RunStatus.CRASHED,
        RunStatus.EXPIRED,
        RunStatus.DEBOUNCED,
    }
)
# Still going: every status but the terminal ones (throttled too: a gate holds the run back),
# as the stores' filters take them.
LIVE_RUN_STATUSES = tuple(str(s) for s in RunStatus if s not in TERMINAL_RUN_STATUSES)
# Statuses of runs whose job is still in a queue, not in a worker's hands.
PENDING_RUN_STATUSES = frozenset(
    {RunStatus.QUEUED, RunStatus.DELAYED, RunStatus.WAITING, RunStatus.THROTTLED}
)


class StepStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"
    CACHED = "cached"
    CANCELLED = "cancelled"
    WAITING = "waiting"


class AttemptStatus(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


class JobState(StrEnum):
    WAITING = "waiting"  # ready to be claimed
    DELAYED = "delayed"  # not before run_at (delay, job backoff, or a run's wait)
    ACTIVE = "active"  # claimed by a worker, under lease
    COMPLETED = "completed"
    FAILED = "failed"  # terminal without the dead-letter queue: timed out
    CANCELLED = "cancelled"
    DEAD = "dead"  # used up its retries: in the dead-letter queue

    @property
    def terminal(self) -> bool:
        return self in (
            JobState.COMPLETED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.DEAD,
        )


def utcnow() -> datetime:
    return datetime.now(UTC)


def from_epoch(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def to_epoch(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


class _Record(BaseModel):
    # validate_assignment stays off: the runner mutates records on the hot path.
    model_config = ConfigDict(use_enum_values=False)


class Attempt(_Record):
    number: int
    status: AttemptStatus = AttemptStatus.RUNNING
    started_at: datetime
    finished_at: datetime | None = None
    error: str | None = None
    error_type: str | None = None
    traceback: str | None = None
    backoff_ms: int | None = None  # the wait before the next attempt, when there is one

    @property
    def duration_ms(self) -> float | None:
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds() * 1000


class LogLine(_Record):
    ts: datetime
    level: str
    message: str
    step: int | None = None  # index of the step that logged it; None for run-level lines


class StepRun(_Record):
    """One step of one run. `Run.steps` holds these in workflow order."""

    index: int
    name: str
    kind: str = "node"  # node | wait | subworkflow | for_each | loop | switch | try_catch
    status: StepStatus = StepStatus.PENDING
    started_at: datetime | None = None
    finished_at: datetime | None = None
    input: Any = None
    output: Any = None
    error: str | None = None
    max_attempts: int = 1
    attempts: list[Attempt] = Field(default_factory=list)
    logs: list[LogLine] = Field(default_factory=list)
    cached_from: str | None = None  # run id whose output a cached step reused
    wait_until: datetime | None = None
    timed_out: bool = False
    tags: list[str] = Field(default_factory=list)  # mw:<name>, iteration N, sub, …
    parent: int | None = None  # index of the enclosing step for nested steps
    child_run_id: str | None = None

    @property
    def duration_ms(self) -> float | None:
        if self.started_at is None:
            return None
        end = self.finished_at or utcnow()
        return (end - self.started_at).total_seconds() * 1000

    @property
    def counted_attempts(self) -> int:
        """How many of its attempts count against the step's budget: those that failed or
        timed out since it last completed (a step run again begins afresh). An attempt a stop
        interrupted (cancelled, or left running by a process that is gone) does not count."""
        counted = 0
        for attempt in self.attempts:
            if attempt.status is AttemptStatus.COMPLETED:
                counted = 0
            elif attempt.status in (AttemptStatus.FAILED, AttemptStatus.TIMED_OUT):
                counted += 1
        return counted


class Run(_Record):
    id: str
    workflow_name: str
    workflow_version: str
    queue: str
    job_id: str
    status: RunStatus = RunStatus.QUEUED
    input: Any = None
    headers: dict[str, str] = Field(default_factory=dict)
    output: Any = None
    error: str | None = None
    error_step: str | None = None
    priority: int = 0
    job_attempt: int = 1  # which delivery of the job this run is (job-level retries)
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    run_at: datetime | None = None  # delayed until / next attempt at
    wait_until: datetime | None = None
    replay_of: str | None = None
    replay_from_step: str | None = None
    parent_run_id: str | None = None
    depth: int = 0
    worker: str | None = None  # the id of the worker that ran it (host:pid:tag)
    attempts: int = 0  # step attempts made, over all steps (the runs table shows it)
    failed_attempts: int = 0
    cursor: list[int] = Field(default_factory=list)  # resume point: one index per nesting level
    state: dict[str, Any] = Field(default_factory=dict)  # ctx.state snapshot for resumption
    steps: list[StepRun] = Field(default_factory=list)
    logs: list[LogLine] = Field(default_factory=list)  # run-level lines (engine messages)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES

    @property
    def duration_ms(self) -> float | None:
        if self.started_at is None:
            return None
        end = self.finished_at or utcnow()
        return (end - self.started_at).total_seconds() * 1000

    def step(self, name: str) -> StepRun:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"run {self.id} has no step {name!r}")

    def own_steps(self) -> list[StepRun]:
        """The records of its workflow's own top-level steps, in order: not a nested step's,
        nor a middleware's (tagged "mw:…")."""
        return [
            s
            for s in self.steps
            if s.parent is None and not (s.tags and s.tags[0].startswith("mw:"))
        ]


# Runs of one job that crashed their workers (died with them, or froze past their leases)
# before the job goes to the dead-letter queue, as Sidekiq's and BullMQ's stalled-job limits:
# a job that kills every worker that takes it would take each down in turn, for ever.
MAX_CRASHES = 3


class Job(_Record):
    id: str
    queue: str
    workflow_name: str
    payload: Any = None
    headers: dict[str, str] = Field(default_factory=dict)
    priority: int = 0
    state: JobState = JobState.WAITING
    run_at: datetime | None = None
    attempts: int = 0  # claims so far, those a gate held back included (`deliveries`)
    max_retries: int = 0
    run_id: str
    created_at: datetime
    finished_at: datetime | None = None
    error: str | None = None
    worker: str | None = None
    resume: bool = False  # the next delivery resumes run_id after a wait
    meta: dict[str, Any] = Field(default_factory=dict)  # lineage for the run: replay_of, parent…
    # The fencing token: bumped by every claim and every change of state. A worker writes the
    # job and its run only while the job is still at the epoch it claimed it at.
    epoch: int = 0
    lease_until: datetime | None = None
    # Operator requests to the worker holding the job ("cancel", "retry_now"), with the time
    # each was made: the holder acts on those it has not seen yet.
    signals: dict[str, float] = Field(default_factory=dict)
    force: bool = False  # an operator's "run it now": claimed even from a paused queue
    # While active: its claim gave it straight to a worker slot (not ahead), whose code may
    # run before the run's start is recorded; losing it means the run may have begun.
    handed: bool = False

    @property
    def job_id(self) -> str:
        """The job's id (`id`), under the name the run records use."""
        return self.id

    @property
    def delivery_budget(self) -> int:
        """Deliveries the job may take: one and its retries, one more for each of its runs
        that crashed its worker (a crash uses no retry) but the one that made it a dead
        letter, and one more for each run its engine stopped under (`Ledger.interrupt`)."""
        redelivered = min(int(self.meta.get("crashes", 0)), MAX_CRASHES - 1)
        return self.max_retries + 1 + redelivered + int(self.meta.get("interrupted", 0))

    @property
    def deliveries(self) -> int:
        """Times the job was handed to a worker to run: its claims but those a gate (a rate
        limit, a concurrency key) held back before the run started, and those that woke its
        run from a wait (the same delivery going on: a run with a wait read "delivery 2 of
        2" with its retry unspent, and `ctx.job.delivery` said 2)."""
        meta = self.meta
        woke = self._wake_uncounted() if "waking" in meta else 0  # a job's path: no call
        return self.attempts - int(meta.get("held", 0)) - woke

    def _wake_uncounted(self) -> int:
        """1 when the claim that woke the run from its last wait is not yet in `held`: its
        run parked at claim number `waking`, and the job was claimed since."""
        waking = self.meta.get("waking")
        return 1 if waking is not None and self.attempts > int(waking) else 0

    def woken(self) -> Job:
        """The job as its claim that woke its run holds it: that claim counted in `held`
        (written with the next transition that writes the meta); itself otherwise."""
        if "waking" not in self.meta or not self._wake_uncounted():  # the first: every claim
            return self
        meta = {k: v for k, v in self.meta.items() if k != "waking"}
        meta["held"] = int(meta.get("held", 0)) + 1
        return self.model_copy(update={"meta": meta})

    def gated_by(self, gate: str) -> dict[str, Any] | None:
        """What the scheduling gate of kind `gate` wrote of the job it holds back (its
        `meta["gate"]`: the key, the runs holding it, …); None if no such gate holds it."""
        found = self.meta.get("gate")
        return found if isinstance(found, dict) and found.get("gate") == gate else None

    def meta_not_delivered(self) -> dict[str, Any]:
        """The job's meta for its claim given back before its run started (held by a gate,
        claimed ahead and returned, left with its lease lost, its worker gone before it
        began): counted in `held`, so that `deliveries` counts the runs it was handed to."""
        return {**self.meta, "held": int(self.meta.get("held", 0)) + 1}


class QueueStats(_Record):
    queue: str
    waiting: int = 0
    active: int = 0
    completed: int = 0
    failed: int = 0
    delayed: int = 0
    dead: int = 0
    cancelled: int = 0

    @classmethod
    def of(cls, queue: str, counts: Mapping[JobState, int]) -> QueueStats:
        """The queue's stats from its jobs counted by state."""
        return cls(
            queue=queue,
            waiting=counts[JobState.WAITING],
            active=counts[JobState.ACTIVE],
            completed=counts[JobState.COMPLETED],
            failed=counts[JobState.FAILED],
            delayed=counts[JobState.DELAYED],
            dead=counts[JobState.DEAD],
            cancelled=counts[JobState.CANCELLED],
        )


class QueueInfo(_Record):
    """A queue as the engine serves it: which workflow, which provider, how wide."""

    name: str
    workflow_name: str | None
    provider: str
    concurrency: int
    paused: bool = False
    # A worker serves it (alive, heartbeating, not stopping; or this engine does): a queue
    # whose workers all stopped stays declared, and its jobs wait for the next one.
    served: bool = True
    # Every workflow the live workers serve it with, where that is more than one (two services
    # that chose one queue name, a deploy that renamed a workflow): each worker runs only the
    # jobs enqueued for its own; `workflow_name` is the one new jobs are enqueued for.
    workflow_names: list[str] = Field(default_factory=list)


class WorkflowInfo(_Record):
    name: str
    version: str
    queue: str | None
    path: str | None
    steps: list[str]
    # The `$.body` paths its steps and trigger read ("order_id", "customer.email"), in the
    # order they are first read: what an input for it should hold (the inject template).
    body_fields: list[str] = Field(default_factory=list)
    # The events its `wait.for_event` steps (nested ones too) wait for, each once, in order:
    # a sender is told when a run's workflow never waits for the event it sent. None: not
    # known (declared by a worker of a version that did not say).
    events: list[str] | None = None
    # Event → the payload paths ("order_id") its keyed waits (`match=`) match an event sent by
    # key on: a sender whose payload carries none of them is told. None: not known.
    event_keys: dict[str, list[str]] | None = None
    # Its schedules as this worker declares them (id → settings, `schedules.settings_text`):
    # another version of its file on another worker may have declared others since, and
    # those fire. None: this worker declares none (it fires no schedules, or is older).
    schedules: dict[str, str] | None = None


class WorkerInfo(_Record):
    id: str
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    # The worker's process as the kernel knows it (liveness.py): where `pid` names it (the
    # machine's boot and the PID namespace) and when it began. Empty in a row an engine wrote
    # before it was recorded: the host name stands in.
    process: str = ""
    # Since when it drains (a SIGTERM, the engine closing): it claims nothing more and ends its
    # runs. None while it serves.
    stopping_since: datetime | None = None


class EventOutcome(StrEnum):
    """What became of an event sent to a run."""

    DELIVERED = "delivered"  # the run waited for it: its wait takes it (a worker resumes it)
    KEPT = "kept"  # nothing waits for it now: in the mailbox for a wait that comes to it later


class EventSent(list[str]):
    """What `send_event` returns: the ids of the runs the event went to, as the list it always
    was, and what became of it — delivered to a wait for it, or kept in the mailbox, and then
    what the run waits for instead and whether its workflow waits for that event anywhere (an
    event whose name has a typo is kept for ever: only the sender can notice)."""

    def __init__(
        self,
        event: str,
        run_ids: Iterable[str],
        outcome: EventOutcome,
        *,
        waits_for: tuple[str, ...] = (),
        run: Run | None = None,
        workflow_events: tuple[str, ...] | None = None,
        missing_keys: tuple[str, ...] = (),
        unkeyed: bool = False,
    ) -> None:
        super().__init__(run_ids)
        self.event = event
        self.outcome = outcome
        self.waits_for = waits_for  # kept: the events the run's waits wait for now
        # The run's status and workflow as the event was sent (None: sent by key).
        self.run_status = run.status if run is not None else None
        self.workflow = run.workflow_name if run is not None else None
        # The events a run of that workflow waits for anywhere, as its workers declared them
        # (sent by key: any workflow's on the database); None: not known (no worker said).
        self.workflow_events = workflow_events
        # Sent by key and kept: the payload paths the waits for it match on, where the payload
        # carries none of them (no run can ever take it: "orderId" for "order_id").
        self.missing_keys = missing_keys
        # Sent by key and kept, where every wait for it takes it sent to its run (no `match=`).
        self.unkeyed = unkeyed

    @property
    def awaited(self) -> bool | None:
        """Whether some wait of the run's workflow waits for this event (None: not known)."""
        if self.outcome is EventOutcome.DELIVERED:
            return True
        return None if self.workflow_events is None else self.event in self.workflow_events
