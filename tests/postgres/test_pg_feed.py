"""The change feed's horizon on a server shared with other databases.

Transaction ids are the server's, not one database's: a transaction that writes in another
database on the same server is in every snapshot's list of running transactions. The feed must
not wait for it (it cannot write blok's tables), and must still wait for one in its own
database (its rows would land below a horizon already passed).
"""

from __future__ import annotations

import anyio
import pytest
from pg import NO_DRIVER, fresh_database

asyncpg = pytest.importorskip("asyncpg", reason=NO_DRIVER)

from backends.builders import a_run

from engine.backends import open_backend

from .conftest import connect

pytestmark = pytest.mark.anyio


async def open_write(url: str) -> asyncpg.Connection:
    """A connection on `url` inside a transaction that has written (so it holds an xid)."""
    conn = await connect(url)
    await conn.execute("BEGIN")
    await conn.fetchval("SELECT pg_current_xact_id()")
    return conn


async def test_a_write_open_in_another_database_does_not_hold_the_feed_back(pg_url: str) -> None:
    async with (
        fresh_database() as elsewhere,
        open_backend(pg_url) as writer,
        open_backend(pg_url) as reader,
    ):
        cursor = await reader.runs.feed_cursor()
        other = await open_write(elsewhere)  # older than the run's write, never committed
        try:
            run = a_run()
            writer.runs.save_run(run)
            await writer.runs.flush()
            with anyio.fail_after(5):
                page = await reader.runs.feed(cursor)
            assert [r.id for r in page.runs] == [run.id]
        finally:
            await other.close()


async def test_a_write_open_in_this_database_holds_the_feed_back_until_it_ends(
    pg_url: str,
) -> None:
    async with open_backend(pg_url) as writer, open_backend(pg_url) as reader:
        cursor = await reader.runs.feed_cursor()
        open_here = await open_write(pg_url)
        try:
            late = a_run()
            await open_here.execute(
                "INSERT INTO runs (id, workflow_name, workflow_version, queue, job_id, status,"
                " created_at, xid) VALUES ($1, 'w', 'v1', 'q', 'job_late', 'queued', 0,"
                " pg_current_xact_id()::text::bigint)",
                late.id,
            )
            run = a_run()
            writer.runs.save_run(run)
            await writer.runs.flush()
            with anyio.fail_after(5):
                page = await reader.runs.feed(cursor)
            # The open transaction is older than the run's write: the horizon stops below it,
            # or its row, committed later, would fall behind a reader that moved on.
            assert page.runs == []
            await open_here.execute("COMMIT")
            with anyio.fail_after(5):
                page = await reader.runs.feed(page.cursor)
            assert sorted(r.id for r in page.runs) == sorted([late.id, run.id])
        finally:
            await open_here.close()


async def test_a_cursor_moves_only_when_this_database_changes(pg_url: str) -> None:
    """The horizon moves with every transaction on the server; a reader's cursor must not, or
    two readers of the same changes disagree on where they are (and a CI run with another
    database busy beside it saw the cursor one off)."""
    async with fresh_database() as elsewhere, open_backend(pg_url) as backend:
        backend.runs.save_run(a_run())
        await backend.runs.flush()
        cursor = await backend.runs.feed_cursor()
        other = await connect(elsewhere)
        try:
            for _ in range(3):  # transactions that end in another database
                await other.fetchval("SELECT pg_current_xact_id()")
        finally:
            await other.close()
        page = await backend.runs.feed(cursor)
        assert (page.runs, page.logs, page.cursor) == ([], [], cursor)
        assert await backend.runs.feed_cursor() == cursor
        run = a_run()
        backend.runs.save_run(run)
        await backend.runs.flush()
        page = await backend.runs.feed(cursor)
        assert [r.id for r in page.runs] == [run.id]
        assert page.cursor.rev > cursor.rev
        assert await backend.runs.feed_cursor() == page.cursor
