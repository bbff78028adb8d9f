"""Worker queues on both providers: priority, concurrency, delay, retries, dead letters, stats."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from support import expect_events

from engine import (
    Engine,
    EngineError,
    JobState,
    RunStarted,
    RunStatus,
    Step,
    UnknownJob,
    WorkerTrigger,
    Workflow,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite"])
def provider(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def database(tmp_path: Path) -> Path:
    # Both providers run over a durable store, so the run records can be checked the same way.
    return tmp_path / "blok.db"


def queue_workflow(queue: str, step: Step, **trigger: Any) -> Workflow:
    """A one-step workflow named after the queue it serves, with these trigger options."""
    return Workflow(name=queue, trigger=WorkerTrigger(queue=queue, **trigger), steps=[step])


async def test_priority_order_with_concurrency_one(provider: str, database: Path) -> None:
    order: list[int] = []

    async def record(ctx) -> None:
        order.append(ctx.body["n"])

    wf = queue_workflow("prio", Step("record", record), concurrency=1, provider=provider)
    async with Engine(workflows=[wf], database=database) as engine:
        await engine.pause("prio")
        jobs = []
        for n, priority in [(1, 0), (2, 5), (3, 0), (4, 10), (5, 5), (6, 0)]:
            jobs.append(await engine.enqueue("prio", {"n": n}, priority=priority))
        await engine.resume("prio")
        for job in jobs:
            await engine.wait_for_job(job, timeout=10)
    # Higher priority first, FIFO within a priority.
    assert order == [4, 2, 5, 1, 3, 6]


async def test_concurrency_is_never_exceeded(provider: str, database: Path) -> None:
    running = 0
    peak = 0

    async def busy(ctx) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.01)
        running -= 1

    wf = queue_workflow("wide", Step("busy", busy), concurrency=3, provider=provider)
    async with Engine(workflows=[wf], database=database) as engine:
        jobs = await engine.enqueue_many("wide", [{"i": i} for i in range(60)])
        for job in jobs:
            await engine.wait_for_job(job, timeout=20)
        stats = await engine.queue_stats("wide")
    assert peak == 3
    assert stats.completed == 60 and stats.active == 0 and stats.waiting == 0


async def test_jobs_that_never_wait_let_the_rest_of_the_engine_run_between_them(
    provider: str, database: Path
) -> None:
    # A slot runs the queue's next job in the same task; a job that never awaited anything has
    # not let the event loop go round, so the slot lets it go round before the next one (after
    # a job that did wait it need not: engine/worker.py LoopTurn).
    ticks = 0
    seen: list[int] = []

    async def eager(ctx) -> None:
        seen.append(ticks)

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.lowlevel.checkpoint()

    wf = queue_workflow("eager", Step("eager", eager), concurrency=1, provider=provider)
    async with Engine(workflows=[wf], database=database) as engine:
        await engine.pause("eager")
        jobs = await engine.enqueue_many("eager", [{"i": i} for i in range(30)])
        async with anyio.create_task_group() as group:
            group.start_soon(ticker)
            await engine.resume("eager")
            for job in jobs:
                await engine.wait_for_job(job, timeout=20)
            group.cancel_scope.cancel()
    assert len(seen) == 30
    assert all(earlier < later for earlier, later in itertools.pairwise(seen)), seen


async def test_a_slot_between_jobs_is_handed_the_next_claim_and_ends_when_its_queue_stops(
    provider: str, database: Path
) -> None:
    # Jobs that come one at a time (enqueue, then wait for it) find no job at hand when the one
    # before ends: the slot parks for the claim loop's next claim instead of ending, so every
    # job runs in the one task (engine/queue_runtime.py QueueRuntime.park), not a task started
    # for each. When the queue stops, the parked slot ends by itself: it is not left to be
    # cancelled.
    tasks: list[asyncio.Task[Any]] = []

    async def note(ctx) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.append(task)

    wf = queue_workflow("one-by-one", Step("note", note), concurrency=2, provider=provider)
    async with Engine(workflows=[wf], database=database) as engine:
        for i in range(12):
            job = await engine.enqueue("one-by-one", {"i": i})
            assert (await engine.wait_for_job(job, timeout=10)).status is RunStatus.COMPLETED
    assert len(tasks) == 12
    assert len(set(tasks)) == 1
    assert tasks[0].done() and not tasks[0].cancelled()


async def test_delay_is_respected(provider: str, database: Path) -> None:
    started: dict[str, float] = {}

    async def stamp(ctx) -> None:
        started[ctx.body["name"]] = time.monotonic()

    wf = queue_workflow("later", Step("stamp", stamp), provider=provider)
    async with Engine(workflows=[wf], database=database) as engine:
        t0 = time.monotonic()
        late = await engine.enqueue("later", {"name": "late"}, delay="400ms")
        now = await engine.enqueue("later", {"name": "now"})
        stats = await engine.queue_stats("later")
        assert stats.delayed == 1
        run = await engine.get_run((await engine.get_job(late)).run_id)
        assert run.status is RunStatus.DELAYED and run.run_at is not None
        await engine.wait_for_job(now, timeout=5)
        await engine.wait_for_job(late, timeout=5)
    assert started["now"] - t0 < 0.35
    assert started["late"] - t0 >= 0.4


async def test_retries_then_dead_letter_then_requeue(provider: str, database: Path) -> None:
    healthy = False
    attempts: list[int] = []

    async def fragile(ctx) -> str:
        attempts.append(ctx.params["attempt"])
        if not healthy:
            raise RuntimeError("downstream is down")
        return "ok"

    wf = queue_workflow(
        "fragile", Step("call", fragile), retries=2, delay="20ms", provider=provider
    )
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("fragile", {"id": 7})
        last = await engine.wait_for_job(job, timeout=10)
        assert last.status is RunStatus.FAILED
        assert attempts == [1, 2, 3]  # the first try and two retries
        runs = await engine.runs(queue="fragile")
        assert sorted(r.job_attempt for r in runs) == [1, 2, 3]
        assert all(r.status is RunStatus.FAILED and r.job_id == job for r in runs)
        stats = await engine.queue_stats("fragile")
        assert (stats.dead, stats.waiting, stats.delayed, stats.active) == (1, 0, 0, 0)
        [dead] = await engine.dead_letters("fragile")
        assert dead.id == job and dead.state is JobState.DEAD
        assert "downstream is down" in (dead.error or "")

        healthy = True
        assert await engine.requeue(job) == job
        again = await engine.wait_for_job(job, timeout=10)
        assert again.status is RunStatus.COMPLETED and again.output == "ok"
        stats = await engine.queue_stats("fragile")
        assert (stats.dead, stats.completed) == (0, 1)
        with pytest.raises(EngineError, match="only dead or failed"):
            await engine.requeue(job)
        with pytest.raises(UnknownJob):
            await engine.requeue("job_missing")


async def test_stats_are_exact(provider: str, database: Path) -> None:
    gate = anyio.Event()

    async def hold(ctx) -> None:
        if ctx.body.get("fail"):
            raise ValueError("bad")
        if ctx.body.get("hold"):
            await gate.wait()

    wf = queue_workflow("counted", Step("hold", hold), concurrency=2, provider=provider)
    async with Engine(workflows=[wf], database=database) as engine:
        done = [await engine.enqueue("counted", {}) for _ in range(3)]
        failed = await engine.enqueue("counted", {"fail": True})
        for job in [*done, failed]:
            await engine.wait_for_job(job, timeout=5)
        async with expect_events(engine, RunStarted, count=2):
            held = [await engine.enqueue("counted", {"hold": True}) for _ in range(2)]
        await engine.enqueue("counted", {})  # waits behind the two held jobs
        await engine.enqueue("counted", {}, delay="1h")
        stats = await engine.queue_stats("counted")
        # retries=0: a failed job goes to the dead-letter queue (the seed's semantics).
        assert (
            stats.waiting,
            stats.active,
            stats.completed,
            stats.failed,
            stats.delayed,
            stats.dead,
        ) == (1, 2, 3, 0, 1, 1)
        gate.set()
        for job in held:
            await engine.wait_for_job(job, timeout=5)


async def test_job_timeout_ends_timed_out_without_requeue(provider: str, database: Path) -> None:
    async def forever(ctx) -> None:
        await anyio.sleep(30)

    wf = queue_workflow(
        "bounded", Step("forever", forever), timeout="150ms", retries=3, provider=provider
    )
    async with Engine(workflows=[wf], database=database) as engine:
        run = await engine.wait_for_job(await engine.enqueue("bounded", {}), timeout=5)
        assert run.status is RunStatus.TIMED_OUT
        assert "timed out after 150ms" in (run.error or "")
        assert len(await engine.runs(queue="bounded")) == 1
        stats = await engine.queue_stats("bounded")
        assert stats.failed == 1 and stats.dead == 0


async def test_graceful_shutdown_finishes_short_jobs_and_releases_long_ones(
    tmp_path: Path,
) -> None:
    db = tmp_path / "blok.db"

    async def work(ctx) -> str:
        await anyio.sleep(ctx.body["seconds"])
        return "done"

    wf = queue_workflow("drain", Step("work", work), concurrency=2)
    async with Engine(workflows=[wf], database=db, grace_period=2) as engine:
        async with expect_events(engine, RunStarted, count=2):
            short = await engine.enqueue("drain", {"seconds": 0.1})
            long = await engine.enqueue("drain", {"seconds": 30})
        t0 = time.monotonic()
    # The grace period (2 s), not the long job's 30 s, bounds the drain.
    assert time.monotonic() - t0 < 6
    # A new worker finds the short job done and takes the long one again.
    async with Engine(workflows=[wf], database=db) as engine:
        assert (await engine.get_job(short)).state is JobState.COMPLETED
        job = await engine.get_job(long)
        assert job.state in (JobState.WAITING, JobState.ACTIVE)
        runs = await engine.runs(queue="drain")
        # A stop is not a crash: the long job's one run goes on where it stopped.
        assert not [r for r in runs if r.status is RunStatus.CRASHED]
        [interrupted] = [r for r in runs if r.job_id == long]
        interrupted = await engine.get_run(interrupted.id)
        assert any("interrupted by a stop" in line.message for line in interrupted.logs)
        await engine.cancel((await engine.get_job(long)).run_id)
