"""A durable queue keeps jobs claimed ahead of its free slots, so that a slot that frees up
finds its next job at hand instead of waiting for a claim (a transaction on SQLite, a round
trip on PostgreSQL). While every slot is busy with short jobs, the worker tops what is kept
ahead up before it runs out (engine/queue_runtime.py `QueueRuntime.short_of_ahead`); behind
long jobs it does not, since another worker could run those now. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import time

import anyio
import pytest
from support import add_unserved, durable_database, provider_of, until

from engine import Engine, JobState, RunStatus, Step, WorkerTrigger, Workflow
from engine.queue_runtime import AHEAD_HORIZON_S, QueueRuntime

pytestmark = pytest.mark.anyio

database = durable_database  # the fixture: each DURABLE database in turn (tests/support.py)

QUEUE = "ahead"


def gated_workflow(database: str, gates: list[anyio.Event], started: list[int]) -> Workflow:
    """Two slots; job `i` runs until `gates[i]` is set."""

    async def gated(ctx) -> int:
        i: int = ctx.body["i"]
        started.append(i)
        await gates[i].wait()
        return i

    trigger = WorkerTrigger(queue=QUEUE, concurrency=2, provider=provider_of(database))
    return Workflow(name="ahead", trigger=trigger, steps=[Step("gated", gated)])


async def test_a_busy_queue_of_short_jobs_claims_more_ahead_before_a_slot_frees(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Short whatever this machine's pace: the two slots' last jobs count as short.
    monkeypatch.setattr("engine.queue_runtime.AHEAD_HORIZON_S", 60.0)
    gates = [anyio.Event() for _ in range(8)]
    started: list[int] = []
    async with Engine(
        workflows=[gated_workflow(database, gates, started)], database=database
    ) as engine:

        async def states(ids: list[str]) -> set[JobState]:
            return {(await engine.get_job(job_id)).state for job_id in ids}

        # One claim for two free slots takes jobs 0 and 1 for them and 2 and 3 ahead.
        first = await engine.enqueue_many(QUEUE, [{"i": i} for i in range(4)])
        await until(lambda: sorted(started) == [0, 1])
        later = await engine.enqueue_many(QUEUE, [{"i": i} for i in range(4, 8)])
        gates[0].set()
        gates[1].set()
        await until(lambda: sorted(started) == [0, 1, 2, 3])

        # Both slots are busy again and took the last jobs kept ahead: two more are claimed
        # ahead now, before either slot frees up; the rest wait for a claim of their own.
        async def topped_up() -> bool:
            return await states(later[:2]) == {JobState.ACTIVE}

        await until(topped_up)
        assert await states(later[2:]) == {JobState.WAITING}
        assert sorted(started) == [0, 1, 2, 3]

        for gate in gates:
            gate.set()
        runs = [await engine.wait_for_job(job_id, timeout=10) for job_id in first + later]
    assert [run.status for run in runs] == [RunStatus.COMPLETED] * 8
    assert sorted(started) == list(range(8))


async def test_jobs_claimed_ahead_count_as_waiting_to_every_process(database: str) -> None:
    # The console attached to the database said "running 8" for six running runs: a job
    # another process kept ahead is active in the database, but no slot runs it.
    gates = [anyio.Event() for _ in range(6)]
    started: list[int] = []

    async def counted(engine: Engine) -> tuple[int, int]:
        stats = await engine.queue_stats(QUEUE)
        return stats.active, stats.waiting

    async with Engine(database=database) as elsewhere:  # another process, as far as stats go
        queue = elsewhere.backend.queue(provider_of(database))
        ids = [job.id for job in await add_unserved(queue, QUEUE, [{"i": i} for i in range(6)])]
        flow = gated_workflow(database, gates, started)
        async with Engine(workflows=[flow], database=database) as worker:
            # Its first claim takes two jobs for its two slots, and the other four ahead.
            await until(lambda: sorted(started) == [0, 1])
            assert worker.backend.queue(provider_of(database)).ahead(QUEUE) == 4

            async def started_landed() -> bool:
                jobs = [await elsewhere.get_job(job_id) for job_id in ids[:2]]
                runs = [await elsewhere.get_run(job.run_id) for job in jobs]
                return all(run.status is RunStatus.RUNNING for run in runs)

            await until(started_landed)
            assert await counted(worker) == (2, 4)
            assert await counted(elsewhere) == (2, 4)
            for gate in gates:
                gate.set()
            for job_id in ids:
                await worker.wait_for_job(job_id, timeout=10)
        assert await counted(elsewhere) == (0, 0)


async def test_jobs_kept_ahead_behind_busy_slots_go_to_a_worker_with_free_ones(
    database: str,
) -> None:
    # A worker whose two slots hung kept the four jobs it had claimed ahead, their leases
    # renewed, for as long as the hung jobs ran (an hour), while a second worker sat idle.
    gates = [anyio.Event() for _ in range(6)]
    started: list[int] = []
    flow = gated_workflow(database, gates, started)
    async with Engine(database=database) as producer:
        queue = producer.backend.queue(provider_of(database))
        ids = [job.id for job in await add_unserved(queue, QUEUE, [{"i": i} for i in range(6)])]
        async with Engine(workflows=[flow], database=database) as first:
            await until(lambda: sorted(started) == [0, 1])
            async with Engine(workflows=[flow], database=database) as second:
                await until(lambda: len(started) == 4, timeout=15)
                held = {(await producer.get_job(job_id)).worker for job_id in ids[:4]}
                assert held == {first.worker.id, second.worker.id}
                for gate in gates:
                    gate.set()
                for job_id in ids:
                    await producer.wait_for_job(job_id, timeout=10)
                # A claim kept ahead and given back was no delivery: each job ran once, on its
                # first (the console's dead-letter view said "34 deliveries" of a job allowed 3).
                jobs = [await producer.get_job(job_id) for job_id in ids]
                assert [job.deliveries for job in jobs] == [1] * 6, [j.attempts for j in jobs]
    assert sorted(started) == list(range(6))  # each once


def finished_just_now(runtime: QueueRuntime, *ago: float) -> None:
    """The queue's slots finished jobs `ago` seconds before now (oldest first)."""
    now = time.monotonic()
    runtime.completed_times[:] = [now - seconds for seconds in ago]


