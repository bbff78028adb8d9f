"""The contract of the event mailbox (RunStore.post_event / take_event / events_of / purge_events),
on every backend: what engine/mailbox.py and the runner's event wait rely on."""

from __future__ import annotations

import time
from datetime import timedelta

import anyio
import pytest

from engine.backends.base import Backend
from engine.ledger import make_job, make_run
from engine.models import Run, RunStatus, utcnow

from .databases import MULTI_PROCESS

pytestmark = pytest.mark.anyio


async def a_run(
    backend: Backend, body: object = None, status: RunStatus = RunStatus.WAITING
) -> Run:
    job = make_job(
        queue="q",
        workflow_name="wf",
        payload=body,
        headers=None,
        priority=0,
        run_at=None,
        max_retries=0,
    )
    run = make_run(job, workflow_version="v1", status=status)
    backend.runs.save_run(run)
    await backend.runs.flush()
    return run


async def test_an_event_sent_before_the_wait_is_kept_for_it(backend: Backend) -> None:
    run = await a_run(backend)
    sent = await backend.runs.post_event("approved", {"by": "ann"}, run_id=run.id)
    assert sent is not None and [(d.run_id, d.waiting) for d in sent] == [(run.id, False)]
    taken = await backend.runs.take_event(run.id, "1:approval", "approved")
    assert taken is not None and taken.payload == {"by": "ann"} and taken.taken_by == "1:approval"
    # Taken once: the same step gets the same message again (a resume), nobody else does.
    again = await backend.runs.take_event(run.id, "1:approval", "approved")
    assert again is not None and again.id == taken.id
    assert await backend.runs.take_event(run.id, "2:second", "approved") is None


async def test_a_registered_waiter_is_reported_waiting(backend: Backend) -> None:
    run = await a_run(backend)
    assert await backend.runs.take_event(run.id, "1:approval", "approved") is None
    assert [w.run_id for w in await backend.runs.event_waiters([run.id])] == [run.id]
    other = await backend.runs.post_event("other", 1, run_id=run.id)
    assert other is not None and not other[0].waiting  # it waits for another event
    sent = await backend.runs.post_event("approved", 2, run_id=run.id)
    assert sent is not None and sent[0].waiting
    taken = await backend.runs.take_event(run.id, "1:approval", "approved")
    assert taken is not None and taken.payload == 2
    assert await backend.runs.event_waiters([run.id]) == []
    # The one nobody waited for is still in the mailbox, untaken.
    box = await backend.runs.events_of(run.id)
    assert [(m.event, m.taken_by) for m in box] == [("other", None), ("approved", "1:approval")]


async def test_giving_up_drops_the_waiter(backend: Backend) -> None:
    run = await a_run(backend)
    await backend.runs.take_event(run.id, "1:a", "approved")
    assert await backend.runs.take_event(run.id, "1:a", "approved", register=False) is None
    assert await backend.runs.event_waiters([run.id]) == []
    sent = await backend.runs.post_event("approved", None, run_id=run.id)
    assert sent is not None and not sent[0].waiting


async def test_unknown_and_ended_runs_get_nothing(backend: Backend) -> None:
    assert await backend.runs.post_event("approved", 1, run_id="run_nope") is None
    done = await a_run(backend, status=RunStatus.COMPLETED)
    assert await backend.runs.post_event("approved", 1, run_id=done.id) is None
    assert await backend.runs.events_of(done.id) == []


async def test_delivery_by_key_reaches_the_waiters_of_that_key(backend: Backend) -> None:
    a1 = await a_run(backend, {"order_id": "A1"})
    a1_too = await a_run(backend, {"order_id": "A1"})
    b2 = await a_run(backend, {"order_id": "B2"})
    for run, key in ((a1, "A1"), (a1_too, "A1"), (b2, "B2")):
        assert (
            await backend.runs.take_event(run.id, "0:paid", "paid", key=key, path=("order_id",))
            is None
        )
    sent = await backend.runs.post_event("paid", {"order_id": "A1", "amount": 5}, run_id=None)
    assert sent is not None
    assert sorted(d.run_id for d in sent) == sorted([a1.id, a1_too.id])
    assert all(d.waiting for d in sent)
    for run in (a1, a1_too):
        taken = await backend.runs.take_event(
            run.id, "0:paid", "paid", key="A1", path=("order_id",)
        )
        assert taken is not None and taken.payload["amount"] == 5
    assert (
        await backend.runs.take_event(b2.id, "0:paid", "paid", key="B2", path=("order_id",)) is None
    )


async def test_a_keyed_event_nobody_waits_for_goes_to_the_first_that_does(backend: Backend) -> None:
    assert await backend.runs.post_event("paid", {"order_id": 7}, run_id=None) == []
    other = await a_run(backend)
    assert (
        await backend.runs.take_event(other.id, "0:paid", "paid", key="8", path=("order_id",))
        is None
    )
    first = await a_run(backend)
    taken = await backend.runs.take_event(first.id, "0:paid", "paid", key="7", path=("order_id",))
    assert taken is not None and taken.run_id == first.id and taken.payload == {"order_id": 7}
    second = await a_run(backend)
    assert (
        await backend.runs.take_event(second.id, "0:paid", "paid", key="7", path=("order_id",))
        is None
    )


