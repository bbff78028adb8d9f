"""An idle queue's claim waits long for jobs (engine/worker.py `CLAIM_TIMEOUT_S`), so that an
engine serving many idle workflows goes round their claim loops rarely; what the claim loop
must hear meanwhile reaches it at once (`QueueRuntime.poke`): a stop, a resume. Here the
claim's wait is WAIT_S, far longer than these tests allow for what they wait for."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import DATABASES, a_database, all_tasks_blocked

from engine import Engine, RunStatus, Step, WorkerTrigger, Workflow
from engine import worker as worker_module

pytestmark = pytest.mark.anyio

WAIT_S = 30.0


async def echo(ctx) -> int:
    return int(ctx.body["i"])


@pytest.fixture(params=DATABASES)
async def database(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Path | str | None]:
    monkeypatch.setattr(worker_module, "CLAIM_TIMEOUT_S", WAIT_S)
    async with a_database(request.param, tmp_path) as location:
        yield location


def workflows(n: int) -> list[Workflow]:
    return [
        Workflow(name=f"idle{k}", trigger=WorkerTrigger(queue=f"idle{k}"), steps=[Step("e", echo)])
        for k in range(n)
    ]


async def test_an_idle_engine_stops_at_once(database: Path | str | None) -> None:
    async with Engine(workflows=workflows(3), database=database) as engine:
        run = await engine.wait_for_job(await engine.enqueue("idle0", {"i": 1}), timeout=10)
        assert run.output == 1
        await all_tasks_blocked()  # every claim loop asleep in its claim
        stopping = time.monotonic()
    # A stop is not a cancellation (a claim cancelled half-way would leave jobs leased to
    # nobody), so nothing else could end those claims before WAIT_S.
    assert time.monotonic() - stopping < WAIT_S / 3


async def test_a_resumed_queue_runs_its_jobs_at_once(database: Path | str | None) -> None:
    async with Engine(workflows=workflows(1), database=database) as engine:
        await engine.pause("idle0")
        job = await engine.enqueue("idle0", {"i": 7})
        await all_tasks_blocked()  # the paused queue's claim asleep, for forced jobs
        assert (await engine.get_job(job)).state == "waiting"
        await engine.resume("idle0")
        run = await engine.wait_for_job(job, timeout=WAIT_S / 3)
    assert (run.status, run.output) == (RunStatus.COMPLETED, 7)
