"""Rate-limit windows on PostgreSQL when processes contend for one: a start that waited for
another process's counts from when it was let through, not from before it waited; and every
process counts on the server's clock, whatever its own says."""

from __future__ import annotations

import json
import sys
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


AHEAD_S = 120.0
SKEWED = f"""
import asyncio, json, sys, time

import time_machine

# This machine's clock runs two minutes ahead (time.time and datetime.now alike).
time_machine.travel(time.time() + {AHEAD_S}, tick=True).start()

from engine.backends import open_backend


async def main(url: str) -> None:
    async with open_backend(url) as backend:
        await backend.shared.forget_starts(time.time())  # as its gate does now and then
        left = await backend.shared.recent_starts("wf", "*", 0.0)
        decision = await backend.shared.acquire_start("wf", "*", 1, 60.0, "ahead")
        wait = decision.free_at - decision.decided_at
        print(json.dumps({{"left": [r for r, _ in left], "allowed": decision.allowed, "wait": wait}}))


asyncio.run(main(sys.argv[1]))
"""


async def test_a_machine_whose_clock_runs_ahead_counts_in_the_same_window(pg_schema: str) -> None:
    """One start a minute, two machines: this one starts a run; another process, whose clock
    runs two minutes ahead (as an unsynchronised machine's may), then asks for a start. The
    window is counted on the server's clock: the start is not dropped as a minute old by the
    other's clock (neither by its clean-up nor by its own start), and the other waits the
    minute the server says, not none."""
    async with open_backend(pg_schema) as backend:
        assert (await backend.shared.acquire_start("wf", "*", 1, 60.0, "here")).allowed
        done = await anyio.run_process([sys.executable, "-c", SKEWED, pg_schema])
        seen = json.loads(done.stdout)
        assert seen["left"] == ["here"], (
            "the other machine's clean-up dropped a start in its window"
        )
        assert not seen["allowed"], "a second start within the minute"
        assert 50.0 < seen["wait"] <= 60.0
        [(run_id, _)] = await backend.shared.recent_starts("wf", "*", 0.0)
    assert run_id == "here"
