"""The ledger: the only code that changes the state of a run or a job.

Every change is one `Transition` of the backend — the job's next state and the run records that
go with it, committed together, and only if the job is still at the epoch the caller read or
claimed it at. So a worker that lost its lease cannot complete, acknowledge or rewrite anything,
and an operator's cancel of a queued run cannot land on top of a worker's claim: whichever comes
second finds the epoch moved and is refused.

Workers call the claim-side methods (start, settle, hold, end, interrupt, take_over); the
operator API and cluster chores call the others after reading the job (cancel_pending, requeue,
make_due, release). Events for a live UI are published here, after each change, and waiters of
`wait_for_job` in this process are woken.

The ledger never changes a run record it was handed by a reader (the operator, a chore, a worker
taking a job over): records read from a store are snapshots that other readers may hold, so it
changes a copy (`copy_run`) and that copy is what its transition writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeGuard

import anyio

from . import telemetry
from .backends.base import Backend, Claim, JobQueue, JobUpdate, Transition
from .events import Event, EventBus, RunFinished, RunQueued, RunStarted, RunStatusChanged
from .ids import new_id as new_id
from .models import (
    MAX_CRASHES,
    AttemptStatus,
    Job,
    JobState,
    LogLine,
    Run,
    RunStatus,
    StepStatus,
    utcnow,
)
from .records import assign, construct, copy_run
from .redact import redact_headers

log = logging.getLogger("blok.ledger")
# A run that did not complete, in the log a worker writes (its stderr): an operator watching a
# headless worker sees failures there, as huey's and Celery's workers log a task's exception.
ends_log = logging.getLogger("blok.runs")
_WARNED_ENDS = frozenset({RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.CRASHED})

# What a job's meta counts of the budget it spent; a requeue starts it again from nothing
# (crashes too: "requeue it to try again" gives a dead letter MAX_CRASHES more chances).
_SPENT = ("failures", "gate_tries", "held", "crashes", "interrupted", "waking")
CANCELLED_BEFORE_RUN = "cancelled by operator before it ran"
CANCELLED = "cancelled by operator"
# Jobs enqueued here (by `enqueue` or `enqueue_many`) whose completed run is kept for a later
# `wait_for_job`: the most recent this many (a few MB of records at most).
PARKED_MAX = 4096
AFTER_CRASH = "after_crash"  # job meta: {"crashed": run id, "run": the run of its next delivery}


def engine_line(message: str, level: str, ts: datetime) -> LogLine:
    return LogLine.model_construct(ts=ts, level=level, message=message, step=None)


def make_job(
    *,
    queue: str,
    workflow_name: str,
    payload: Any,
    headers: dict[str, str] | None,
    priority: int,
    run_at: datetime | None,
    max_retries: int,
    job_id: str | None = None,
    meta: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Job:
    """A job made `now` (on its backend's clock; this process's when None)."""
    return construct(
        Job,
        dict(
            id=job_id or new_id("job"),
            queue=queue,
            workflow_name=workflow_name,
            payload=payload,
            headers=headers or {},
            priority=priority,
            state=JobState.DELAYED if run_at else JobState.WAITING,
            run_at=run_at,
            attempts=0,
            max_retries=max_retries,
            run_id=new_id("run"),
            created_at=now or utcnow(),
            finished_at=None,
            error=None,
            worker=None,
            resume=False,
            meta=meta or {},
            epoch=0,
            lease_until=None,
            signals={},
            force=False,
            handed=False,
        ),
    )


def make_run(
    job: Job,
    *,
    workflow_version: str,
    job_attempt: int = 1,
    status: RunStatus = RunStatus.QUEUED,
    created_at: datetime | None = None,
) -> Run:
    """The record of one delivery of `job`, before it starts."""
    meta = job.meta
    return construct(
        Run,
        dict(
            id=job.run_id,
            workflow_name=job.workflow_name,
            workflow_version=workflow_version,
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
            created_at=created_at or job.created_at,
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


def _cancelled_pending(run: Run) -> str:
    """The error of a pending run cancelled: "before it ran" only if it never began (a waiting
    run, or one in a retry's backoff, ran steps already)."""
    return CANCELLED_BEFORE_RUN if run.started_at is None else CANCELLED


def _ended(job: Job) -> dict[str, str] | None:
    """A job that will not run again keeps no secret header values: its headers redacted (None
    when there is nothing to hide). Failed and dead jobs keep theirs: a requeue runs them."""
    if not job.headers:
        return None
    redacted = redact_headers(job.headers)
    return redacted if redacted != job.headers else None


def may_have_begun(run: Run | None, job: Job) -> TypeGuard[Run]:
    """Whether the run of a job its holder lost may have begun there: its record says running,
    or the job was handed straight to one of the holder's slots (`Job.handed`)."""
    return run is not None and (run.status is RunStatus.RUNNING or job.handed)


class JobWaiter:
    """The `wait_for_job` callers of one job in this process, told when a transition of this
    process that ends the job has been decided: `run` is the run the job ended with if it
    landed, None if it was refused (the job had moved on: read it again)."""

    __slots__ = ("_event", "ended", "run", "wakes")

    def __init__(self) -> None:
        self._event: anyio.Event | None = None  # made only for a caller that has to wait
        self.ended = False
        self.run: Run | None = None
        # Called when told: a caller's way to stop waiting for something else meanwhile (the
        # database's changes), without a task of its own to wait for `event`.
        self.wakes: list[Callable[[], None]] = []

    @property
    def event(self) -> anyio.Event:
        """Set once told."""
        if self._event is None:
            self._event = anyio.Event()
            if self.ended:
                self._event.set()
        return self._event

    def end(self, run: Run | None) -> None:
        self.ended, self.run = True, run
        if self._event is not None:
            self._event.set()
        for wake in list(self.wakes):
            wake()


class Ledger:
    def __init__(self, backend: Backend, bus: EventBus) -> None:
        self.backend = backend
        self.clock = backend.clock  # every moment a run or job records is on it
        self.bus = bus
        # wait_for_job callers in this process, woken when the job ends here.
        self._job_done: dict[str, JobWaiter] = {}
        # Called with every run that ends here (the worker wakes a waiting parent).
        self.on_run_ended: list[Callable[[Run], None]] = []
        # An engine that follows the database (a producer, an attached console) hears its own
        # changes back from the feed: whether one is news to it (`Follower.told`), so that
        # its subscribers hear each once. None: nothing follows.
        self.told: Callable[[str, str], bool] | None = None
        # Engine lines made for a run and not written yet: they ride in its next transition.
        self._notes: dict[str, list[LogLine]] = {}
        self._fates: dict[str, str] = {}  # run id → its job's fate, for the worker's log
        # Jobs enqueued here, oldest first: until the job ends here, the change token from
        # before its add (`pending_since`); once it completed here, the run it completed with,
        # for a `wait_for_job` that comes after the end (a script submits a batch, then collects
        # the results): no read. Only completed runs are kept, since a completed job never
        # moves again; a failed one may be requeued by another process.
        self._parked: dict[str, Run | int] = {}

    # ---- waiters ---------------------------------------------------------------------------
    def job_waiter(self, job_id: str) -> JobWaiter:
        """A waiter set when the job ends in this process (register it before reading)."""
        waiter = self._job_done.get(job_id)
        if waiter is None:
            waiter = self._job_done[job_id] = JobWaiter()
        return waiter

    def forget_waiter(self, job_id: str) -> None:
        self._job_done.pop(job_id, None)

    def watch(self, job_id: str, since: int = 0) -> None:
        """Keep the run of this job (about to be enqueued here; `since`: the backend's change
        token from before the add) if it completes here, for a later `wait_for_job` (see
        `parked`); the oldest watched job is let go past `PARKED_MAX`."""
        parked = self._parked
        parked[job_id] = since
        if len(parked) > PARKED_MAX:
            del parked[next(iter(parked))]

    def unwatch(self, job_id: str) -> None:
        self._parked.pop(job_id, None)

    def parked(self, job_id: str) -> Run | None:
        """The run a watched job completed with here, once its settle is committed (taken:
        asked once); None if it has not completed here, or was let go."""
        run = self._parked.get(job_id)
        if not isinstance(run, Run):
            return None
        del self._parked[job_id]
        return run

    def pending_since(self, job_id: str) -> int | None:
        """For a job enqueued here, watched and not ended here yet: the backend's change token
        from before its add. Such a job ends here (its waiter hears it) or in another process,
        after a commit there that moved the token on; None for any other job."""
        since = self._parked.get(job_id)
        return since if isinstance(since, int) else None

    def _job_ended(self, job_id: str, run: Run | None) -> None:
        """A transition that ends the job landed (`run`: the run it ended with) or was
        refused (None)."""
        waiter = self._job_done.pop(job_id, None)
        if waiter is not None:
            waiter.end(run)
        if job_id in self._parked:
            if waiter is None and run is not None and run.status is RunStatus.COMPLETED:
                self._parked[job_id] = run
            else:
                del self._parked[job_id]  # told now, or not kept

    # ---- publishing ------------------------------------------------------------------------
    def _finished(self, run: Run) -> None:
        fate = self._fates.pop(run.id, "")
        if run.status is not RunStatus.COMPLETED:  # nothing to log on the happy path
            ends_log.log(
                logging.WARNING if run.status in _WARNED_ENDS else logging.INFO,
                "%s %s%s: %s",
                run.workflow_name,
                run.status,
                f" ({fate})" if fate else "",  # a retried failure's line read the same
                run.error or "-",  # its place ("(at pay.py:9)") last, as everywhere
                extra={"run_id": run.id, "step": run.error_step},
            )
        if self.bus.active:
            self._tell(run, RunFinished.of(run))
        for hook in self.on_run_ended:
            hook(run)

    def _changed(self, run: Run) -> None:
        if self.bus.active:
            self._tell(run, RunStatusChanged.of(run))

    def queued(self, runs: list[Run]) -> None:
        if self.bus.active:
            for run in runs:
                self._tell(run, RunQueued.of(run))

    def _tell(self, run: Run, event: Event) -> None:
        if self.told is None or self.told(run.id, str(run.status)):
            self.bus.publish(event)

    def _close_open_steps(
        self,
        run: Run,
        step_status: StepStatus,
        attempt_status: AttemptStatus,
        error: str,
        at: datetime | None = None,
    ) -> None:
        """End the steps (and their attempts) a run left running or waiting, `at` (now)."""
        now = at or self.clock.now()
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

    def _crash(self, run: Run, reason: str, seen: datetime | None = None) -> None:
        """Record a run crashed (its worker died, froze past its lease or stopped on an engine
        error): the step it was in failed with its attempt, and counted, and the run's error
        names that step, as a failure's does ("[step 2/3] charge: …"). `seen`: when its
        worker was last heard of (its heartbeat), where it ended."""
        open_steps = [s for s in run.steps if s.status in (StepStatus.RUNNING, StepStatus.WAITING)]
        failed = sum(a.status is AttemptStatus.RUNNING for s in open_steps for a in s.attempts)
        at = self._last_sign(run, seen)
        self._close_open_steps(run, StepStatus.FAILED, AttemptStatus.FAILED, reason, at)
        error, step = reason, None
        if open_steps:
            step = open_steps[0]
            top = [s for s in run.steps if s.parent is None]
            where = (
                f"[step {top.index(step) + 1}/{len(top)}] {step.name}" if step in top else step.name
            )
            error = f"{where}: {reason}"
        self._close(run, RunStatus.CRASHED, error, step.name if step else None, at)
        run.failed_attempts += failed

    def _last_sign(self, run: Run, seen: datetime | None) -> datetime:
        """When a run whose worker died ended: not when that was found (a lease or a janitor
        round later: "crashed after 1m02s" of a run that died at 2 s), but its worker's last
        heartbeat, or the last thing the run recorded after it (an attempt's start, a log
        line); now when nothing is known."""
        now = self.clock.now()
        if seen is None or seen >= now:
            return now
        marks = [seen, run.started_at or run.created_at]
        for step in run.steps:
            marks += [attempt.started_at for attempt in step.attempts]
            marks += [line.ts for line in step.logs]
        marks += [line.ts for line in run.logs]
        return min(max(mark for mark in marks if mark is not None), now)

    def log(self, run: Run, message: str, level: str = "info") -> None:
        """An engine line on the run's record, written with the run's next transition (or,
        for a run that starts, with its start)."""
        line = engine_line(message, level, self.clock.now())
        run.logs.append(line)
        self._notes.setdefault(run.id, []).append(line)
        if level == "error":  # its job to the dead-letter queue: said by the run's end line,
            # the job's id before its "moved", which `requeue` and `discard` take ("… (no
            # retries: job_… moved …", "… (job_… moved to the dead-letter queue, not retried: …")
            fate = message.removeprefix(f"job {run.job_id} ").removeprefix("failed with ")
            self._fates[run.id] = fate.replace("moved", f"{run.job_id} moved", 1)

    def _transition(
        self, claim_job: Job, epoch: int, update: JobUpdate | None, *runs: Run
    ) -> Transition:
        logs = tuple((run.id, line) for run in runs for line in self._notes.pop(run.id, ()))
        return Transition(claim_job.id, epoch, update, runs, logs)

    # ---- enqueue ---------------------------------------------------------------------------
    async def add(
        self, queue: JobQueue, jobs: list[Job], runs: list[Run], *, watch: bool = False
    ) -> list[str]:
        """Enqueue jobs with their first runs; the ids of those added (known ids are not).
        With `watch`, each added job is watched (see `watch`) from before the add: every add
        is a checkpoint, so a job may be done before its add returns. (An id watched already,
        by an earlier enqueue of it here, is left as it is.)"""
        watched = [job.id for job in jobs if job.id not in self._parked] if watch else []
        if watched:
            # Read before the add: a commit of another process after it moves it on.
            multi = self.backend.multi_process
            since = await self.backend.change_mark() if multi else 0
            for job_id in watched:
                self.watch(job_id, since)
        added: list[str] = []
        try:
            added = await queue.add(jobs, runs)
        finally:
            if watched and len(added) < len(jobs):  # ids known already, or the add failed
                for job_id in set(watched).difference(added):
                    self.unwatch(job_id)
        telemetry.OBSERVE.enqueued(jobs, added)
        if added:
            fresh = set(added)
            self.queued([run for run in runs if run.job_id in fresh])
        return added

    # ---- a worker's job --------------------------------------------------------------------
    def start(self, claim: Claim, queue: JobQueue, run: Run, worker: str, version: str) -> None:
        assign(
            run,
            status=RunStatus.RUNNING,
            workflow_version=version,
            worker=worker,
            wait_until=None,
            error=None,
            started_at=run.started_at or self.clock.now(),
        )
        queue.record(run, claim.fence)
        for line in self._notes.pop(run.id, ()):
            queue.record_log(run.id, line, claim.fence)
        if self.bus.active:
            self._tell(run, RunStarted.of(run))

    def wait(self, claim: Claim, queue: JobQueue, run: Run, until: datetime) -> None:
        """The run sleeps until `until` without holding a worker slot."""
        run.status = RunStatus.WAITING
        run.wait_until = until
        # The claim that wakes it is not a delivery (Job.deliveries): marked with this one's.
        meta = {**claim.job.meta, "waking": claim.job.attempts}
        update = JobUpdate(state=JobState.DELAYED, run_at=until, resume=True, meta=meta)
        queue.submit(self._transition(claim.job, claim.job.epoch, update, run))
        self._changed(run)

    def complete(self, claim: Claim, queue: JobQueue, run: Run, output: Any) -> None:
        self._close(run, RunStatus.COMPLETED, None, None)
        assign(run, output=output)
        self._settle(
            claim, queue, run, JobUpdate(state=JobState.COMPLETED, headers=_ended(claim.job))
        )

    def cancelled(self, claim: Claim, queue: JobQueue, run: Run, reason: str = CANCELLED) -> None:
        self._close(run, RunStatus.CANCELLED, reason, None)
        self._close_open_steps(run, StepStatus.CANCELLED, AttemptStatus.CANCELLED, "cancelled")
        self._settle(
            claim, queue, run, JobUpdate(state=JobState.CANCELLED, headers=_ended(claim.job))
        )

    def fail(
        self,
        claim: Claim,
        queue: JobQueue,
        run: Run,
        status: RunStatus,
        error: str | None,
        error_step: str | None,
        backoff_ms: Callable[[int], int],
        *,
        retry: bool,
        permanent: str | None = None,
    ) -> None:
        """A failed or timed-out delivery. With `retry`, the job is tried again while its
        budget (`job.max_retries`) lasts, after `backoff_ms(failures so far)`, and goes to the
        dead-letter queue once it is used up (at once with no retries: the seed's "max retries
        exhausted → DLQ", or with a `permanent` reason no retry can mend); without (the job's
        own timeout), it ends failed."""
        job = claim.job
        self._close(run, status, error, error_step)
        if status is RunStatus.TIMED_OUT:
            self._close_open_steps(run, StepStatus.FAILED, AttemptStatus.TIMED_OUT, error or "")
        failures = int(job.meta.get("failures", 0)) + 1
        meta = {**job.meta, "failures": failures}
        retries = job.max_retries
        if retry and failures <= retries and permanent is None:
            backoff = backoff_ms(failures - 1)
            next_id = new_id("run")
            run_at = self.clock.now() + timedelta(milliseconds=backoff)
            follow = construct(Job, {**job.__dict__, "run_id": next_id, "run_at": run_at})
            next_run = make_run(
                follow,
                workflow_version=run.workflow_version,
                job_attempt=failures + 1,
                status=RunStatus.DELAYED,
                created_at=self.clock.now(),
            )
            retrying = f"retrying in {backoff / 1000:.1f}s as run {next_run.id}"
            self.log(run, f"job attempt {failures}/{retries + 1} failed; {retrying}", "warning")
            self._fates[run.id] = retrying  # the end line said the same retried or dead
            update = JobUpdate(
                state=JobState.DELAYED, run_id=next_id, run_at=run_at, meta=meta, error=error
            )
            queue.submit(self._transition(job, job.epoch, update, run, next_run))
            telemetry.OBSERVE.job_failed(run, "retried")
            self._finished(run)
            self.queued([next_run])
            return
        # A job that used up its retries (or had none) goes to the dead-letter queue, where a
        # requeue gives it a fresh budget; one that may not be retried ends failed.
        if retry:
            spent = "failed with no retries"
            if retries:
                spent = "used up its retry" if retries == 1 else f"used up its {retries} retries"
            said = f"job {job.id} {spent}: moved to the dead-letter queue"
            if permanent is not None and failures <= retries:
                said = f"job {job.id} moved to the dead-letter queue, not retried: {permanent}"
            self.log(run, said, "error")
        state = JobState.DEAD if retry else JobState.FAILED
        telemetry.OBSERVE.job_failed(run, "dead" if retry else "failed")
        self._settle(claim, queue, run, JobUpdate(state=state, error=error, meta=meta))

    def _close(
        self,
        run: Run,
        status: RunStatus,
        error: str | None,
        error_step: str | None,
        at: datetime | None = None,
    ) -> None:
        assign(
            run,
            status=status,
            finished_at=at or self.clock.now(),
            error=error,
            error_step=error_step,
            state={},
            cursor=[],
            wait_until=None,
        )

    def _settle(self, claim: Claim, queue: JobQueue, run: Run, update: JobUpdate) -> None:
        transition = self._transition(claim.job, claim.job.epoch, update, run)
        job_id = claim.job.id
        if job_id in self._job_done or job_id in self._parked:
            # Someone here waits for the job, or may (it was enqueued here): tell them once
            # the settle is committed, with the run if it landed (nothing to read back),
            # without if the fence refused it.
            transition.landed = lambda landed: self._job_ended(job_id, run if landed else None)
        queue.submit(transition)
        self._finished(run)

    def hold(
        self,
        claim: Claim,
        queue: JobQueue,
        run: Run,
        status: RunStatus,
        until: datetime,
        meta: dict[str, Any],
    ) -> None:
        """A gate holds the run back: it waits (`queued`, `throttled`, `delayed`) until
        `until`, then its job is claimed again; the retry budget is not touched."""
        run.status = status
        run.run_at = until
        meta["held"] = int(meta.get("held", 0)) + 1  # a claim, not a delivery (Job.deliveries)
        # A resuming run held back keeps resuming when it is let through.
        update = JobUpdate(state=JobState.DELAYED, run_at=until, meta=meta, resume=claim.job.resume)
        queue.submit(self._transition(claim.job, claim.job.epoch, update, run))
        self._changed(run)

    def leave(self, claim: Claim, queue: JobQueue) -> None:
        """A claim this worker will not run: its lease may have run out before the job
        started (the process stalled, or the database was out of reach). Given back, fenced:
        if the lease was still this worker's, the job waits for the next claim; if another
        worker took it over, nothing is written. Left as it was, the job stayed this worker's
        in the database, and the lease loop renewed it for ever while nothing ran it."""
        job = claim.job
        update = JobUpdate(
            state=JobState.WAITING,
            resume=job.resume,
            run_at=job.run_at,
            force=job.force,
            meta=job.meta_not_delivered(),
        )
        queue.submit(Transition(job.id, job.epoch, update))

    def give_up(self, claim: Claim, queue: JobQueue, run: Run, why: str, step: str | None) -> None:
        """The run cannot go on and a retry would run it again from its first step (its steps
        done run twice): it fails, and its job goes to the dead-letter queue, where an operator
        replays it from a step or requeues it. `why` is its error; `step`, the step it was in."""
        self._close_open_steps(run, StepStatus.FAILED, AttemptStatus.FAILED, why)
        self._close(run, RunStatus.FAILED, why, step)
        self.log(run, f"job {claim.job.id} moved to the dead-letter queue, not retried", "error")
        telemetry.OBSERVE.job_failed(run, "dead")
        self._settle(claim, queue, run, JobUpdate(state=JobState.DEAD, error=why))

    def end(
        self,
        claim: Claim,
        queue: JobQueue,
        run: Run,
        status: RunStatus,
        state: JobState,
        error: str | None = None,
    ) -> None:
        """A gate ends the delivery before it ran: debounced into another run, or expired."""
        run.status = status
        run.finished_at = self.clock.now()
        run.error = error
        self._settle(claim, queue, run, JobUpdate(state=state, error=error))

    def suspend(
        self, claim: Claim, queue: JobQueue, run: Run, reason: str, *, hand_back: bool = True
    ) -> None:
        """The worker stopped the run (a stop past the drain's grace), not the run failing: it
        is recorded queued where it stopped — its cursor and state kept, the attempt under
        way cancelled with the reason — and its job goes back to the queue to resume it on
        the next delivery, without touching the retry budget. `hand_back=False`: its code
        still runs here, so the job stays held until this process is gone; whoever takes it
        over then resumes the run the same way."""
        if run.terminal:
            return
        now = self.clock.now()
        run.status = RunStatus.QUEUED
        run.wait_until = None
        for step in run.steps:
            if step.status is StepStatus.RUNNING:
                step.status = StepStatus.PENDING
            for attempt in step.attempts:
                if attempt.status is AttemptStatus.RUNNING:
                    attempt.status = AttemptStatus.CANCELLED
                    attempt.finished_at = now
                    attempt.error = reason
        self.log(run, reason, "warning")
        job = claim.job
        # Kept (its code still runs): no longer `handed`, since the run's record now says
        # where it stopped, and whoever takes the job over resumes it from there.
        update = (
            JobUpdate(state=JobState.WAITING, resume=True, meta=job.meta)
            if hand_back
            else JobUpdate(state=JobState.ACTIVE)
        )
        queue.submit(self._transition(job, job.epoch, update, run))
        self._changed(run)

    def interrupt(self, claim: Claim, queue: JobQueue, run: Run, reason: str) -> None:
        """The worker stops before the run ended (a drain past its grace, an engine error): the
        run is recorded crashed with the reason and the job goes back to the queue with a new
        run for its next delivery."""
        if run.terminal:
            return
        self._crash(run, reason)
        job = claim.job
        # Its engine's doing, not the job's: no retry used, no crash counted towards the
        # dead-letter queue, one more delivery in its budget (`Job.delivery_budget`).
        meta = {**job.meta, "interrupted": int(job.meta.get("interrupted", 0)) + 1}
        next_run = self._redelivery(job, run, meta)
        update = JobUpdate(state=JobState.WAITING, run_id=next_run.id, meta=meta)
        queue.submit(self._transition(job, job.epoch, update, run, next_run))
        self._finished(run)
        self.queued([next_run])

    def _redelivery(self, job: Job, crashed: Run, meta: dict[str, Any]) -> Run:
        """The job's next run after `crashed`; `meta` (the job's next) says which run it is of
        which crashed one, for the worker that runs it to start it where that one was."""
        follow = construct(Job, {**job.__dict__, "run_id": new_id("run"), "run_at": None})
        meta[AFTER_CRASH] = {"crashed": crashed.id, "run": follow.run_id}
        run = make_run(
            follow,
            workflow_version=crashed.workflow_version,
            job_attempt=crashed.job_attempt + 1,
            created_at=self.clock.now(),
        )
        self.log(run, f"redelivery of job {job.id}: its previous run {crashed.id} crashed")
        return run

    def take_over(
        self,
        claim: Claim,
        queue: JobQueue,
        run: Run,
        seen: datetime | None = None,
        reason: str | None = None,
    ) -> Run | None:
        """A claim took the job over from a worker that stopped renewing its lease: a run that
        worker had started is recorded crashed, and this delivery runs a new one; None when
        that was the job's last crash (`_crashed`): it went to the dead-letter queue. `seen`:
        that worker's last heartbeat, if it is known; `reason`: why, where the claimer knows."""
        # Not "crashed: …": the run's status says so, and what shows the error shows it after
        # the status ("crashed: crashed: …" otherwise).
        if reason is None and run.status is RunStatus.QUEUED:
            # Handed to that worker, which may have begun the run before its start landed.
            reason = (
                f"worker {claim.taken_from} stopped renewing its lease (lease expired) before "
                "the run's start was recorded; the run may have begun there; the job was taken "
                "over by another worker"
            )
        elif reason is None:
            reason = (
                f"worker {claim.taken_from} stopped renewing its lease (lease expired); the job "
                "was taken over by another worker"
            )
        run = copy_run(run)  # read from the store: others may hold that record
        self._crash(run, reason, seen)
        job = claim.job
        meta, poison = self._crashed(job, run)
        if poison is not None:  # this claim ran nothing: not a delivery (Job.deliveries)
            meta["held"] = int(meta.get("held", 0)) + 1
            self._settle(claim, queue, run, JobUpdate(state=JobState.DEAD, error=poison, meta=meta))
            return None
        job.meta = meta
        fresh = self._redelivery(job, run, meta)
        fresh.status = RunStatus.QUEUED
        job.run_id = fresh.id
        job.handed = False  # the update clears it: this new run's start is committed first
        update = JobUpdate(state=JobState.ACTIVE, run_id=fresh.id, meta=meta)
        queue.submit(self._transition(job, job.epoch, update, run, fresh))
        self._finished(run)
        return fresh

    # ---- an operator's or a chore's, on a job nobody holds --------------------------------
    def abandon(self, run: Run, reason: str, seen: datetime | None = None) -> None:
        """A run left `running` by a dead worker whose job is gone with it (a memory queue's):
        recorded crashed, where the worker was last `seen`. Nothing else can write it: there
        is no job to fence on."""
        run = copy_run(run)
        self._crash(run, reason, seen)
        self._save_jobless(run)

    def cancel_jobless(self, run: Run, reason: str | None = None) -> None:
        """Cancel a run of a memory queue whose job no live process holds: one left `running`
        by a dead worker (its job gone with it), as `abandon` records it crashed, or a pending
        one, which a worker serving the queue would take back from its record (`memory_runs`).
        No job to fence on: nothing else writes it."""
        run = copy_run(run)
        if run.status is RunStatus.RUNNING:
            error = f"{reason or CANCELLED} (its worker was gone)"
        else:
            error = reason or _cancelled_pending(run)
        self._close_open_steps(run, StepStatus.CANCELLED, AttemptStatus.CANCELLED, "cancelled")
        self._close(run, RunStatus.CANCELLED, error, None)
        self._save_jobless(run)

    def _save_jobless(self, run: Run) -> None:
        """Write a run that ended with no job to settle (`abandon`, `cancel_jobless`), with the
        lines noted for it here."""
        self.backend.runs.save_run(run)
        for line in self._notes.pop(run.id, ()):
            self.backend.runs.add_log(run.id, line)
        self._finished(run)

    async def cancel_pending(
        self, queue: JobQueue, job: Job, run: Run, reason: str | None = None
    ) -> bool:
        """Cancel a queued, delayed, waiting or throttled run whose job no worker holds (as
        read at `job.epoch`), for `reason` if not the operator's. False if the job moved."""
        run = copy_run(run)
        self._close(run, RunStatus.CANCELLED, reason or _cancelled_pending(run), None)
        self._close_open_steps(run, StepStatus.CANCELLED, AttemptStatus.CANCELLED, "cancelled")
        update = JobUpdate(state=JobState.CANCELLED, headers=_ended(job), meta=job.meta)
        if not await queue.apply(self._transition(job, job.epoch, update, run)):
            return False
        self._finished(run)
        self._job_ended(job.id, run)
        return True

    async def cancel_abandoned(
        self, queue: JobQueue, job: Job, run: Run, reason: str | None = None
    ) -> bool:
        """Cancel a run whose worker is gone (its lease ran out): nobody will finish it."""
        run = copy_run(run)
        self._close_open_steps(run, StepStatus.CANCELLED, AttemptStatus.CANCELLED, "cancelled")
        self._close(run, RunStatus.CANCELLED, f"{reason or CANCELLED} (its worker was gone)", None)
        update = JobUpdate(state=JobState.CANCELLED, headers=_ended(job), meta=job.meta)
        if not await queue.apply(self._transition(job, job.epoch, update, run)):
            return False
        self._finished(run)
        self._job_ended(job.id, run)
        return True

    async def debounce_into(self, queue: JobQueue, job: Job, run: Run, into: str) -> bool:
        """A pending run replaced by a newer one of its debounce burst ends debounced."""
        run = copy_run(run)
        run.status = RunStatus.DEBOUNCED
        run.output = {"debounced_into": into}
        run.finished_at = self.clock.now()
        self.log(run, f"debounced: coalesced into run {into}")
        update = JobUpdate(state=JobState.CANCELLED, meta=job.meta)
        if not await queue.apply(self._transition(job, job.epoch, update, run)):
            return False
        self._finished(run)
        self._job_ended(job.id, run)
        return True

    async def requeue(self, queue: JobQueue, job: Job, version: str) -> Run | None:
        """A dead or failed job goes back to its queue with a fresh retry budget and a new
        run; None if the job moved meanwhile."""
        meta = {k: v for k, v in job.meta.items() if k not in _SPENT}
        # Counted, and it tells the worker that the run is not the job's first: its record
        # (the requeue's log line, its creation time) is read, not made again from the job.
        meta["requeued"] = int(job.meta.get("requeued", 0)) + 1
        follow = construct(
            Job, {**job.__dict__, "run_id": new_id("run"), "run_at": None, "meta": meta}
        )
        run = make_run(follow, workflow_version=version, created_at=self.clock.now())
        self.log(run, f"requeued: job {job.id} has a fresh retry budget of {job.max_retries}")
        update = JobUpdate(state=JobState.WAITING, run_id=run.id, meta=meta, fresh_budget=True)
        if not await queue.apply(self._transition(job, job.epoch, update, run)):
            return None
        self.queued([run])
        return run

    async def discard(self, queue: JobQueue, job: Job, run: Run | None) -> bool:
        """A dead job out of the dead-letter queue for good: cancelled, its error kept, a line on
        its last run's log; False if the job moved meanwhile."""
        runs: tuple[Run, ...] = ()
        if run is not None:
            run = copy_run(run)
            self.log(run, "discarded: its job was taken out of the dead-letter queue")
            runs = (run,)
        meta = {**job.meta, "discarded": self.clock.now().isoformat()}
        update = JobUpdate(state=JobState.CANCELLED, run_id=job.run_id, error=job.error, meta=meta)
        return await queue.apply(self._transition(job, job.epoch, update, *runs))

    async def make_due(self, queue: JobQueue, job: Job, run: Run | None, force: bool) -> bool:
        """Bring a waiting or delayed job forward to now (`force`: even on a paused queue)."""
        runs: tuple[Run, ...] = ()
        if run is not None and run.status in (RunStatus.DELAYED, RunStatus.THROTTLED):
            run = copy_run(run)
            run.status = RunStatus.QUEUED
            run.run_at = None
            self.log(run, "retry now: the operator started it without waiting")
            runs = (run,)
        update = JobUpdate(
            state=JobState.WAITING,
            run_id=job.run_id,
            resume=job.resume,
            meta=job.meta,
            force=force,
        )
        if not await queue.apply(self._transition(job, job.epoch, update, *runs)):
            return False
        queue.wake(job.queue)
        if run is not None and runs:
            self._changed(run)
        return True

    async def release(
        self,
        queue: JobQueue,
        job: Job,
        run: Run | None,
        reason: str,
        seen: datetime | None = None,
    ) -> bool:
        """A dead worker's job goes back to its queue: a run it had started, or may have begun
        (a job handed to one of its slots), is recorded crashed where the worker was last
        `seen`, and the job's next delivery runs a new one."""
        if not may_have_begun(run, job):
            update = JobUpdate(
                state=JobState.WAITING,
                run_id=job.run_id,
                resume=job.resume,
                meta=job.meta_not_delivered(),
                force=job.force,
            )
            return await queue.apply(self._transition(job, job.epoch, update))
        run = copy_run(run)
        self._crash(run, reason, seen)
        meta, poison = self._crashed(job, run)
        if poison is not None:
            update = JobUpdate(state=JobState.DEAD, error=poison, meta=meta)
            if not await queue.apply(self._transition(job, job.epoch, update, run)):
                return False
            self._finished(run)
            self._job_ended(job.id, run)
            return True
        next_run = self._redelivery(job, run, meta)
        update = JobUpdate(state=JobState.WAITING, run_id=next_run.id, meta=meta)
        if not await queue.apply(self._transition(job, job.epoch, update, run, next_run)):
            return False
        self._finished(run)
        self.queued([next_run])
        return True

    def _crashed(self, job: Job, run: Run) -> tuple[dict[str, Any], str | None]:
        """The job's meta counting one more run that crashed its worker (it died, or froze
        past its lease), and, when that makes MAX_CRASHES, why it goes to the dead-letter
        queue: a job that kills every worker that takes it would otherwise take down each in
        turn, for ever (retries do not count crashes: most are the machine's, not the job's)."""
        crashes = int(job.meta.get("crashes", 0)) + 1
        meta = {**job.meta, "crashes": crashes}
        if crashes < MAX_CRASHES:
            return meta, None
        why = (
            f"its runs crashed their workers {crashes} times: moved to the dead-letter queue "
            "so that it takes down no more (requeue it to try again)"
        )
        self.log(run, f"job {job.id} {why}", "error")
        return meta, why
