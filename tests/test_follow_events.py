"""An engine that follows a database other engines write (a producer, an attached console,
`blok-tui runs --follow`) tells each run's events once, and tells what it missed between two
reads of the feed: on SQLite and PostgreSQL, with the worker an engine of this process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from support import durable_database, run_events_until, until

from engine import (
    Engine,
    Event,
    RunFinished,
    RunQueued,
    RunStarted,
    RunStatus,
    RunStatusChanged,
    Step,
    StepFinished,
    StepStarted,
    WorkerTrigger,
    Workflow,
    for_each,
    wait,
)
from engine.events import EventBus
from engine.feed import Follower

pytestmark = pytest.mark.anyio


database = durable_database  # the fixture: each DURABLE database in turn (tests/support.py)


async def prepare(ctx: Any) -> str:
    return "prepared"


def approval_flow() -> Workflow:
    return Workflow(
        name="approvals",
        trigger=WorkerTrigger(queue="approvals"),
        steps=[
            Step("prepare", prepare),
            wait.for_event("approved", timeout="1m", name="approval"),
            Step("ship", lambda ctx: ctx.state["approval"]),
        ],
    )


async def waiting(run_id: str, events: AsyncIterator[Event]) -> None:
    """Until the worker engine whose `events` these are tells the run waits."""
    wanted = (run_id, "waiting")
    with anyio.fail_after(20):
        async for event in events:
            if isinstance(event, RunStatusChanged) and (event.run_id, event.status) == wanted:
                return
    raise AssertionError("the event stream ended")


async def following(reader: Engine) -> tuple[Follower, EventBus, AsyncIterator[Event]]:
    """A reader of the feed of `reader`'s database, primed, with its bus and the bus's events
    from now on (the test closes the bus to end them)."""
    bus = EventBus()
    follower = Follower(reader.backend, bus)
    await follower.prime()
    return follower, bus, bus.subscribe()


async def read_once(follower: Follower, reader: Engine, run_id: str, status: RunStatus) -> None:
    """One read of the feed, once the worker's write of the run's `status` is what the
    reader's connection sees."""

    async def committed() -> bool:
        return (await reader.get_run(run_id)).status is status

    await until(committed, timeout=20)
    await follower.read_changes()


async def test_a_run_this_engine_enqueued_is_told_queued_once(database: str) -> None:
    # The producer's own enqueue is told at once, and the feed read that then finds the run
    # is not news again: a console counting runs counted every one twice.
    async with (
        Engine(workflows=[approval_flow()], database=database) as worker,
        Engine(database=database, create=False) as producer,
    ):
        told_by_worker = worker.events()
        events = producer.events()
        job_id = await producer.enqueue("approvals", {})
        run_id = (await producer.get_job(job_id)).run_id
        await waiting(run_id, told_by_worker)
        await producer.send_event(run_id, "approved", {"by": "ann"})
        seen = await run_events_until(events, run_id, RunFinished)
    kinds = [type(e) for e in seen]
    assert kinds.count(RunQueued) == 1, seen
    # Started, then started again when the event resumed it if a read of the feed found it
    # running then too (as the worker's own engine tells it); ended once.
    assert kinds[0] is RunQueued and kinds[1] is RunStarted, seen
    assert kinds.count(RunFinished) == 1 and kinds[-1] is RunFinished, seen


async def test_a_run_first_seen_waiting_is_told_started_and_waiting(database: str) -> None:
    # Between two reads of the feed a run was queued, ran its first step and began to wait:
    # the one read that finds it tells all of it. Only `queued` was told, and
    # `blok-tui runs --follow --status waiting` printed nothing.
    async with (
        Engine(workflows=[approval_flow()], database=database) as worker,
        Engine(database=database, create=False, follow=False) as reader,
    ):
        follower, bus, events = await following(reader)
        told_by_worker = worker.events()
        job_id = await worker.enqueue("approvals", {})
        run_id = (await worker.get_job(job_id)).run_id
        await waiting(run_id, told_by_worker)
        await read_once(follower, reader, run_id, RunStatus.WAITING)
        await worker.send_event(run_id, "approved", {"by": "ann"})
        await worker.wait_for_job(job_id, timeout=20)
        await follower.read_changes()
        bus.close()
        seen = [e async for e in events if getattr(e, "run_id", None) == run_id]
    kinds = [type(e) for e in seen]
    assert kinds[:2] == [RunQueued, RunStarted], seen
    assert kinds.count(RunQueued) == kinds.count(RunStarted) == 1, seen
    changed = [e.status for e in seen if isinstance(e, RunStatusChanged)]
    assert changed == ["waiting"], seen
    assert kinds.index(StepStarted) < kinds.index(StepFinished) < kinds.index(RunStatusChanged)
    assert kinds[-1] is RunFinished


def label(ctx: Any, name: str) -> str:
    return name.upper()


async def test_a_runs_steps_are_told_in_the_order_they_ran_as_its_own_engine_tells_them(
    database: str,
) -> None:
    # A reader told of a for_each run by one read of the feed was told the loop had finished
    # before its first item began, and never that it began (a console or a script drawing the
    # run's rail from the events drew it wrong): the same steps, in the same order, as the
    # engine that ran it tells them.
    flow = Workflow(
        name="labels",
        trigger=WorkerTrigger(queue="labels"),
        steps=[
            Step("prepare", prepare),
            for_each(
                "each",
                "$.body.names",
                steps=[Step("label", label, inputs={"name": "$.state.each.item"})],
            ),
            Step("ship", prepare),
        ],
    )
    async with (
        Engine(workflows=[flow], database=database) as worker,
        Engine(database=database, create=False, follow=False) as reader,
    ):
        follower, bus, events = await following(reader)
        told_by_worker = worker.events()
        job_id = await worker.enqueue("labels", {"names": ["a", "b"]})
        run = await worker.wait_for_job(job_id, timeout=20)
        assert run.status is RunStatus.COMPLETED, run.error
        ran = await run_events_until(told_by_worker, run.id, RunFinished)
        await read_once(follower, reader, run.id, RunStatus.COMPLETED)
        bus.close()
        told = [e async for e in events if getattr(e, "run_id", None) == run.id]

    def steps(seen: list[Event]) -> list[tuple[str, str]]:
        return [
            (type(e).__name__, e.name) for e in seen if isinstance(e, StepStarted | StepFinished)
        ]

    assert steps(told) == steps(ran), told
    assert steps(told)[:3] == [
        ("StepStarted", "prepare"),
        ("StepFinished", "prepare"),
        ("StepStarted", "each"),
    ], told
    assert steps(told)[-3:] == [
        ("StepFinished", "each"),
        ("StepStarted", "ship"),
        ("StepFinished", "ship"),
    ], told
