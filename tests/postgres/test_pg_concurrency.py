"""What only a server with concurrent transactions can show: claimers in open transactions pass
over each other's rows, a stale write waits for a takeover in flight and then writes nothing,
the change feed does not skip a transaction that commits late, and leases and due times are
the server's clock."""

from __future__ import annotations

import time

import anyio
import pytest
from pg import NO_DRIVER
from support import until

asyncpg = pytest.importorskip("asyncpg", reason=NO_DRIVER)

from backends.builders import QUEUE, a_run, after, job_and_run, line

from engine.backends import open_backend
from engine.backends.postgres import sql
from engine.backends.rows import run_row
from engine.models import RunStatus

from .conftest import connect

pytestmark = pytest.mark.anyio

LEASE = 30.0


async def claim_rows(
    conn: asyncpg.Connection, worker: str, limit: int, lease: float = LEASE
) -> list[str]:
    rows = await conn.fetch(sql.CLAIM, QUEUE, limit, worker, lease, limit)
    return [r["id"] for r in sorted(rows, key=lambda r: (-r["priority"], r["seq"]))]


async def test_claimers_in_open_transactions_pass_over_each_others_rows(pg_schema: str) -> None:
    """The first claimer holds its batch uncommitted while the second claims: the second
    passes over those rows (does not wait for them, nor take them once the first commits)."""
    jobs = [job_and_run()[0] for _ in range(6)]
    async with open_backend(pg_schema) as backend:
        await backend.queue(None).add(jobs, [])
    first, second = await connect(pg_schema), await connect(pg_schema)
    try:
        async with first.transaction():
            mine = await claim_rows(first, "w1", 3)
            with anyio.fail_after(5):
                async with second.transaction():
                    theirs = await claim_rows(second, "w2", 10)
        assert mine == [job.id for job in jobs[:3]]
        assert theirs == [job.id for job in jobs[3:]]
    finally:
        await first.close()
        await second.close()


async def test_four_processes_claiming_take_every_job_once(pg_schema: str) -> None:
    jobs = [job_and_run()[0] for _ in range(400)]
    taken: list[str] = []
    async with open_backend(pg_schema) as producer:
        await producer.queue(None).add(jobs, [])

    async def process(worker: str) -> None:
        async with open_backend(pg_schema) as backend:
            queue = backend.queue(None)
            while claims := await queue.claim(QUEUE, 7, worker, LEASE):
                taken.extend(c.job.id for c in claims)
            while (claim := queue.claim_nowait(QUEUE, worker, LEASE)) is not None:
                taken.append(claim.job.id)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for n in range(4):
                tg.start_soon(process, f"w{n}")
    assert sorted(taken) == sorted(job.id for job in jobs)


async def test_a_stale_write_waits_for_a_takeover_in_flight_then_writes_nothing(
    pg_schema: str,
) -> None:
    """A takeover that has not committed yet must not let the old holder's write slip in
    before it: the fence reads the epoch FOR SHARE, so the write waits, then sees the new
    epoch and lands nowhere."""
    job, run = job_and_run()
    async with open_backend(pg_schema) as stale, open_backend(pg_schema) as observer:
        queue = stale.queue(None)
        await queue.add([job], [run])
        [claim] = await queue.claim(QUEUE, 1, "w1", 0.2)  # a lease that soon runs out
        run.status = RunStatus.RUNNING
        queue.record(run, claim.fence)
        await stale.runs.flush()
        await anyio.sleep(0.3)
        taker = await connect(pg_schema)
        try:
            await taker.execute("BEGIN")
            assert await claim_rows(taker, "w2", 1) == [job.id]  # not committed yet
            run.status = RunStatus.COMPLETED
            queue.record(run, claim.fence)
            queue.record_log(run.id, line("late"), claim.fence)
            flushed = anyio.Event()

            async def flush() -> None:
                await stale.runs.flush()
                flushed.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(flush)
                # The late write is blocked on the job's row (the server's own view).
                # (The server has no event to await for it: polled, bounded.)
                await until(
                    lambda: taker.fetchval(
                        "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type"
                        " = 'Lock' AND application_name LIKE 'blok-tui %/writer%'"
                        " AND datname = current_database()"
                    )
                )
                assert not flushed.is_set()
                await taker.execute("COMMIT")
                with anyio.fail_after(10):
                    await flushed.wait()
            stored = await observer.runs.get_run(run.id)
            assert stored is not None and stored.status is RunStatus.RUNNING
            assert stored.logs == []
            held = await observer.queue(None).get_job(job.id)
            assert held is not None and (held.worker, held.epoch) == ("w2", claim.job.epoch + 1)
        finally:
            await taker.close()


