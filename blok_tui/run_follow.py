"""`blok-tui show RUN_ID --follow`: what happens to a run from now on, one line a moment, as
`tail -f` shows a log: each attempt started, each attempt that failed, each step that ended or
began to wait, each log line and each change of the run's status.

The lines come from the run's record, not from the events that woke the follower: each re-read
is compared with what was already told, so a missed or merged event loses nothing (a follower
that fell behind re-reads once and tells all of it), and an attached engine and a local one
are followed alike. No Textual here: the text is the same in a terminal and in a file."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, tzinfo

from engine import Job, Orphan, Run, StepRun, UnknownJob, UnknownRun, WaitReason
from engine.api import EngineAPI
from engine.events import (
    AttemptFailed,
    Event,
    Lagged,
    LogRecorded,
    RunFinished,
    RunQueued,
    RunStarted,
    RunStatusChanged,
    StepFinished,
    StepStarted,
    Subscription,
)
from engine.models import PENDING_RUN_STATUSES, RunStatus
from engine.text import printable

from .console import local_times
from .plain_text import one_line, wrapped
from .run_text import ERROR_CHARS, attempt_error, between, why_line
from .tracebacks import clean_error

# What a moment is, to tell it once: ("attempt", step index, number), ("log", ...), ...
Key = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class Moment:
    at: datetime
    key: Key  # what it is, to tell it once
    text: str


@dataclass
class RunFollower:
    """What was told of one run so far; `news(run)` tells the rest, oldest first."""

    tz: tzinfo | None = None
    told: set[Key] = field(default_factory=set)
    status: str | None = None  # the run's status last told (it can come back: waiting, running)
    # The time on the last line told. A moment the record times can come out a hair before a
    # line the follower stamped when it read (a status, its why): its line says the later time,
    # so that the lines read in order.
    last: datetime | None = None

    def line(self, at: datetime, text: str) -> str:
        """`text` at `at`, or at the last line's time if that is later."""
        if self.last is not None and at < self.last:
            at = self.last
        self.last = at
        return clock_line(at, text, self.tz)

    def after(self) -> RunFollower:
        """A follower of another run (the job's next delivery), its lines after these."""
        return RunFollower(tz=self.tz, last=self.last)

    def know(self, run: Run) -> None:
        """Take what `run` holds as told already (`blok-tui show` printed it)."""
        self.told.update(moment.key for moment in moments(run))
        self.status = str(run.status)

    def news(self, run: Run, now: datetime) -> list[str]:
        new = [moment for moment in moments(run) if moment.key not in self.told]
        self.told.update(moment.key for moment in new)
        status = str(run.status)
        went_on = status not in _UNSTARTED and status != "running"
        if self.status in _UNSTARTED and went_on and run.started_at is not None:
            # It started and went on (to a wait, or its end) between two reads: its start, and
            # the worker it ran on, are news still ("run queued", then its steps, said neither).
            worker = f" on {run.worker}" if run.worker else ""
            new.insert(0, Moment(run.started_at, ("started",), f"run running{worker}"))
        if status != self.status:
            self.status = status
            told = Moment(_status_moment(run, now), ("status",), _status_text(run))
            if status == "running" and new:
                # Back to running after a wait: it ran what is new, so it came first.
                earliest = min(moment.at for moment in new)
                new.insert(0, Moment(min(told.at, earliest), told.key, told.text))
            elif run.terminal and new:
                # Its end comes after its steps' ends, though the record may say a sub-ms earlier.
                latest = max(moment.at for moment in new)
                new.append(Moment(max(told.at, latest), told.key, told.text))
            else:
                new.append(told)
        new.sort(key=lambda moment: moment.at)
        return [self.line(moment.at, moment.text) for moment in new]


