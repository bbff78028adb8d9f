"""An unhandled error takes the engine down: its in-flight runs are recorded as crashed first,
and their jobs run again on the next boot."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from support import expect_events

from engine import Engine, JobState, Step, StepStarted, WorkerTrigger, Workflow

pytestmark = pytest.mark.anyio


async def nap(ctx) -> str:
    await anyio.sleep(ctx.body["seconds"])
    return "rested"


WORKFLOW = Workflow(name="naps", trigger=WorkerTrigger(queue="naps"), steps=[Step("nap", nap)])


async def crashed_then_redelivered(db: Path, job: str, says: str) -> None:
    async with Engine(workflows=[WORKFLOW], database=db) as engine:
        [listed] = await engine.runs(status="crashed")
        crashed = await engine.get_run(listed.id)
        assert crashed.job_id == job
        assert says in (crashed.error or "")
        # The status says crashed: the error does not again ("crashed: crashed: …" in `show`).
        assert not (crashed.error or "").startswith("crashed"), crashed.error
        assert crashed.step("nap").status == "failed"
        # Its engine's doing, not the job's: the redelivery is one more in its budget (`show`
        # read "delivery 2 of 1" of a job with no retries).
        redelivered = await engine.get_job(job)
        assert [redelivered.max_retries, redelivered.delivery_budget] == [0, 2]
        await engine.cancel((await engine.get_job(job)).run_id)  # the redelivered run
        assert (await engine.get_job(job)).state is JobState.CANCELLED
        assert len(await engine.runs(queue="naps")) == 2


async def test_an_error_in_the_body_crashes_the_runs_in_flight(tmp_path: Path) -> None:
    db = tmp_path / "blok.db"
    with pytest.raises(RuntimeError, match="the app broke"):
        async with Engine(workflows=[WORKFLOW], database=db) as engine:
            async with expect_events(engine, StepStarted):  # mid-step
                job = await engine.enqueue("naps", {"seconds": 30})
            raise RuntimeError("the app broke")
    await crashed_then_redelivered(db, job, "unhandled error: RuntimeError: the app broke")


async def test_a_failing_engine_task_crashes_the_runs_in_flight(tmp_path: Path) -> None:
    db = tmp_path / "blok.db"

    async def janitor_bug() -> None:
        raise LookupError("the janitor tripped")

    with pytest.raises(BaseExceptionGroup) as raised:
        async with Engine(workflows=[WORKFLOW], database=db) as engine:
            async with expect_events(engine, StepStarted):  # mid-step
                job = await engine.enqueue("naps", {"seconds": 30})
            assert engine._tg is not None
            engine._tg.start_soon(engine._guard(janitor_bug))  # as the engine starts its tasks
            await anyio.sleep_forever()
    assert raised.group_contains(LookupError)
    run = None
    async with Engine(workflows=[WORKFLOW], database=db, consume=False) as engine:
        [run] = await engine.runs(status="crashed")
    assert "LookupError: the janitor tripped" in (run.error or "")
    await crashed_then_redelivered(db, job, "the janitor tripped")
