"""Fencing against a real server: a write that names a stale epoch lands nowhere, even when the
takeover is still in flight; job transitions move the epoch; the leader lease; the change feed."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio
import pytest
from pg import NO_DRIVER

asyncpg = pytest.importorskip("asyncpg", reason=NO_DRIVER)

from engine.backends.postgres import sql

from .rows import attempt, job, run, step

pytestmark = pytest.mark.anyio


async def held_job(conn: asyncpg.Connection, job_id: str = "j1", worker: str = "w1") -> int:
    """Enqueue and claim a job; return the epoch its worker holds."""
    await conn.execute(sql.INSERT_JOB, *job(job_id))
    [claimed] = await conn.fetch(sql.CLAIM, "q", 1, worker, 30.0)
    return int(claimed["epoch"])


async def write_records(conn: asyncpg.Connection, epoch: int, status: str) -> None:
    await conn.execute(sql.UPSERT_RUN, *run("r1", "j1", status=status), "j1", epoch)
    await conn.execute(sql.UPSERT_STEP, *step("r1", 0, status=status), "j1", epoch)
    await conn.execute(sql.UPSERT_ATTEMPT, *attempt("r1", 0, 1, status=status), "j1", epoch)
    await conn.execute(sql.INSERT_LOG, "r1", 0, time.time(), "INFO", status, "j1", epoch)


async def records(conn: asyncpg.Connection) -> list[str | None]:
    return [
        await conn.fetchval("SELECT status FROM runs WHERE id = 'r1'"),
        await conn.fetchval("SELECT status FROM steps WHERE run_id = 'r1'"),
        await conn.fetchval("SELECT status FROM attempts WHERE run_id = 'r1'"),
        await conn.fetchval("SELECT string_agg(message, ',' ORDER BY id) FROM logs"),
    ]


async def test_the_holders_epoch_writes_and_rewrites(pg_schema: str) -> None:
    conn = await asyncpg.connect(pg_schema)
    try:
        epoch = await held_job(conn)
        await write_records(conn, epoch, "running")
        await write_records(conn, epoch, "completed")
        assert await records(conn) == ["completed"] * 3 + ["running,completed"]
    finally:
        await conn.close()


async def test_a_stale_epoch_writes_nothing(pg_schema: str) -> None:
    conn = await asyncpg.connect(pg_schema)
    try:
        stale = await held_job(conn)
        await write_records(conn, stale, "running")
        # The lease ran out and another worker took the job over: the epoch moved on.
        await conn.execute("UPDATE jobs SET lease_until = 0")
        [taken] = await conn.fetch(sql.CLAIM, "q", 1, "w2", 30.0)
        assert taken["epoch"] == stale + 1
        # The first worker wakes up and finishes what it had: none of it lands, new rows
        # (a step and attempt it had not written yet) included.
        await write_records(conn, stale, "completed")
        await conn.execute(sql.UPSERT_STEP, *step("r1", 1, status="completed"), "j1", stale)
        assert await records(conn) == ["running"] * 3 + ["running"]
        assert await conn.fetchval("SELECT count(*) FROM steps") == 1
        # Nor can it settle the job.
        assert (
            await conn.fetchval(sql.SETTLE_DONE, "j1", stale, "completed", None, "r1", None, None)
            is None
        )
        assert await conn.fetchval("SELECT (state, worker) FROM jobs") == ("active", "w2")
    finally:
        await conn.close()


async def test_a_stale_write_waits_for_a_takeover_in_flight_then_writes_nothing(
    pg_schema: str,
) -> None:
    """A takeover that has not committed yet must not let the old holder's write slip in
    before it: the fence reads the epoch FOR SHARE, so the write waits and then sees it."""
    setup, taker, stale_writer = [await asyncpg.connect(pg_schema) for _ in range(3)]
    try:
        stale = await held_job(setup)
        await write_records(setup, stale, "running")
        await setup.execute("UPDATE jobs SET lease_until = 0")
        writer_pid = stale_writer.get_server_pid()
        finished = anyio.Event()

        async def write_late() -> None:
            await write_records(stale_writer, stale, "completed")
            finished.set()

        async with anyio.create_task_group() as tg:
            async with taker.transaction():
                [taken] = await taker.fetch(sql.CLAIM, "q", 1, "w2", 30.0)
                tg.start_soon(write_late)
                # Wait (on the server's own view) until the late write is blocked on the row.
                # (The server has no event for it: poll, bounded.)
                with anyio.fail_after(10):
                    while True:
                        if await setup.fetchval(
                            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1",
                            writer_pid,
                        ):
                            break
                        await anyio.sleep(0.01)
                assert not finished.is_set()
            with anyio.fail_after(10):
                await finished.wait()
        assert taken["epoch"] == stale + 1
        assert await records(setup) == ["running"] * 4
    finally:
        for conn in (setup, taker, stale_writer):
            await conn.close()


async def test_transitions_move_the_epoch_and_need_the_current_one(pg_schema: str) -> None:
    conn = await asyncpg.connect(pg_schema)
    try:
        epoch = await held_job(conn)
        # A signal is a request to the holder, not a change of state: the epoch stays.
        assert await conn.fetchval(sql.SIGNAL, "j1", "retry_now") == "w1"
        [(job_id, renewed_epoch, signal)] = await conn.fetch(sql.RENEW, "w1", 30.0)
        assert (job_id, renewed_epoch) == ("j1", epoch) and "retry_now" in signal

        again = await conn.fetchval(
            sql.SETTLE_AGAIN, "j1", epoch, "delayed", time.time() + 60, "r1", True, None, None
        )
        assert again == epoch + 1
        assert await conn.fetchval("SELECT (state, worker, lease_until, signal) FROM jobs") == (
            "delayed",
            None,
            None,
            None,
        )
        # The old epoch can no longer settle it, even with the job not held by anyone.
        assert (
            await conn.fetchval(sql.SETTLE_DONE, "j1", epoch, "completed", None, "r1", None, None)
            is None
        )
        assert await conn.fetchval(sql.CANCEL_PENDING, "j1") == epoch + 2
        assert await conn.fetchval(sql.CANCEL_PENDING, "j1") is None
    finally:
        await conn.close()


async def test_one_leader_at_a_time(pg_schema: str) -> None:
    conn = await asyncpg.connect(pg_schema)
    try:
        assert await conn.fetchval(sql.ACQUIRE_LEADER, "janitor", "w1", 30.0) is not None
        assert await conn.fetchval(sql.ACQUIRE_LEADER, "janitor", "w2", 30.0) is None
        assert await conn.fetchval(sql.ACQUIRE_LEADER, "janitor", "w1", 30.0) is not None
        assert await conn.fetchval(sql.ACQUIRE_LEADER, "recovery", "w2", 30.0) is not None
        # w1 stops renewing (its last lease was already over): w2 takes the chore.
        await conn.fetchval(sql.ACQUIRE_LEADER, "janitor", "w1", -1.0)
        assert await conn.fetchval(sql.ACQUIRE_LEADER, "janitor", "w2", 30.0) is not None
        assert await conn.fetchval(sql.ACQUIRE_LEADER, "janitor", "w1", 30.0) is None
        await conn.execute(sql.RELEASE_LEADER, "janitor", "w2")
        assert await conn.fetchval(sql.ACQUIRE_LEADER, "janitor", "w1", 30.0) is not None
    finally:
        await conn.close()


async def read_until(
    read: Callable[[int], Awaitable[tuple[int, list[str]]]], horizon: int, count: int
) -> tuple[int, list[str]]:
    """Read the feed until `count` changes came. The horizon is the server's oldest running
    transaction, in any database: another client's open transaction can hold it back a while."""
    seen: list[str] = []
    with anyio.fail_after(10):
        while len(seen) < count:
            horizon, more = await read(horizon)
            seen += more
            if len(seen) < count:
                await anyio.sleep(0.01)
    return horizon, seen


