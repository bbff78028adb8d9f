"""The claim statement against a real server: concurrent claimers, order, delays, pauses,
expired leases taken over in the same statement, renewal."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from pg import NO_DRIVER

asyncpg = pytest.importorskip("asyncpg", reason=NO_DRIVER)

from engine.backends.postgres import sql

from .rows import job

pytestmark = pytest.mark.anyio

LEASE = 30.0


@asynccontextmanager
async def connections(url: str, n: int) -> AsyncIterator[list[asyncpg.Connection]]:
    conns = [await asyncpg.connect(url) for _ in range(n)]
    try:
        yield conns
    finally:
        for conn in conns:
            await conn.close()


async def claim(
    conn: asyncpg.Connection, worker: str, limit: int = 10, queue: str = "q", lease: float = LEASE
) -> list[asyncpg.Record]:
    rows = await conn.fetch(sql.CLAIM, queue, limit, worker, lease)
    return sorted(rows, key=lambda r: (r["taken_from"] is None, -r["priority"], r["seq"]))


async def test_two_claimers_in_open_transactions_never_take_the_same_job(pg_schema: str) -> None:
    """The first claimer holds its batch uncommitted while the second claims: the second must
    pass over those rows (not wait for them, not take them again once the first commits)."""
    async with connections(pg_schema, 3) as (setup, first, second):
        await setup.executemany(sql.INSERT_JOB, [job(f"j{i}") for i in range(6)])
        async with first.transaction():
            mine = await claim(first, "w1", limit=3)
            with anyio.fail_after(5):
                async with second.transaction():
                    theirs = await claim(second, "w2", limit=10)
        assert [r["id"] for r in mine] == ["j0", "j1", "j2"]
        assert [r["id"] for r in theirs] == ["j3", "j4", "j5"]
        held = await setup.fetch("SELECT id, worker, epoch, attempts FROM jobs ORDER BY seq")
        assert [(r["worker"], r["epoch"], r["attempts"]) for r in held] == [("w1", 1, 1)] * 3 + [
            ("w2", 1, 1)
        ] * 3


async def test_eight_claimers_take_every_job_once(pg_schema: str) -> None:
    async with connections(pg_schema, 9) as (setup, *claimers):
        await setup.executemany(sql.INSERT_JOB, [job(f"j{i}") for i in range(400)])
        taken: list[str] = []

        async def claimer(conn: asyncpg.Connection, worker: str) -> None:
            while rows := await claim(conn, worker, limit=7):
                taken.extend(r["id"] for r in rows)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for n, conn in enumerate(claimers):
                    tg.start_soon(claimer, conn, f"w{n}")
        assert len(taken) == 400
        assert set(taken) == {f"j{i}" for i in range(400)}


async def test_claims_go_by_priority_then_arrival(pg_schema: str) -> None:
    async with connections(pg_schema, 1) as (conn,):
        for job_id, priority in (("a", 0), ("b", 5), ("c", 0), ("d", 5)):
            await conn.execute(sql.INSERT_JOB, *job(job_id, priority=priority))
        assert [r["id"] for r in await claim(conn, "w1", limit=3)] == ["b", "d", "a"]
        assert [r["id"] for r in await claim(conn, "w1")] == ["c"]


async def test_a_delayed_job_waits_for_the_servers_clock(pg_schema: str) -> None:
    async with connections(pg_schema, 1) as (conn,):
        now = await conn.fetchval(f"SELECT {sql.NOW}")
        await conn.execute(sql.INSERT_JOB, *job("later", run_at=now + 3600))
        await conn.execute(sql.INSERT_JOB, *job("due", run_at=now - 1))
        assert [r["id"] for r in await claim(conn, "w1")] == ["due"]
        assert await conn.fetchval(sql.NEXT_DUE, "q") == pytest.approx(3600, abs=60)


async def test_a_paused_queue_gives_only_forced_jobs(pg_schema: str) -> None:
    async with connections(pg_schema, 1) as (conn,):
        await conn.executemany(sql.INSERT_JOB, [job("a"), job("b"), job("c")])
        await conn.execute("INSERT INTO paused_queues (queue) VALUES ('q')")
        assert await claim(conn, "w1") == []
        assert await conn.fetchval(sql.FORCE_DUE, "b") == "q"
        taken = await claim(conn, "w1")
        assert [(r["id"], r["force"]) for r in taken] == [("b", False)]
        await conn.execute("DELETE FROM paused_queues")
        assert [r["id"] for r in await claim(conn, "w1")] == ["a", "c"]


async def test_an_expired_lease_is_taken_over_by_the_claim(pg_schema: str) -> None:
    async with connections(pg_schema, 2) as (one, two):
        await one.executemany(sql.INSERT_JOB, [job("stuck"), job("fresh")])
        # w1 claims `stuck` with a lease already over: it stopped renewing (died, froze).
        [first] = await claim(one, "w1", limit=1, lease=-1)
        assert (first["id"], first["epoch"], first["taken_from"]) == ("stuck", 1, None)

        taken = await claim(two, "w2", limit=10)
        assert [(r["id"], r["worker"], r["taken_from"]) for r in taken] == [
            ("stuck", "w2", "w1"),
            ("fresh", "w2", None),
        ]
        stuck = taken[0]
        assert (stuck["epoch"], stuck["attempts"], stuck["state"]) == (2, 2, "active")
        now = await two.fetchval(f"SELECT {sql.NOW}")
        assert stuck["lease_until"] == pytest.approx(now + LEASE, abs=5)


async def test_a_live_lease_is_not_taken_over(pg_schema: str) -> None:
    async with connections(pg_schema, 2) as (one, two):
        await one.execute(sql.INSERT_JOB, *job("held"))
        assert [r["id"] for r in await claim(one, "w1")] == ["held"]
        assert await claim(two, "w2") == []


async def test_renewal_returns_what_the_worker_still_holds(pg_schema: str) -> None:
    async with connections(pg_schema, 2) as (one, two):
        await one.executemany(sql.INSERT_JOB, [job("kept"), job("lost")])
        await claim(one, "w1", limit=1)
        await claim(one, "w1", limit=1, lease=-1)  # `lost`: its lease runs out...
        await claim(two, "w2")  # ...and w2 takes it over
        assert await one.fetchval(sql.SIGNAL, "kept", "cancel") == "w1"

        held = await one.fetch(sql.RENEW, "w1", LEASE)
        assert [(r["id"], r["epoch"]) for r in held] == [("kept", 1)]
        assert set(json.loads(held[0]["signal"])) == {"cancel"}
        renewed = await one.fetchval(
            "SELECT lease_until - " + sql.NOW + " FROM jobs WHERE id = 'kept'"
        )
        assert renewed == pytest.approx(LEASE, abs=5)