async def follow(
    engine: EngineAPI,
    events: Subscription,
    run: Run,
    follower: RunFollower,
    say: Callable[[str], None],
) -> Run:
    """Tell `say` what happens to `run` until it ends, then to each delivery its job goes on
    with (a retry, a recovery after a crash); the last delivery's run, ended. `events` must
    be subscribed before `run` was read: a change between the two wakes the first wait."""
    if run.terminal:
        # It ended before the first read (a replay or an enqueue of a moment): its moments are
        # news still, where nothing was told of it (`show --follow` told them: none are new).
        for line in follower.news(run, engine.now()):
            say(line)
    while True:
        if run.terminal:
            job = await goes_on(engine, run)
            if job is None:
                return run
            run = await engine.get_run(job.run_id)
            went_on = f"delivery {run.job_attempt} of {job.delivery_budget} is run {run.id}"
            say(follower.line(run.created_at, f"job {job.id} goes on: {went_on}"))
            follower = follower.after()
        else:
            await _next_change(events, run.id)
            run = await engine.get_run(run.id)
        told = follower.status
        for line in follower.news(run, engine.now()):
            say(line)
        why = await why_held(engine, run) if follower.status != told else None
        if why is not None:  # a new wait, a delay, a gate: what it waits for
            say(
                follower.line(engine.now(), f"why: {why_line(run, why, follower.tz, engine.now())}")
            )


async def job_of(engine: EngineAPI, run: Run) -> Job | None:
    """The run's job, or None once it was purged with the runs that ended before the
    retention."""
    try:
        return await engine.get_job(run.job_id)
    except UnknownJob:
        return None


async def goes_on(engine: EngineAPI, run: Run) -> Job | None:
    """The job of a run that ended, if it went on as another run (a retry, a requeue)."""
    return went_on(run, await job_of(engine, run))


def went_on(run: Run, job: Job | None) -> Job | None:
    """`job`, if it went on from `run` as another run."""
    return job if job is not None and job.run_id != run.id else None


async def delivery_of(engine: EngineAPI, run: Run, job: Job | None) -> int | None:
    """Which delivery of its job the job's run is, where the job went on after `run` (None
    otherwise, or once that run is gone). Read from that run: a retry's, in its backoff, is
    not claimed yet, and the job's claims (`Job.deliveries`) still count the run before."""
    if went_on(run, job) is None:
        return None
    assert job is not None
    try:
        return (await engine.get_run(job.run_id)).job_attempt
    except UnknownRun:
        return None


async def usual_of(engine: EngineAPI, run: Run) -> float | None:
    """How long a running run's workflow usually takes (seconds), to say if it is stuck."""
    return (
        await engine.usual_duration(run.workflow_name) if run.status is RunStatus.RUNNING else None
    )


async def orphan_of(engine: EngineAPI, run: Run, job: Job | None) -> Orphan | None:
    """Why nobody runs a running run whose worker is gone (`Engine.orphaned`); None
    otherwise. `job`: the run's, None if no queue here has it."""
    if run.status is not RunStatus.RUNNING or (job is not None and job.run_id != run.id):
        return None
    return engine.orphaned(run, job, await engine.workers())


async def why_held(engine: EngineAPI, run: Run) -> WaitReason | None:
    """What a run that has not started, or goes on later, waits for; None for the others."""
    return await engine.why_waiting(run.id) if run.status in PENDING_RUN_STATUSES else None


async def _next_change(events: Subscription, run_id: str) -> None:
    """Wait until an event says the run changed (or the follower fell behind the events, and
    anything may have)."""
    async for event in events:
        if may_change(event, run_id):
            return


_OF_A_RUN = (
    RunQueued,
    RunStarted,
    RunStatusChanged,
    RunFinished,
    StepStarted,
    StepFinished,
    AttemptFailed,
    LogRecorded,
)


def may_change(event: Event, run_id: str) -> bool:
    """Whether after `event` the run `run_id` may read differently: an event about it, or word
    that this subscriber fell behind the events (then any run may have changed)."""
    return isinstance(event, Lagged) or (isinstance(event, _OF_A_RUN) and event.run_id == run_id)


def moments(run: Run) -> list[Moment]:
    """Everything the record says happened to its steps, each with when it happened."""
    found: list[Moment] = []
    for step in run.steps:
        name = _step_name(step)
        for attempt in step.attempts:
            of = f" of {step.max_attempts}" if step.max_attempts > 1 else ""
            started = f"{name} started" if attempt.number == 1 and not of else ""
            found.append(
                Moment(
                    attempt.started_at,
                    ("attempt", step.index, attempt.number),
                    started or f"{name} attempt {attempt.number}{of} started",
                )
            )
            # A step of one attempt: its end says how the attempt failed.
            if attempt.error and attempt.finished_at is not None and step.max_attempts > 1:
                found.append(
                    Moment(
                        attempt.finished_at,
                        ("failed", step.index, attempt.number),
                        f"{name} attempt {attempt.number}{of} {attempt.status}"
                        f" after {between(attempt.started_at, attempt.finished_at)}:"
                        f" {attempt_error(attempt)}",
                    )
                )
        ended = _step_end(step, name, run.created_at)
        if ended is not None:
            found.append(ended)
        for line in step.logs:
            found.append(_log_moment(line.ts, line.level, name, line.message, step.index))
    for line in run.logs:
        found.append(_log_moment(line.ts, line.level, "", line.message, None))
    return found


