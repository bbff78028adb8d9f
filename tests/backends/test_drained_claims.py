"""The database queues' claims after one that took all the queue had (engine/backends/sqlite/
queue.py and postgres/queue.py): the next claim waits for a wake-up (a job added or handed
back here; on PostgreSQL, any process's NOTIFY), for the next delayed job to fall due, or for
its usual look, before it asks the database again. A look that finds nothing is a write
transaction on SQLite and a round trip on PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio
import pytest
from support import all_tasks_blocked

from engine.backends import Backend
from engine.backends.base import Claim, JobQueue
from engine.backends.database_queue import DatabaseQueue
from engine.backends.postgres import queue as postgres_queue
from engine.backends.postgres.queue import PostgresQueue
from engine.backends.sqlite import queue as sqlite_queue

from .builders import QUEUE, after, job_and_run

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("database_kind", ["sqlite", "postgres"], indirect=True),
]

LONG = 30.0


@pytest.fixture
def queue(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> JobQueue:
    """The database's own queue, which looks again only when the test makes it."""
    queue = backend.queue(None)
    monkeypatch.setattr(queue, "poll_s", LONG, raising=False)  # SQLite's usual look
    monkeypatch.setattr(postgres_queue, "LOOK_ANYWAY_S", LONG)  # PostgreSQL's
    monkeypatch.setattr(postgres_queue, "LOOK_UNHEARD_S", LONG)
    return queue


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The queues each claim statement (PostgreSQL) or transaction (SQLite) looked in."""
    looked: list[str] = []
    sqlite_claim = sqlite_queue._claim
    postgres_claim = PostgresQueue._claim

    def on_sqlite(conn: object, queue: str, *args: object, **kwargs: object) -> object:
        looked.append(queue)
        return sqlite_claim(conn, queue, *args, **kwargs)  # type: ignore[arg-type]

    async def on_postgres(conn: object, statement: str, queue: str, *args: object) -> object:
        looked.append(queue)
        return await postgres_claim(conn, statement, queue, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlite_queue, "_claim", on_sqlite)
    monkeypatch.setattr(PostgresQueue, "_claim", staticmethod(on_postgres))
    return looked


async def add_one(queue: JobQueue, **fields: object) -> str:
    job, run = job_and_run(**fields)  # type: ignore[arg-type]
    await queue.add([job], [run])
    return job.id


async def claim_asleep_until(
    queue: JobQueue, waking: Callable[[], Awaitable[str]]
) -> tuple[list[Claim], str]:
    """A claim on QUEUE, asleep (it would look for itself only after LONG), then `waking()`,
    which adds a job somewhere: what the claim returned, and the job `waking` added."""
    claimed: list[Claim] = []

    async def claim() -> None:
        claimed.extend(await queue.claim(QUEUE, 1, "w1", LONG, timeout=LONG))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(claim)
            await all_tasks_blocked()
            added = await waking()
    return claimed, added


async def test_a_claim_after_one_that_took_all_waits_for_an_add_before_it_looks(
    queue: JobQueue, looks: list[str]
) -> None:
    first = await add_one(queue)
    [claim] = await queue.claim(QUEUE, 1, "w1", LONG, timeout=LONG)  # asked 4, got 1: all
    assert claim.job.id == first and len(looks) == 1

    async def add_second() -> str:
        assert len(looks) == 1  # nothing added since: no transaction to find nothing
        return await add_one(queue)

    claimed, second = await claim_asleep_until(queue, add_second)
    assert [c.job.id for c in claimed] == [second]
    # One look for the job added; none where the add hands its job to the sleeping claim.
    assert len(looks) == (1 if isinstance(queue, DatabaseQueue) and queue.hands_off else 2)


async def test_a_claim_after_one_that_took_all_looks_when_a_delayed_job_falls_due(
    queue: JobQueue, looks: list[str]
) -> None:
    await add_one(queue)
    delayed = await add_one(queue, run_at=after(0.3))
    await queue.claim(QUEUE, 1, "w1", LONG, timeout=LONG)
    started = time.monotonic()
    with anyio.fail_after(10):
        claims = await queue.claim(QUEUE, 1, "w1", LONG, timeout=LONG)
    assert [c.job.id for c in claims] == [delayed]
    assert time.monotonic() - started < 5  # when it fell due, not at the next look (30 s)


async def test_a_claim_that_does_not_wait_looks_at_once(
    queue: JobQueue, other_backend: Backend, looks: list[str]
) -> None:
    await add_one(queue)
    await queue.claim(QUEUE, 1, "w1", LONG, timeout=LONG)
    # Another process adds a job: nothing here is told, but a claim that will not wait looks.
    later = await add_one(other_backend.queue(None))
    claims = await queue.claim(QUEUE, 1, "w1", LONG)
    assert [c.job.id for c in claims] == [later]


async def test_a_claim_that_found_nothing_and_ran_out_of_time_leaves_the_next_one_waiting(
    queue: JobQueue, looks: list[str]
) -> None:
    # A worker's claim loop claims again as soon as a claim times out: each of those claims
    # looked before (twice: at its start and at its end), so an engine serving 200 idle
    # workflows asked the database 1,600 times a second for nothing.
    for _ in range(3):
        assert await queue.claim(QUEUE, 1, "w1", LONG, timeout=0.05) == []
    assert looks == [QUEUE]  # the first look found nothing; nothing could have changed since
    # Until something does: a job added here wakes the claim asleep where the last one left.
    added = await add_one(queue)
    with anyio.fail_after(10):
        claims = await queue.claim(QUEUE, 1, "w1", LONG, timeout=LONG)
    assert [c.job.id for c in claims] == [added]


async def test_a_claim_asleep_hears_of_a_job_another_process_added(
    queue: JobQueue, other_backend: Backend, looks: list[str]
) -> None:
    # PostgreSQL's claims hear a NOTIFY; SQLite's are woken when the file's data_version moves
    # (another connection committed). Neither looks for itself before LONG here.
    assert await queue.claim(QUEUE, 1, "w1", LONG, timeout=0.05) == []
    claimed, later = await claim_asleep_until(queue, lambda: add_one(other_backend.queue(None)))
    assert [c.job.id for c in claimed] == [later]


async def test_a_claim_asleep_takes_a_job_whose_lease_ran_out_when_it_does(
    queue: JobQueue, other_backend: Backend, looks: list[str]
) -> None:
    # Another worker took the job and died: nobody announces that its lease ran out, so the
    # claim asleep on the queue wakes for it when it falls due, not at its next usual look.
    job = await add_one(other_backend.queue(None))
    [lost] = await other_backend.queue(None).claim(QUEUE, 1, "dead", 0.5, timeout=LONG)
    assert lost.job.id == job
    started = time.monotonic()
    with anyio.fail_after(10):
        claims = await queue.claim(QUEUE, 1, "w1", LONG, timeout=LONG)
    assert [(c.job.id, c.taken_from) for c in claims] == [(job, "dead")]
    assert time.monotonic() - started < 5  # when the lease ran out, not at the next look (30 s)