async def test_more_is_claimed_ahead_only_for_short_jobs_and_few_kept(database: str) -> None:
    short = (AHEAD_HORIZON_S / 4, AHEAD_HORIZON_S / 8)  # two jobs finished just now
    async with Engine(database=database) as producer:
        queue = producer.backend.queue(provider_of(database))
        wf = gated_workflow(database, [], [])
        runtime = QueueRuntime(QUEUE, wf, queue, concurrency=2)
        assert not runtime.short_of_ahead()  # nothing finished yet: no pace to go by

        finished_just_now(runtime, *short)
        assert runtime.short_of_ahead()  # two slots, two jobs finished just now
        runtime.paused = True
        assert not runtime.short_of_ahead()
        runtime.paused = False

        # The slots' last jobs took longer than the horizon: more ahead would wait here.
        finished_just_now(runtime, 2 * AHEAD_HORIZON_S, AHEAD_HORIZON_S / 8)
        assert not runtime.short_of_ahead()

        # Enough is kept ahead already (half the slots' worth).
        await add_unserved(queue, QUEUE, [{}])
        assert await queue.claim_ahead(QUEUE, 2, "w1", 30.0) == 1
        finished_just_now(runtime, *short)
        assert not runtime.short_of_ahead()

        # A queue that never claims ahead (memory) is never topped up.
        in_memory = QueueRuntime(QUEUE, wf, producer.backend.queue("memory"), concurrency=2)
        finished_just_now(in_memory, *short)
        assert not in_memory.short_of_ahead()


async def test_a_job_claimed_ahead_is_cancelled_at_once_not_when_a_slot_frees(
    database: str,
) -> None:
    """Its worker held it for a free slot, which the jobs ahead of it kept for as long as they
    ran: the cancel took only then, and said nothing meanwhile (the run still `queued`). The
    worker ends it as soon as it hears of the cancel; the jobs running go on."""
    gates = [anyio.Event() for _ in range(4)]
    started: list[int] = []
    async with Engine(
        workflows=[gated_workflow(database, gates, started)], database=database
    ) as engine:
        ids = await engine.enqueue_many(QUEUE, [{"i": i} for i in range(4)])
        await until(lambda: sorted(started) == [0, 1])
        held = await engine.get_job(ids[2])
        assert held.state is JobState.ACTIVE  # claimed ahead: no slot has it
        with anyio.fail_after(5):  # well within the wait a cancel allows a holder (8 s)
            cancelled = await engine.cancel(held.run_id)
        assert cancelled.status is RunStatus.CANCELLED, cancelled
        assert cancelled.error == "cancelled by operator before it ran"
        assert (await engine.get_job(ids[2])).state is JobState.CANCELLED
        assert sorted(started) == [0, 1]  # the gates still hold them
        for gate in gates:
            gate.set()
        runs = [await engine.wait_for_job(job_id, timeout=10) for job_id in ids]
    assert [run.status for run in runs] == [
        RunStatus.COMPLETED,
        RunStatus.COMPLETED,
        RunStatus.CANCELLED,
        RunStatus.COMPLETED,
    ]
    assert sorted(started) == [0, 1, 3]