async def test_the_change_feed_does_not_skip_a_late_commit(pg_schema: str) -> None:
    """A run written by a transaction that commits after a later one is still read once."""
    reader, slow, fast = [await asyncpg.connect(pg_schema) for _ in range(3)]
    try:
        for job_id in ("j1", "j2"):
            await reader.execute(sql.INSERT_JOB, *job(job_id))

        async def read(horizon: int) -> tuple[int, list[str]]:
            rows = await reader.fetch(sql.CHANGED_RUNS, horizon)
            return rows[0]["xmin"], [r["id"] for r in rows if r["id"] is not None]

        horizon, seen = await read(0)
        assert seen == []
        async with slow.transaction():
            await slow.execute(sql.UPSERT_RUN, *run("r-slow", "j1"), "j1", 0)
            await fast.execute(sql.UPSERT_RUN, *run("r-fast", "j2"), "j2", 0)
            # `fast` committed, `slow` has not: the feed holds back rather than pass `slow` by.
            horizon, seen = await read(horizon)
            assert seen == []
        horizon, seen = await read_until(read, horizon, 2)
        assert sorted(seen) == ["r-fast", "r-slow"]
        await fast.execute(sql.UPSERT_RUN, *run("r-fast", "j2", status="completed"), "j2", 0)
        horizon, seen = await read_until(read, horizon, 1)
        assert seen == ["r-fast"]
    finally:
        for conn in (reader, slow, fast):
            await conn.close()
