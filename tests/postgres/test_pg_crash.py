"""The crash path on PostgreSQL (tests/test_unhandled_errors.py's scenarios): an unhandled error
takes the engine down, its in-flight runs are recorded crashed first (`flush_now`, from the
dying process), and their jobs run again on the next boot."""

from __future__ import annotations

import anyio
import pytest
from pg import NO_DRIVER
from support import expect_events

pytest.importorskip("asyncpg", reason=NO_DRIVER)

from test_unhandled_errors import WORKFLOW, crashed_then_redelivered

from engine import Engine, StepStarted

pytestmark = pytest.mark.anyio


async def test_an_error_in_the_body_crashes_the_runs_in_flight(pg_url: str) -> None:
    with pytest.raises(RuntimeError, match="the app broke"):
        async with Engine(workflows=[WORKFLOW], database=pg_url) as engine:
            async with expect_events(engine, StepStarted):  # mid-step
                job = await engine.enqueue("naps", {"seconds": 30})
            raise RuntimeError("the app broke")
    await crashed_then_redelivered(pg_url, job, "unhandled error: RuntimeError: the app broke")  # type: ignore[arg-type]


async def test_a_failing_engine_task_crashes_the_runs_in_flight(pg_url: str) -> None:
    async def janitor_bug() -> None:
        raise LookupError("the janitor tripped")

    with pytest.raises(BaseExceptionGroup) as raised:
        async with Engine(workflows=[WORKFLOW], database=pg_url) as engine:
            async with expect_events(engine, StepStarted):  # mid-step
                job = await engine.enqueue("naps", {"seconds": 30})
            assert engine._tg is not None
            engine._tg.start_soon(engine._guard(janitor_bug))  # as the engine starts its tasks
            await anyio.sleep_forever()
    assert raised.group_contains(LookupError)
    async with Engine(workflows=[WORKFLOW], database=pg_url, consume=False) as engine:
        [run] = await engine.runs(status="crashed")
    assert "LookupError: the janitor tripped" in (run.error or "")
    await crashed_then_redelivered(pg_url, job, "the janitor tripped")  # type: ignore[arg-type]
