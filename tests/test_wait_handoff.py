"""wait_for_job's hand-off: a settle made in this process tells the job's waiters once it is
committed, with the run it ended with if the fence let it land, and without (so they read the
job again) if it was refused. A waiter must never be handed a run whose transition did not
land: here a worker whose lease ran out settles after another worker took its job over."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from engine.backends import Backend, open_backend
from engine.events import EventBus
from engine.ledger import Ledger, make_job, make_run
from engine.models import JobState, RunStatus
from engine.records import copy_run

pytestmark = pytest.mark.anyio

SHORT = 0.05  # a lease that runs out once outlived


@pytest.fixture(params=["memory", "sqlite"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async with open_backend(None if request.param == "memory" else tmp_path / "blok.db") as db:
        yield db


async def test_a_settle_the_fence_refused_hands_waiters_no_run(backend: Backend) -> None:
    ledger = Ledger(backend, EventBus())
    queue = backend.queue(None)
    job = make_job(
        queue="q",
        workflow_name="w",
        payload={"n": 1},
        headers=None,
        priority=0,
        run_at=None,
        max_retries=0,
    )
    run = make_run(job, workflow_version="v1")
    await ledger.add(queue, [job], [run])
    [stale] = await queue.claim("q", 1, "w1", SHORT)
    await anyio.sleep(SHORT + 0.02)  # outlive the lease
    [holder] = await queue.claim("q", 1, "w2", 30.0)
    assert holder.job.epoch > stale.job.epoch

    waiter = ledger.job_waiter(job.id)
    late = copy_run(run)
    ledger.complete(stale, queue, late, "late")  # the first worker, back after its lease
    with anyio.fail_after(5):
        await waiter.event.wait()
    assert waiter.run is None  # refused: nothing handed over, the waiter reads again
    found = await queue.get_job(job.id)
    assert found is not None and (found.state, found.worker) == (JobState.ACTIVE, "w2")

    waiter = ledger.job_waiter(job.id)
    mine = copy_run(run)
    ledger.complete(holder, queue, mine, "mine")
    with anyio.fail_after(5):
        await waiter.event.wait()
    assert waiter.run is mine
    stored = await backend.runs.get_run(run.id)
    assert stored is not None
    assert (stored.status, stored.output) == (RunStatus.COMPLETED, "mine")
    assert waiter.run.model_dump() == stored.model_dump()
