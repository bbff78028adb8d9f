"""A queue with a backlog of jobs scheduled for later (reminders a day ahead, runs asleep in a
`wait.for_`): what a claim and a keyed run's end read goes by an index that leaves them out.

A claim searched the waiting and the delayed jobs together in claim order, walking every
delayed job of the queue to find the due ones: with 100,000 a month ahead, 80 ms a claim on
SQLite and 130 ms on PostgreSQL (0.2 and 2 ms without them). The waiting jobs are now searched
in claim order (`jobs_ready`) and the delayed ones by their time (`jobs_due_at`), which also
gives the queue's next due time. Each end of a run of a keyed workflow reads the next job held
behind its key (`JobQueue.gated`): that read filtered the queue's delayed jobs by their JSON,
30 ms on SQLite and 18 ms on PostgreSQL at every such end (`benchmarks/backlog.py`); by its
own index (`jobs_gated`), under a millisecond. A queue's counts and its oldest wait read each
delayed job's row too. Here the plans each database makes for them, on a queue of 2,000
delayed jobs."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from support import durable_database, provider_of

from engine.backends import open_backend
from engine.ledger import make_job, make_run
from engine.models import utcnow

pytestmark = pytest.mark.anyio

database = durable_database  # the fixture: each DURABLE database in turn (tests/support.py)


@pytest.fixture
async def backlog(database: str) -> AsyncIterator[str]:
    """`database` with 2,000 jobs on queue `q` scheduled for later, one of them held behind
    the key `k`."""
    async with open_backend(database) as backend:
        queue = backend.queue(provider_of(database))
        later = utcnow() + timedelta(days=30)
        jobs = [
            make_job(
                queue="q",
                workflow_name="q",
                payload={"i": i},
                headers=None,
                priority=0,
                run_at=later,
                max_retries=0,
                meta={"gate": {"gate": "concurrency", "key": "k"}} if i == 0 else None,
            )
            for i in range(2000)
        ]
        await queue.add(jobs, [make_run(job, workflow_version="") for job in jobs])
        assert [job.id for job in await queue.gated("q", "k", 5)] == [jobs[0].id]
    yield database


async def plans(
    database: str, statements: dict[str, tuple[str, tuple[object, ...]]]
) -> dict[str, str]:
    """Each statement's plan, by name: SQLite's EXPLAIN QUERY PLAN; on PostgreSQL the generic
    plan the server keeps for a prepared statement after a few runs of it."""
    if provider_of(database) == "sqlite":
        with sqlite3.connect(Path(database)) as conn:
            return {
                name: " ".join(
                    str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {text}", args)
                )
                for name, (text, args) in statements.items()
            }
    from engine.backends.postgres.connect import WRITER, connect

    conn = await connect(database, WRITER)
    try:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        found = {}
        for name, (text, args) in statements.items():
            await conn.execute(f"PREPARE {name} AS {text}")
            shown = ", ".join(f"'{a}'" if isinstance(a, str) else str(a) for a in args)
            rows = await conn.fetch(f"EXPLAIN EXECUTE {name}({shown})")
            found[name] = " ".join(row[0] for row in rows)
        return found
    finally:
        await conn.close()


async def test_the_jobs_a_key_holds_are_read_by_their_own_index(backlog: str) -> None:
    if provider_of(backlog) == "sqlite":
        from engine.backends.sqlite.queue import GATED
    else:
        from engine.backends.postgres.sql import GATED
    found = await plans(backlog, {"gated": (GATED, ("q", "k", 1))})
    assert "jobs_gated" in found["gated"], found


async def test_a_claim_finds_the_due_jobs_without_walking_the_delayed_ones(backlog: str) -> None:
    if provider_of(backlog) == "sqlite":
        from engine.backends.sqlite import queue

        now = time.time()
        statements: dict[str, tuple[str, tuple[object, ...]]] = {
            "waiting": (queue.DUE, ("q", now, 4)),
            "delayed": (queue.DUE_DELAYED, ("q", now, 4, "w")),
            "next_due": (queue.NEXT_DUE, ("q", now)),
        }
    else:
        from engine.backends.postgres import sql

        statements = {"claim": (sql.CLAIM, ("q", 4, "w", 30, 1))}
    found = await plans(backlog, statements)
    every = " ".join(found.values())
    assert "jobs_due_at" in every and "jobs_ready" in every, found
    # The queue's jobs by state: every delayed one, filtered by its time.
    assert "jobs_state" not in every, found


async def test_a_queues_counts_and_oldest_wait_find_the_due_jobs_by_their_time(
    backlog: str,
) -> None:
    """`stats` read every job's row for its time (156 ms on SQLite, 88 on PostgreSQL with
    100,000 later: each refresh of the console's queues, each health check and metrics
    sample), `oldest_waiting` every delayed one's (39 ms): the due ones are found by their
    time now, the rest counted from index entries."""
    if provider_of(backlog) == "sqlite":
        from engine.backends.sqlite import queue

        now = time.time()
        statements: dict[str, tuple[str, tuple[object, ...]]] = {
            "stats": (queue.STATS, (now, "q")),
            "oldest": (queue.OLDEST_WAITING, (now, "q")),
        }
    else:
        from engine.backends.postgres import sql

        statements = {"stats": (sql.STATS, ("q",)), "oldest": (sql.OLDEST_WAITING, ("q",))}
    found = await plans(backlog, statements)
    assert "jobs_due_at" in found["stats"] and "jobs_due_at" in found["oldest"], found
    if provider_of(backlog) == "sqlite":
        # The queue's jobs of every state, each row read for its time, as it was.
        assert "USING INDEX jobs_state (queue=?)" not in found["stats"], found
