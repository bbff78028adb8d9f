"""Why is a run waiting? The answer the console's run view shows for a run that has not started
or does not go on: the gate or the wait that holds it, its key, the runs holding the slots it
waits for, and when it may start.

Read from the run's record (its waiting step), its job (`meta["gate"]`, noted by the gates in
engine/gates.py) and the shared state (slot holders, the starts of a rate-limit window,
pauses), so it answers the same in any process.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .backends.base import Backend
from .liveness import LiveWorkers
from .models import Job, JobState, Run, RunStatus, StepStatus, from_epoch


@dataclass(frozen=True, slots=True)
class WaitReason:
    """`gate`: event | event_came | subworkflow | sleep | rate_limit | concurrency | debounce |
    paused | throttled | delay | retry | no_worker | queued | running | ended. `holders`: the runs
    holding what it waits for (the concurrency slots of its key, the starts in its rate-limit
    window, the child run it waits on), oldest first. `until`: when it may start or go on
    (None: when its event comes, or a slot frees)."""

    run_id: str
    status: RunStatus
    gate: str
    summary: str
    key: str | None = None
    holders: tuple[str, ...] = ()
    until: datetime | None = None
    event: str | None = None


def _waiting_step(run: Run) -> Any:
    """The innermost step the run waits in (nested records come after their parents)."""
    waiting = [s for s in run.steps if s.status is StepStatus.WAITING]
    return waiting[-1] if waiting else None


def _at(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment is not None else "?"


async def explain(backend: Backend, run: Run, job: Job | None) -> WaitReason:
    status = run.status
    if run.terminal:
        return WaitReason(run.id, status, "ended", f"it ended ({status})")
    if status is RunStatus.RUNNING:
        return WaitReason(run.id, status, "running", "it is running")
    if status is RunStatus.WAITING:
        reason = _explain_wait(run)
        if reason.event is not None:
            return await _event_came(backend, run, reason)
        return await _unserved_when_due(backend, run, reason)
    if run.queue in await backend.shared.paused_queues() and not (job and job.force):
        return WaitReason(
            run.id, status, "paused", f"queue {run.queue!r} is paused: nothing new starts"
        )
    gate = (job.meta.get("gate") if job is not None else None) or {}
    until = from_epoch(gate.get("until")) if gate.get("until") is not None else run.run_at
    key = str(gate.get("key"))
    if gate.get("gate") == "concurrency":
        holders = await backend.shared.slot_holders(run.workflow_name, key)
        return WaitReason(
            run.id,
            status,
            "concurrency",
            f"concurrency key {key!r}: {len(holders)} run(s) hold its slots; held jobs go in "
            f"turn as those end, or this one is tried again at {_at(until)}",
            key,
            tuple(holders),
            until,
        )
    if gate.get("gate") == "rate_limit":
        period_s = float(gate.get("period_ms", 0)) / 1000
        starts = await backend.shared.recent_starts(
            run.workflow_name, key, backend.clock.time() - period_s
        )
        return WaitReason(
            run.id,
            status,
            "rate_limit",
            f"rate limit: {len(starts)}/{gate.get('limit', '?')} runs started in the window"
            + (f" for key {key!r}" if key != "*" else "")
            + f"; may start at {_at(until)}",
            None if key == "*" else key,
            tuple(run_id for run_id, _ in starts),
            until,
        )
    if gate.get("gate") == "debounce":
        return WaitReason(
            run.id,
            status,
            "debounce",
            f"debounced on key {key!r}: fires at {_at(until)} unless a newer job replaces it",
            key,
            (),
            until,
        )
    if status is RunStatus.THROTTLED:  # held before its gate noted why (an older run)
        return WaitReason(run.id, status, "throttled", run.error or "throttled", until=run.run_at)
    if status is RunStatus.DELAYED:
        failures = int(job.meta.get("failures", 0)) if job is not None else 0
        if failures:
            return WaitReason(
                run.id,
                status,
                "retry",
                f"job attempt {failures} failed: the next one starts at {_at(run.run_at)}",
                until=run.run_at,
            )
        delayed = WaitReason(
            run.id, status, "delay", f"delayed until {_at(run.run_at)}", until=run.run_at
        )
        return await _unserved_when_due(backend, run, delayed)
    if job is not None and job.state is JobState.ACTIVE:
        # Claimed ahead of a free slot (a database queue's claim takes more than it was asked):
        # it starts as soon as one of that worker's slots is free, not necessarily now.
        held = f"worker {job.worker}" if job.worker else "a worker"
        return WaitReason(
            run.id, status, "queued", f"claimed by {held}: it starts when one of its slots is free"
        )
    live = await LiveWorkers.read(backend)
    if run.queue not in live.serving:
        return WaitReason(run.id, status, "no_worker", _nobody_serves(run.queue, live, "starts"))
    return WaitReason(run.id, status, "queued", "queued: it starts when a worker slot is free")


async def served(backend: Backend, queue: str) -> bool:
    """Whether a live worker declared `queue`: a producer can enqueue to a queue whose workers
    all stopped (their catalog stays known), and its runs wait for the next one."""
    return queue in (await LiveWorkers.read(backend)).serving


def _nobody_serves(queue: str, live: LiveWorkers, then: str) -> str:
    """Why nothing takes a run of `queue` up: no worker lives, or those that do serve other
    queues (its workflow file was removed, or its queue renamed, under them)."""
    if not live.serving:
        return f"no live worker serves queue {queue!r}: it {then} once one does (blok-tui worker)"
    others = sorted(live.serving)
    shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    return (
        f"no live worker serves queue {queue!r} (those alive serve {shown}; was its workflow "
        f"file removed, or its queue renamed?): it {then} once one serves {queue!r} again"
    )


async def _unserved_when_due(backend: Backend, run: Run, reason: WaitReason) -> WaitReason:
    """A wait or a delay whose time has passed, in a queue no live worker serves: it said
    "sleeping until 08:55:13" at 08:55:28, for ever."""
    if reason.until is None or reason.until > backend.clock.now():
        return reason
    live = await LiveWorkers.read(backend)
    if run.queue in live.serving:
        return reason
    due = f"due since {_at(reason.until)}; " + _nobody_serves(run.queue, live, "goes on")
    return WaitReason(run.id, run.status, "no_worker", due, until=reason.until)


async def _event_came(backend: Backend, run: Run, waiting: WaitReason) -> WaitReason:
    """A run waiting for an event that came, and is in its mailbox for it to take: it goes on
    when a worker serving its queue takes it up (it asked for no new send), if one lives."""
    came = [
        message
        for message in await backend.runs.events_of(run.id)
        if message.event == waiting.event and message.taken_by is None
    ]
    if not came:
        return waiting
    sent = from_epoch(came[0].sent_at)
    live = await LiveWorkers.read(backend)
    then = (
        "a worker takes it up now"
        if run.queue in live.serving
        else _nobody_serves(run.queue, live, "goes on")
    )
    return WaitReason(
        run.id,
        run.status,
        "event_came",
        f"event {waiting.event!r} came at {_at(sent)}; {then}",
        waiting.key,
        (),
        None,
        waiting.event,
    )


def _explain_wait(run: Run) -> WaitReason:
    step = _waiting_step(run)
    until = run.wait_until
    if step is not None and step.kind == "event":
        wanted = step.input or {}
        event, key = wanted.get("event"), wanted.get("key")
        deadline = step.wait_until
        keyed = f" with key {key!r}" if key is not None else ""
        limit = f"until {_at(deadline)}" if deadline is not None else "with no timeout"
        return WaitReason(
            run.id,
            run.status,
            "event",
            f"waiting for event {event!r}{keyed} {limit} (then it goes on with None)"
            if deadline is not None
            else f"waiting for event {event!r}{keyed} {limit}",
            key,
            (),
            deadline,
            event,
        )
    if step is not None and step.kind == "subworkflow" and step.child_run_id:
        return WaitReason(
            run.id,
            run.status,
            "subworkflow",
            f"waiting for its child run {step.child_run_id} (looks again at {_at(until)})",
            None,
            (step.child_run_id,),
            until,
        )
    name = f" in step {step.name!r}" if step is not None else ""
    return WaitReason(
        run.id, run.status, "sleep", f"sleeping{name} until {_at(until)}", until=until
    )