async def test_racing_senders_and_a_waiter_lose_no_event(backend: Backend) -> None:
    """Whatever the interleaving, every event sent is either found by the wait or reported as
    sent to a registered waiter (whose job the sender then wakes)."""
    for _ in range(20):
        run = await a_run(backend)
        reports: list[bool] = []
        found: list[object] = []

        async def send(run: Run = run, reports: list[bool] = reports) -> None:
            sent = await backend.runs.post_event("go", 1, run_id=run.id)
            assert sent is not None
            reports.append(sent[0].waiting)

        async def wait(run: Run = run, found: list[object] = found) -> None:
            found.append(await backend.runs.take_event(run.id, "0:w", "go"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(send)
            tg.start_soon(wait)
        assert (found[0] is not None) != reports[0]


async def test_purge_forgets_old_unaddressed_events_and_ended_waiters(backend: Backend) -> None:
    await backend.runs.post_event("paid", {"order_id": 1}, run_id=None)
    run = await a_run(backend)
    await backend.runs.take_event(run.id, "0:w", "go")
    run.status = RunStatus.CANCELLED
    run.finished_at = utcnow()
    backend.runs.save_run(run)
    await backend.runs.flush()
    assert await backend.runs.purge_events(time.time() + 1) == 1
    assert await backend.runs.event_waiters() == []
    # The run's own messages go with the run.
    kept = await a_run(backend)
    await backend.runs.post_event("note", 1, run_id=kept.id)
    kept.status = RunStatus.COMPLETED
    kept.finished_at = utcnow() - timedelta(days=2)
    backend.runs.save_run(kept)
    await backend.runs.flush()
    assert await backend.runs.purge(utcnow() - timedelta(days=1)) >= 1
    await backend.runs.purge_events(0)
    assert await backend.runs.events_of(kept.id) == []


async def test_purge_deletes_the_mailbox_and_waiter_of_each_run_it_deletes(
    backend: Backend,
) -> None:
    gone = await a_run(backend)
    await backend.runs.post_event("note", 1, run_id=gone.id)
    await backend.runs.take_event(gone.id, "1:w", "go")  # cancelled while it waited
    gone.status = RunStatus.CANCELLED
    gone.finished_at = utcnow() - timedelta(days=2)
    backend.runs.save_run(gone)
    await backend.runs.flush()
    assert await backend.runs.purge(utcnow() - timedelta(days=1)) == 1
    # With the run, not at the next purge_events.
    assert await backend.runs.events_of(gone.id) == []
    assert await backend.runs.event_waiters([gone.id]) == []


# ---- two processes ---------------------------------------------------------------------------
# A backend serializes what one process does on its own (memory runs each call to its end, a
# SQL backend's writer commits one batch at a time), so the guarantees that matter between
# processes are tested from two backends on one database: sends from one, waits from the other.
ROUNDS = 10
RUNS_PER_ROUND = 10


@pytest.mark.parametrize("database_kind", MULTI_PROCESS, indirect=True)
async def test_a_send_from_another_process_and_a_wait_never_miss_each_other(
    backend: Backend, other_backend: Backend
) -> None:
    reported: dict[str, bool] = {}
    found: dict[str, bool] = {}

    async def send(run: Run) -> None:
        sent = await other_backend.runs.post_event("go", run.id, run_id=run.id)
        assert sent is not None
        reported[run.id] = sent[0].waiting

    async def wait(run: Run) -> None:
        found[run.id] = await backend.runs.take_event(run.id, "0:w", "go") is not None

    for _ in range(ROUNDS):
        runs = [await a_run(backend) for _ in range(RUNS_PER_ROUND)]
        async with anyio.create_task_group() as tg:
            for run in runs:
                tg.start_soon(send, run)
                tg.start_soon(wait, run)
    # Each event is found by the wait, or reported sent to a waiter (its job is woken).
    assert len(found) == ROUNDS * RUNS_PER_ROUND
    assert [run_id for run_id in found if found[run_id] == reported[run_id]] == []


@pytest.mark.parametrize("database_kind", MULTI_PROCESS, indirect=True)
async def test_a_send_by_key_from_another_process_and_a_wait_on_the_key_never_miss_each_other(
    backend: Backend, other_backend: Backend
) -> None:
    runs: dict[str, Run] = {}
    reached: dict[str, list[str]] = {}
    found: dict[str, bool] = {}

    async def send(key: str) -> None:
        sent = await other_backend.runs.post_event("paid", {"order_id": key}, run_id=None)
        assert sent is not None and all(d.waiting for d in sent)
        reached[key] = [d.run_id for d in sent]

    async def wait(key: str) -> None:
        taken = await backend.runs.take_event(
            runs[key].id, "0:paid", "paid", key=key, path=("order_id",)
        )
        found[key] = taken is not None

    for round_ in range(ROUNDS):
        keys = [f"{round_}-{n}" for n in range(RUNS_PER_ROUND)]
        for key in keys:
            runs[key] = await a_run(backend, {"order_id": key})
        async with anyio.create_task_group() as tg:
            for key in keys:
                tg.start_soon(send, key)
                tg.start_soon(wait, key)
    # The wait took the message the send kept for it, or the send reached the waiter.
    assert len(found) == ROUNDS * RUNS_PER_ROUND
    missed = {key: reached[key] for key in found if (reached[key] == []) != found[key]}
    assert missed == {}
    assert all(reached[key] in ([], [runs[key].id]) for key in found)