async def test_the_feed_does_not_skip_a_transaction_that_commits_late(pg_schema: str) -> None:
    """A run written by a transaction still open when a later one commits comes with a later
    page, once it has committed: never skipped, each change read once."""
    early, late = a_run(), a_run()
    async with open_backend(pg_schema) as reader, open_backend(pg_schema) as writer:
        cursor = await reader.runs.feed_cursor()
        slow = await connect(pg_schema)
        try:
            async with slow.transaction():
                await slow.execute(sql.UPSERT_RUN, *run_row(early), None, None)
                writer.runs.save_run(late)
                await writer.runs.flush()
                page = await reader.runs.feed(cursor)
                # `late` committed, `early` not: the feed holds back rather than pass it by.
                assert [r.id for r in page.runs] == []
                cursor = page.cursor
            seen: list[str] = []
            with anyio.fail_after(10):
                while len(seen) < 2:
                    page = await reader.runs.feed(cursor)
                    cursor = page.cursor
                    seen += [r.id for r in page.runs]
                    await anyio.sleep(0.01)
            assert sorted(seen) == sorted([early.id, late.id])
            assert (await reader.runs.feed(cursor)).runs == []
        finally:
            await slow.close()


async def test_a_reader_sees_its_own_processes_writes_in_the_feed(pg_schema: str) -> None:
    """Another transaction open on the server holds the horizon back; a feed read waits a
    little for this process's own committed writes rather than return without them."""
    run = a_run()
    async with open_backend(pg_schema) as backend:
        cursor = await backend.runs.feed_cursor()
        other = await connect(pg_schema)
        try:
            tx = other.transaction()
            await tx.start()
            await other.execute("SELECT pg_current_xact_id()")  # holds an xid, below ours
            backend.runs.save_run(run)
            await backend.runs.flush()

            async def end_soon() -> None:
                await anyio.sleep(0.3)
                await tx.commit()

            async with anyio.create_task_group() as tg:
                tg.start_soon(end_soon)
                page = await backend.runs.feed(cursor)
            assert [r.id for r in page.runs] == [run.id]
        finally:
            await other.close()


async def test_leases_and_due_times_are_the_servers_clock(pg_schema: str) -> None:
    delayed, _ = job_and_run(run_at=after(3600))
    due, _ = job_and_run(run_at=after(-1))
    async with open_backend(pg_schema) as backend:
        queue = backend.queue(None)
        await queue.add([delayed, due], [])
        [claim] = await queue.claim(QUEUE, 5, "w1", LEASE)
        assert claim.job.id == due.id
        conn = await connect(pg_schema)
        try:
            server_now = await conn.fetchval(f"SELECT {sql.NOW}")
            lease_until = await conn.fetchval("SELECT lease_until FROM jobs WHERE id = $1", due.id)
            assert lease_until == pytest.approx(server_now + LEASE, abs=5)
            assert await conn.fetchval(sql.NEXT_DUE, QUEUE) == pytest.approx(LEASE, abs=5)
        finally:
            await conn.close()
        assert claim.lease_lost(time.monotonic()) is False
        assert (await queue.stats(QUEUE)).delayed == 1
