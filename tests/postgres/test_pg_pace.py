"""Who a busy PostgreSQL database's changes are paced for.

A reader of everything that changed (a worker's signals, a console's feed) that keeps coming
back to find more changes waiting is told at most every COALESCE_S, with a `Pace` of its own.
A `wait_for_job` is told at once: it was held back by a window all of a process's readers
shared, so a producer engine collecting the results of jobs another process ran got one every
50 ms (19 jobs/s, in the order it asked).

What is held back is seen, not timed: the backend's one sleep (its window) is recorded.
"""

from __future__ import annotations

import anyio
import pytest
from pg import NO_DRIVER
from support import Sleep, record_sleeps, until

asyncpg = pytest.importorskip("asyncpg", reason=NO_DRIVER)

from backends.builders import a_run

import engine.backends.postgres as pg_backend
from engine import Engine, RunStatus, Step, WorkerTrigger, Workflow
from engine.backends import Backend, open_backend
from engine.backends.base import Pace

pytestmark = pytest.mark.anyio


@pytest.fixture
def holds(monkeypatch: pytest.MonkeyPatch) -> list[Sleep]:
    """Each time a PostgreSQL backend held a reader back (its only sleep: the window)."""
    return record_sleeps(monkeypatch, pg_backend)


async def another_process_commits(backend: Backend, other: Backend) -> None:
    """`other` commits, and `backend` has heard it (its token moved)."""
    token = await backend.change_token()
    other.runs.save_run(a_run())
    await other.runs.flush()

    async def heard() -> bool:
        return await backend.change_token() != token

    await until(heard, timeout=10)


TEST_NAME = "test_each_reader_has_its_own_window_and_one_without_a_pace_has_none"


async def test_each_reader_has_its_own_window_and_one_without_a_pace_has_none(
    pg_schema: str, holds: list[Sleep]
) -> None:
    async with open_backend(pg_schema) as backend, open_backend(pg_schema) as other:
        stale = await backend.change_token()
        await another_process_commits(backend, other)
        feed, signals = Pace(), Pace()
        # The feed finds changes waiting, twice running: the second time it is held back.
        await backend.wait_for_change(stale, 5, feed)
        assert [(hold.pace, hold.reader) for hold in holds] == []
        await backend.wait_for_change(stale, 5, feed)
        assert [(hold.pace, hold.reader) for hold in holds] == [(feed, TEST_NAME)]
        # Another reader, and a job's waiter, are not held back by the feed's window.
        await backend.wait_for_change(stale, 5, signals)
        await backend.wait_for_change(stale, 5)
        await backend.wait_for_change(stale, 5)
        assert [(hold.pace, hold.reader) for hold in holds] == [(feed, TEST_NAME)]


async def echo(ctx: object) -> int:
    return 1


async def test_a_producer_collecting_results_is_not_held_back(
    pg_url: str, holds: list[Sleep]
) -> None:
    """A producer engine enqueues a batch, then waits for each job, which another engine (as
    another process would) runs: its waits find changes waiting nearly every time."""
    workflow = Workflow(
        name="echo",
        trigger=WorkerTrigger(queue="echo", concurrency=4, provider="postgres"),
        steps=[Step("echo", echo)],
    )
    async with (
        Engine(workflows=[workflow], database=pg_url) as worker,
        Engine(database=pg_url) as producer,
    ):
        assert worker.backend is not producer.backend
        ids = [await producer.enqueue("echo", {"i": i}) for i in range(30)]
        with anyio.fail_after(30):
            runs = [await producer.wait_for_job(job_id) for job_id in ids]
    assert [run.status for run in runs] == [RunStatus.COMPLETED] * 30
    # Its feed (for `events()`) may have been held back; its waits were not.
    held = [hold.reader for hold in holds if hold.backend is producer.backend]
    assert [reader for reader in held if reader.startswith("Operator.")] == []
