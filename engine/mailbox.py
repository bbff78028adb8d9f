"""Events sent to runs: `engine.send_event(run_id, "approved", payload)`.

The mailbox of each run is the backend's (RunStore.post_event / take_event): an event is written
first, durably, and only then is the run woken. A run parked in `wait.for_event` has its job
delayed until its timeout, holding no worker slot; waking it brings that job forward through
the ledger (`make_due`), so whichever worker claims it next — this process, another one, or
one that starts later — resumes the run, and the wait step takes the event from the mailbox.
So an event reaches its run from any process (the CLI, a producer engine), sent before the run
reached its wait, or while no worker runs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .backends.base import Backend, EventMessage, payload_key
from .errors import EngineError, UnknownRun
from .ledger import Ledger
from .models import EventOutcome, EventSent, JobState, Run, RunStatus, WorkflowInfo
from .validation import check_event_name, checked

log = logging.getLogger("blok.mailbox")

# How long a sender waits for a run that registered its wait to be parked by its worker (the
# settle is the next thing that worker does) before it gives up waking it: the run then takes
# the event at its timeout at the latest.
WAKE_WAIT_S = 10.0


class Mailbox:
    def __init__(self, backend: Backend, ledger: Ledger) -> None:
        self.backend = backend
        self.store = backend.runs
        self.ledger = ledger

    async def send(self, run_id: str | None, event: str, payload: Any) -> EventSent:
        """Deliver `event` to the run (or, with `run_id=None`, to the runs waiting on the key
        the payload carries); the ids of the runs it went to ([]: sent by key with nobody
        waiting, kept for the first run that waits on its key), and what became of it."""
        checked(check_event_name, event)
        run: Run | None = None
        if run_id is not None:
            run = await self.store.get_run(run_id)
            if run is None:
                raise UnknownRun(f"unknown run {run_id!r}: event {event!r} not sent")
            if run.terminal:
                raise EngineError(
                    f"run {run_id} has already ended ({run.status}): event {event!r} not sent"
                )
        deliveries = await self.store.post_event(event, payload, run_id=run_id)
        if deliveries is None:
            raise EngineError(f"run {run_id} ended meanwhile: event {event!r} not sent")
        for delivery in deliveries:
            if delivery.waiting:
                await self._wake(delivery.run_id, delivery.message_id)
        reached = [delivery.run_id for delivery in deliveries]
        if any(delivery.waiting for delivery in deliveries):
            return EventSent(event, reached, EventOutcome.DELIVERED, run=run)
        if run is None:  # kept for a run to come: does any workflow here ever wait for it?
            declared = [info for c in await self.backend.shared.catalogs() for info in c.workflows]
            return EventSent(
                event,
                reached,
                EventOutcome.KEPT,
                workflow_events=_awaited(declared),
                missing_keys=_missing_keys(event, payload, declared),
                unkeyed=_unkeyed(event, declared),
            )
        # Kept: say what the run waits for instead, and whether it ever waits for this one.
        waiters = await self.store.event_waiters([run.id])
        return EventSent(
            event,
            reached,
            EventOutcome.KEPT,
            waits_for=tuple(dict.fromkeys(waiter.event for waiter in waiters)),
            run=run,
            workflow_events=await self._events_of_workflow(run),
        )

    async def _events_of_workflow(self, run: Run) -> tuple[str, ...] | None:
        """The events a run of the run's workflow waits for anywhere, as the workers on the
        database declared its version (any version of it they serve, if none declared the
        run's own); None when no worker said."""
        declared = [
            info
            for catalog in await self.backend.shared.catalogs()
            for info in catalog.workflows
            if info.name == run.workflow_name
        ]
        declared = [i for i in declared if i.version == run.workflow_version] or declared
        return _awaited(declared)

    async def _wake(self, run_id: str, message_id: int) -> None:
        """Bring the parked run's job forward so that a worker resumes it now."""
        deadline = time.monotonic() + WAKE_WAIT_S
        token = await self.backend.change_token()
        while True:
            run = await self.store.get_run(run_id)
            if run is None or run.terminal:
                return
            found = await self.backend.find_job(run.job_id)
            if found is None:
                # A memory queue of another process: its worker finds the event when the
                # run's wait comes up again (its timeout, or a restart).
                log.info("run %s: its job is not reachable here; it takes the event later", run_id)
                return
            queue, job = found
            if job.run_id != run_id or job.state.terminal:
                return
            if job.state is JobState.DELAYED or (
                job.state is JobState.WAITING and run.status is RunStatus.WAITING
            ):
                if job.state is JobState.WAITING and job.run_at is None:
                    return  # due already: the next claim resumes it
                if await self.ledger.make_due(queue, job, None, force=False):
                    return
                continue  # moved meanwhile: look again
            # Active: its worker is parking it (it registered the wait), or resumed it and
            # takes the event itself.
            if any(m.id == message_id and m.taken_by for m in await self.store.events_of(run_id)):
                return
            if time.monotonic() > deadline:
                log.warning(
                    "run %s: still held by worker %s after %.0fs; it takes event message %d "
                    "when its wait comes up again",
                    run_id,
                    job.worker,
                    WAKE_WAIT_S,
                    message_id,
                )
                return
            token = await self.backend.wait_for_change(token, 0.05)

    async def events_of(self, run_id: str) -> list[EventMessage]:
        """The run's mailbox: every event sent to it, taken by a wait step or not."""
        if await self.store.get_run(run_id) is None:
            raise UnknownRun(f"unknown run {run_id!r}")
        return await self.store.events_of(run_id)


def _missing_keys(event: str, payload: Any, declared: list[WorkflowInfo]) -> tuple[str, ...]:
    """The paths the keyed waits for `event` match on, where the payload carries none of them
    (empty when it carries one, or nothing is known of them): read as every backend reads a
    delivery's key (`payload_key`)."""
    paths = list(
        dict.fromkeys(p for info in declared for p in (info.event_keys or {}).get(event, ()))
    )
    if any(payload_key(payload, tuple(path.split("."))) is not None for path in paths):
        return ()
    return tuple(paths)


def _unkeyed(event: str, declared: list[WorkflowInfo]) -> bool:
    """Whether the waits for `event` all take it sent to their run, none by key (no `match=`):
    an event sent by key is kept for a run that never comes. False when nothing is known, or
    nothing waits for it (a warning of its own)."""
    known = bool(declared) and all(info.event_keys is not None for info in declared)
    awaited = any(event in (info.events or ()) for info in declared)
    keyed = any(event in (info.event_keys or {}) for info in declared)
    return known and awaited and not keyed


def _awaited(declared: list[WorkflowInfo]) -> tuple[str, ...] | None:
    """The events these declared workflows wait for anywhere, each once; None when there are
    none, or one of them did not say."""
    if not declared or any(info.events is None for info in declared):
        return None
    return tuple(dict.fromkeys(event for info in declared for event in info.events or ()))
