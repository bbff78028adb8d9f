"""The seed's semantics (issue 16), each on memory and SQLite: dead letters and their requeue,
the job's retry budget and timeout, step options, snapshots, switches, helper workflows, waits."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from engine import (
    AttemptStatus,
    Engine,
    EngineError,
    JobState,
    Retry,
    RunFilter,
    RunStatus,
    Step,
    StepStatus,
    WorkerTrigger,
    Workflow,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    return None if request.param == "memory" else tmp_path / "blok.db"


def flow(name: str, *steps: Any, **trigger: Any) -> Workflow:
    return Workflow(name=name, trigger=WorkerTrigger(queue=name, **trigger), steps=list(steps))


async def broken(ctx) -> None:
    raise RuntimeError("downstream is down")


async def runs_of(engine: Engine, job: str) -> list[Any]:
    return sorted(
        await engine.runs(queue=(await engine.get_job(job)).queue, limit=1000),
        key=lambda run: run.created_at,
    )


# ---- dead letters ------------------------------------------------------------------------------
async def test_dead_letters_carry_job_id_and_a_requeue_gives_a_fresh_budget(
    database: Path | None,
) -> None:
    wf = flow("fragile", Step("call", broken), retries=2, delay=1)
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("fragile", {})
        await engine.wait_for_job(job, timeout=10)
        dead = await engine.dead_letters("fragile")
        assert [d.job_id for d in dead] == [job]
        assert len(await runs_of(engine, job)) == 3
        assert await engine.requeue(dead[0].job_id) == job
        await engine.wait_for_job(job, timeout=10)
        # Three more runs (the first try and two retries), not one.
        assert [r.job_attempt for r in await runs_of(engine, job)] == [1, 2, 3, 1, 2, 3]
        assert (await engine.get_job(job)).state is JobState.DEAD


async def test_a_failed_job_without_retries_goes_to_the_dead_letter_queue(
    database: Path | None,
) -> None:
    wf = flow("once", Step("call", broken))  # retries=0
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("once", {})
        assert (await engine.wait_for_job(job, timeout=10)).status is RunStatus.FAILED
        assert (await engine.get_job(job)).state is JobState.DEAD
        assert [d.job_id for d in await engine.dead_letters("once")] == [job]
        stats = await engine.queue_stats("once")
        assert (stats.dead, stats.failed) == (1, 0)


async def test_a_step_timing_out_goes_through_the_job_retries_then_the_dead_letter_queue(
    database: Path | None,
) -> None:
    async def slow(ctx) -> None:
        await anyio.sleep(10)

    wf = flow("slow", Step("crawl", slow, max_duration="50ms"), retries=1, delay=1)
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("slow", {})
        last = await engine.wait_for_job(job, timeout=10)
        runs = await runs_of(engine, job)
        assert [(r.job_attempt, r.status) for r in runs] == [
            (1, RunStatus.TIMED_OUT),
            (2, RunStatus.TIMED_OUT),
        ]
        assert last.id == runs[-1].id
        assert last.step("crawl").attempts[-1].status is AttemptStatus.TIMED_OUT
        assert (await engine.get_job(job)).state is JobState.DEAD


async def test_the_jobs_own_timeout_is_final(database: Path | None) -> None:
    async def slow(ctx) -> None:
        await anyio.sleep(10)

    wf = flow("bounded", Step("crawl", slow), retries=3, timeout="100ms")
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("bounded", {})
        run = await engine.wait_for_job(job, timeout=10)
        assert run.status is RunStatus.TIMED_OUT
        assert len(await runs_of(engine, job)) == 1
        assert (await engine.get_job(job)).state is JobState.FAILED


# ---- per-job settings --------------------------------------------------------------------------
async def test_enqueue_overrides_retries_and_timeout_and_ctx_job_shows_them(
    database: Path | None,
) -> None:
    seen: list[Any] = []

    async def look(ctx) -> None:
        seen.append(ctx.job)
        if ctx.body.get("sleep"):
            await anyio.sleep(10)
        if not ctx.job.last_attempt:
            raise RuntimeError("not yet")

    wf = flow("jobs", Step("look", look), delay=1)  # the trigger: no retries, no timeout
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("jobs", {}, retries=2, delay="20ms")
        run = await engine.wait_for_job(job, timeout=10)
        assert run.status is RunStatus.COMPLETED  # the third attempt is the last: it passes
        assert [(j.attempt, j.max_retries, j.last_attempt) for j in seen] == [
            (1, 2, False),
            (2, 2, False),
            (3, 2, True),
        ]
        first = seen[0]
        assert (first.id, first.queue, first.delay_ms, first.timeout_ms) == (job, "jobs", 20, None)
        assert [j.delivery for j in seen] == [1, 2, 3]
        assert first.created_at == (await engine.get_job(job)).created_at

        seen.clear()
        timed = await engine.enqueue("jobs", {"sleep": True}, retries=3, timeout="100ms")
        run = await engine.wait_for_job(timed, timeout=10)
        assert run.status is RunStatus.TIMED_OUT
        assert "the job's timeout" in (run.error or "")
        assert [j.timeout_ms for j in seen] == [100]  # final: no retry despite retries=3
        assert (await engine.get_job(timed)).state is JobState.FAILED

        for bad in ({"retries": -1}, {"retries": 10**6}, {"timeout": "0ms"}, {"timeout": "x"}):
            with pytest.raises(EngineError):
                await engine.enqueue("jobs", {}, **bad)
        assert await engine.count_runs(RunFilter.of(queue="jobs")) == 4


async def test_a_requeue_keeps_the_jobs_own_budget(database: Path | None) -> None:
    wf = flow("own", Step("call", broken), delay=1)
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("own", {}, retries=1)
        await engine.wait_for_job(job, timeout=10)
        await engine.requeue(job)
        await engine.wait_for_job(job, timeout=10)
        assert [r.job_attempt for r in await runs_of(engine, job)] == [1, 2, 1, 2]


__all__ = ["Retry", "StepStatus", "timedelta"]
