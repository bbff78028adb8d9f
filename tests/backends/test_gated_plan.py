"""The jobs a concurrency key holds back are read from an index of their own.

Each end of a run of a keyed workflow reads the next job held behind its key (`JobQueue.gated`).
That read filtered the queue's delayed jobs by their JSON: with 100,000 jobs scheduled for
later on the queue it took 30 ms on SQLite and 18 ms on PostgreSQL, at every such end
(`benchmarks/gated_read.py`); by its index, under a millisecond. Here the plan
each database makes for it, on a queue of delayed jobs no key holds."""

from __future__ import annotations

import sqlite3
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


async def test_the_jobs_a_key_holds_are_read_by_their_own_index(backlog: str) -> None:
    if provider_of(backlog) == "sqlite":
        from engine.backends.sqlite.queue import GATED

        with sqlite3.connect(Path(backlog)) as conn:
            plan = " ".join(
                str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {GATED}", ("q", "k", 1))
            )
    else:
        from engine.backends.postgres.connect import WRITER, connect
        from engine.backends.postgres.sql import GATED as PG_GATED

        conn = await connect(backlog, WRITER)
        try:
            # The plan the server keeps for a prepared statement after a few runs of it.
            await conn.execute("SET plan_cache_mode = force_generic_plan")
            await conn.execute(f"PREPARE gated AS {PG_GATED}")
            rows = await conn.fetch("EXPLAIN EXECUTE gated('q', 'k', 1)")
            plan = " ".join(row[0] for row in rows)
        finally:
            await conn.close()
    assert "jobs_gated" in plan, plan