def _step_name(step: StepRun) -> str:
    """The step's name, and for a nested step the group it sits in: a for_each's steps share
    their names, one set an iteration."""
    group = f" ({step.tags[0]})" if step.parent is not None and step.tags else ""
    return printable(step.name + group)


def _step_end(step: StepRun, name: str, fallback: datetime) -> Moment | None:
    """The step's end, or its wait; `fallback`: when, for a record that does not say."""
    status = str(step.status)
    if status in ("pending", "running"):
        return None
    key: Key = ("step", step.index, status)
    if status == "waiting":
        until = f" until {step.wait_until.isoformat()}" if step.wait_until else ""
        return Moment(step.started_at or fallback, key, f"{name} waiting{until}")
    at = step.finished_at or step.started_at or fallback
    text = f"{name} {status}"
    if step.started_at is not None and step.finished_at is not None and status != "cached":
        text += f" in {between(step.started_at, step.finished_at)}"
    if status == "cached" and step.cached_from:
        text += f" from {step.cached_from}"
    if step.error and status != "completed":
        text += f": {one_line(clean_error(step.error), ERROR_CHARS)}"
    return Moment(at, key, text)


def _log_moment(ts: datetime, level: str, name: str, message: str, index: int | None) -> Moment:
    key: Key = ("log", index, ts, level, message)
    return Moment(ts, key, f"{level:<7}  {name or '-'}  {message}")


# The statuses of a run no worker has started: the follower has told no start yet (None: it
# has read nothing of the run).
_UNSTARTED: frozenset[str | None] = frozenset({None, "queued", "delayed", "throttled", "debounced"})


def _status_moment(run: Run, now: datetime) -> datetime:
    """When the run came to its status: its end, or about now (a record keeps no time for a
    change back to running after a wait, and the follower reads it as soon as it is told)."""
    return run.finished_at if run.finished_at is not None else now


def _status_text(run: Run) -> str:
    status = str(run.status)
    text = f"run {status}"
    if status == "running" and run.worker:
        text += f" on {run.worker}"
    if status == "waiting" and run.wait_until is not None:
        text += f" until {run.wait_until.isoformat()}"
    if status in ("delayed", "throttled") and run.run_at is not None:
        text += f" until {run.run_at.isoformat()}"
    if run.finished_at is not None and run.started_at is not None:
        text += f" in {between(run.started_at, run.finished_at)}"
    if run.error:
        text += f": {one_line(clean_error(run.error), ERROR_CHARS)}"
    if status == "completed":
        output = json.dumps(run.output, ensure_ascii=False, default=str)
        text += f", output {one_line(output, ERROR_CHARS)}"
    return text


CLOCK = 14  # "12:04:31.125  ": the time a follower's line opens with, its text after it


def clock_line(at: datetime, text: str, tz: tzinfo | None = None) -> str:
    """`text` after the time `at` (in `tz`, None: this machine's), its further lines indented
    under its first."""
    when = at.astimezone(tz).strftime("%H:%M:%S.%f")[:-3]
    text = local_times(printable(text), tz, at)
    first, *rest = text.splitlines() or [""]
    return "\n".join([f"{when}  {first}", *(" " * CLOCK + line for line in rest)])


def fitted(lines: str, width: int | None) -> str:
    """A follower's `clock_line`s for a terminal `width` columns wide: each too long wrapped
    between words, under its text (None: a pipe, a file; as they are, a line an event). At 80
    columns the terminal broke nearly every line of `runs --follow` mid-word ("export\ns")
    and went on under the times."""
    return "\n".join(part for line in lines.split("\n") for part in wrapped(line, width, CLOCK))
