"""A worker serving jobs that come one at a time asks the database once a job: no claim that
finds nothing after each (a write transaction on SQLite, a round trip on PostgreSQL). A slot's
end tells its claim loop, not the queue's waiting claim; a claim after one that took all there
was waits to be told of more (engine/worker.py, engine/backends/*/queue.py)."""

from __future__ import annotations

import pytest
from support import durable_database, provider_of

from engine import Engine, Step, WorkerTrigger, Workflow
from engine.backends.postgres import queue as postgres_queue
from engine.backends.postgres.queue import PostgresQueue
from engine.backends.sqlite import queue as sqlite_queue
from engine.backends.sqlite.queue import SqliteQueue

pytestmark = pytest.mark.anyio

database = durable_database  # the fixture: each DURABLE database in turn (tests/support.py)

JOBS = 20


async def echo(ctx) -> int:
    return int(ctx.body["i"])


@pytest.fixture
def empty_claims(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per claim that found nothing; the usual looks (every few seconds) pushed out
    of the test's way."""
    monkeypatch.setattr(SqliteQueue.__init__, "__defaults__", (30.0,))  # poll_s
    monkeypatch.setattr(postgres_queue, "LOOK_ANYWAY_S", 30.0)
    monkeypatch.setattr(postgres_queue, "LOOK_UNHEARD_S", 30.0)
    found_nothing: list[int] = []
    sqlite_claim = sqlite_queue._claim
    postgres_claim = PostgresQueue._claim

    def on_sqlite(*args: object, **kwargs: object) -> tuple[list[object], object]:
        claims, due = sqlite_claim(*args, **kwargs)  # type: ignore[arg-type]
        if not claims:
            found_nothing.append(1)
        return claims, due

    async def on_postgres(*args: object) -> tuple[list[object], object]:
        rows, due = await postgres_claim(*args)  # type: ignore[arg-type]
        if not rows:
            found_nothing.append(1)
        return rows, due

    monkeypatch.setattr(sqlite_queue, "_claim", on_sqlite)
    monkeypatch.setattr(PostgresQueue, "_claim", staticmethod(on_postgres))
    return found_nothing


async def test_jobs_one_at_a_time_cost_no_claim_that_finds_nothing(
    database: str, empty_claims: list[int]
) -> None:
    trigger = WorkerTrigger(queue="one", concurrency=8, provider=provider_of(database))
    workflow = Workflow(name="one", trigger=trigger, steps=[Step("echo", echo)])
    async with Engine(workflows=[workflow], database=database) as engine:
        await engine.wait_for_job(await engine.enqueue("one", {"i": -1}), timeout=10)
        before = len(empty_claims)
        for i in range(JOBS):
            run = await engine.wait_for_job(await engine.enqueue("one", {"i": i}), timeout=10)
            assert run.output == i
        found_nothing = len(empty_claims) - before
    # None here: a claim that waits its whole time out leaves the next one waiting where it
    # left off (drained.py), but the loaded machine's claims get some slack. One or two a job
    # before the drained marks.
    assert found_nothing < JOBS // 2
