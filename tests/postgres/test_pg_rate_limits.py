"""Rate-limit windows on PostgreSQL when processes contend for one: a start that waited for
another process's counts from when it was let through, not from before it waited."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from pg import NO_DRIVER
from support import until

asyncpg = pytest.importorskip("asyncpg", reason=NO_DRIVER)

from engine.backends import open_backend
from engine.backends.postgres import sql

from .conftest import connect
from .test_pg_writer import count

pytestmark = pytest.mark.anyio


async def waits_for_the_window(url: str) -> bool:
    return bool(
        await count(
            url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE '%pg_advisory_xact_lock%'",
        )
    )


async def test_a_start_that_waited_for_the_window_counts_from_when_it_got_it(
    pg_schema: str,
) -> None:
    """Another process holds the window (as it does while it counts its own start); a start
    asked for meanwhile waits, and is recorded as starting once it got the window. Recorded
    from before it waited, it would leave the window that much early, and let the next start
    in less than a period after it began."""
    decisions: list[Any] = []
    async with open_backend(pg_schema) as backend:
        other = await connect(pg_schema)
        try:
            await other.execute("BEGIN")
            await other.execute(sql.RATE_LOCK, "wf", "*")

            async def acquire() -> None:
                decisions.append(await backend.shared.acquire_start("wf", "*", 3, 60.0, "r1"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(acquire)
                await until(lambda: waits_for_the_window(pg_schema), timeout=10)
                let_through = time.time()
                await other.execute("COMMIT")
        finally:
            await other.close()
        [(run_id, started)] = await backend.shared.recent_starts("wf", "*", 0.0)
    assert decisions[0].allowed and run_id == "r1"
    assert started >= let_through
