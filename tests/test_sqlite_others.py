"""How a SQLite engine hears what other processes commit to its file: by asking the file's
data_version, every 50 ms while nothing here is waiting for them (what an idle engine costs,
next to a busy process too), every 5 ms while a job is awaited here or another process's jobs
keep waking this one's claims. A producer in one process and a worker in another heard each
other only every 50 ms: a job's round trip took 50 ms (19 jobs/s one at a time).

What the engine does is seen, not timed: the sleeps between its looks are recorded. Two engines
on one file are two processes to each other (each has its own connections)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from backends.builders import a_run
from support import Sleep, record_sleeps, until

import engine.backends.sqlite as sqlite_backend
from engine import Engine, RunStatus, Step, WorkerTrigger, Workflow
from engine.backends import Backend
from engine.backends.base import Pace
from engine.backends.sqlite import OTHERS_BUSY_POLL_S, OTHERS_POLL_S

pytestmark = pytest.mark.anyio


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[Sleep]:
    """Every sleep of a SQLite backend's own code (its looks at the file, its paced waits)."""
    slept = record_sleeps(monkeypatch, sqlite_backend)
    monkeypatch.setattr(sqlite_backend, "OTHERS_BUSY_S", 0.3)  # back to idle sooner
    return slept


def looks(sleeps: list[Sleep], backend: Backend, since: int = 0) -> list[float]:
    """The waits between `backend`'s looks at the file's data_version, from `since` on."""
    return [s.seconds for s in sleeps[since:] if s.backend is backend and s.where == "_hear_others"]


GATE: dict[str, anyio.Event] = {}


async def gated(ctx: Any) -> int:
    await GATE["job"].wait()
    return 1


async def test_an_engine_looks_often_only_while_another_process_works_for_it(
    tmp_path: Path, sleeps: list[Sleep]
) -> None:
    workflow = Workflow(
        name="gated",
        trigger=WorkerTrigger(queue="gated", provider="sqlite"),
        steps=[Step("gated", gated)],
    )
    gate = GATE["job"] = anyio.Event()
    database = tmp_path / "blok.db"
    async with (
        Engine(workflows=[workflow], database=database) as worker,
        Engine(database=database) as producer,
    ):
        # Nothing awaited, nothing coming: both look every OTHERS_POLL_S.
        await until(lambda: len(looks(sleeps, producer.backend)) >= 3)
        await until(lambda: len(looks(sleeps, worker.backend)) >= 3)
        assert set(looks(sleeps, producer.backend) + looks(sleeps, worker.backend)) == {
            OTHERS_POLL_S
        }
        job_id = await producer.enqueue("gated", {})
        mark = len(sleeps)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:

                async def wait() -> None:
                    run = await producer.wait_for_job(job_id)
                    assert run.status is RunStatus.COMPLETED

                group.start_soon(wait)
                # The worker heard the job (it woke its claim): it looks often for a while.
                await until(lambda: OTHERS_BUSY_POLL_S in looks(sleeps, worker.backend, mark))
                # The producer awaits the job's end: it looks often until it hears it.
                await until(lambda: OTHERS_BUSY_POLL_S in looks(sleeps, producer.backend, mark))
                gate.set()
        # Nothing awaited, nothing came for a while: back to OTHERS_POLL_S, both.
        mark = len(sleeps)
        await until(lambda: looks(sleeps, producer.backend, mark)[-2:] == [OTHERS_POLL_S] * 2)
        await until(lambda: looks(sleeps, worker.backend, mark)[-2:] == [OTHERS_POLL_S] * 2)


async def test_a_reader_with_a_pace_is_told_at_most_every_poll_and_one_without_at_once(
    tmp_path: Path, sleeps: list[Sleep]
) -> None:
    """A worker's follow loop and a console's feed read all that changed at each change: at
    most every OTHERS_POLL_S, as when the engine looked no more often than that."""
    database = tmp_path / "blok.db"
    async with Engine(database=database) as engine, Engine(database=database) as other:
        backend = engine.backend
        stale = await backend.change_token()
        other.backend.runs.save_run(a_run())  # another process commits
        await other.backend.runs.flush()

        async def moved() -> bool:
            return await backend.change_token() != stale

        await until(moved)
        feed, mine = Pace(), Pace()
        assert await backend.wait_for_change(stale, 5, feed) != stale
        assert await backend.wait_for_change(stale, 5, feed) != stale  # told again: held back
        assert await backend.wait_for_change(stale, 5, mine) != stale  # its own pace
        assert await backend.wait_for_change(stale, 5) != stale  # a job's wait
        held = [s for s in sleeps if s.where == "wait_for_change" and s.pace in (feed, mine)]
        assert [s.pace for s in held] == [feed] and 0 < held[0].seconds <= OTHERS_POLL_S
