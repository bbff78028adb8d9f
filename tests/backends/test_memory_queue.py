"""The memory queue's own wake-ups (engine/backends/memory.py), on every backend (each serves
one): a job added while a slot is finishing another is left to that slot for one turn of the
event loop before the claim loop is woken for it."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from engine.backends import Backend
from engine.backends.base import Claim, JobQueue
from engine.backends.memory import MemoryQueue
from engine.models import Job, JobState

from .builders import QUEUE, job_and_run

pytestmark = pytest.mark.anyio

LONG = 30.0


@pytest.fixture
def queue(backend: Backend) -> JobQueue:
    """The memory queue each backend serves (a database backend's keeps its runs there)."""
    return backend.queue("memory")


async def add_one(queue: JobQueue) -> str:
    job, run = job_and_run()
    await queue.add([job], [run])
    return job.id


async def test_a_job_a_slot_takes_first_does_not_wake_a_waiting_claim(
    queue: JobQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A busy queue of short jobs: the slot that just finished a job is back first and takes
    # the next one. A claim loop woken for it anyway would run a claim for nothing, each job.
    claims_looked: list[int] = []
    claim_now = MemoryQueue._claim_now

    def counted(self: MemoryQueue, *args: object) -> list[Claim]:
        claims_looked.append(1)
        return claim_now(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(MemoryQueue, "_claim_now", counted)
    waiting: list[Claim] = []
    taken: list[str] = []

    async def claim_loop() -> None:
        waiting.extend(await queue.claim(QUEUE, 1, "loop", LONG, timeout=LONG))

    async def slot_back_from_its_job() -> None:
        claim = queue.claim_nowait(QUEUE, "slot", LONG)
        assert claim is not None
        taken.append(claim.job.id)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(claim_loop)
            await anyio.lowlevel.checkpoint()  # the claim looked once and waits
            assert len(claims_looked) == 1
            added = []
            for _ in range(20):
                tg.start_soon(slot_back_from_its_job)  # due in the loop's next turn
                added.append(await add_one(queue))  # its add lets that turn run
                await anyio.lowlevel.checkpoint()  # and one more, for a wake-up to land
            assert taken == added
            # The slot's 20 claims, and the waiting claim's first look only.
            assert len(claims_looked) == 1 + len(taken)
            tg.cancel_scope.cancel()
    assert waiting == []


async def test_a_job_no_slot_takes_wakes_the_waiting_claim_a_turn_later(queue: JobQueue) -> None:
    claimed: list[Claim] = []

    async def claim_loop() -> None:
        claimed.extend(await queue.claim(QUEUE, 1, "loop", LONG, timeout=LONG))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(claim_loop)
            await anyio.lowlevel.checkpoint()
            job_id = await add_one(queue)

    assert [c.job.id for c in claimed] == [job_id]


async def test_a_paused_queues_claim_looks_at_its_forced_jobs_only(
    queue: JobQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A paused queue claims only the jobs an operator forced (run now). With a backlog, its
    # claim went through every waiting job, at every wake-up: each enqueue to a paused queue
    # of 20,000 jobs cost 20 ms.
    plain = [job_and_run() for _ in range(2000)]
    await queue.add([job for job, _ in plain], [run for _, run in plain])
    looked: list[str] = []
    live = MemoryQueue._live

    def counted(self: MemoryQueue, job_id: str, epoch: int, state: JobState) -> Job | None:
        looked.append(job_id)
        return live(self, job_id, epoch, state)

    monkeypatch.setattr(MemoryQueue, "_live", counted)

    assert await queue.claim(QUEUE, 4, "w1", LONG, forced_only=True) == []
    assert looked == []
