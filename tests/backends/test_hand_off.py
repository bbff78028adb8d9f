"""A claim asleep for want of jobs gets the jobs an add in this process writes, in the add's own
transaction, without a look (engine/backends/database_queue.py, `Offer`): on the queues whose
add takes offers. So does a claim that would go to sleep while such an add waits in the writer
(`PendingAdd`). The job is then exactly what a claim would have made of it in the database:
active under the claimer's lease, one delivery, its epoch moved on, `handed` to a slot.

Another process's adds cannot hand jobs over; their commit wakes the claims asleep on the
queues it may have left something to claim (`SqliteQueue.others_committed`, which the backend
calls when the file's `data_version` moves), not every claim of the file."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import pytest
from support import Turns, all_tasks_blocked

from engine.backends import Backend
from engine.backends.base import Claim, JobQueue, JobUpdate, Transition
from engine.backends.database_queue import DatabaseQueue
from engine.backends.sqlite import queue as sqlite_queue
from engine.backends.sqlite.queue import SqliteQueue
from engine.models import Job, JobState, Run

from .builders import QUEUE, after, job_and_run

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("database_kind", ["sqlite"], indirect=True),
]

LONG = 30.0


@pytest.fixture
def queue(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> DatabaseQueue:
    queue = backend.queue(None)
    assert isinstance(queue, DatabaseQueue) and queue.hands_off
    monkeypatch.setattr(queue, "poll_s", LONG)  # it looks again only when woken
    return queue


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The queues each claim transaction looked in."""
    looked: list[str] = []
    claim = sqlite_queue._claim

    def counted(conn: object, queue: str, *args: object, **kwargs: object) -> object:
        looked.append(queue)
        return claim(conn, queue, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlite_queue, "_claim", counted)
    return looked


async def add(queue: JobQueue, *made: tuple[Job, Run]) -> list[str]:
    return await queue.add([job for job, _ in made], [run for _, run in made])


async def claim_while(
    queue: JobQueue,
    limit: int,
    adding: list[tuple[Job, Run]],
    timeout: float = LONG,
    lease_s: float = 60.0,
) -> list[Claim]:
    """A claim that found nothing and sleeps, then an add of `adding` in this process: what the
    claim returns."""
    claimed: list[Claim] = []

    async def claim() -> None:
        claimed.extend(await queue.claim(QUEUE, limit, "w1", lease_s, timeout=timeout))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(claim)
            await all_tasks_blocked()
            await add(queue, *adding)
    return claimed


@asynccontextmanager
async def writer_held(
    queue: DatabaseQueue, first: Callable[[], Awaitable[object]]
) -> AsyncIterator[anyio.abc.TaskGroup]:
    """Another process holds the file's write lock while `first` runs until the writer waits
    for the lock in its thread (so whatever `first` queued has not run yet), and while the body
    starts more; the lock is let go when the body ends, and everything started is awaited."""
    assert isinstance(queue, SqliteQueue)
    db = queue.db
    other = sqlite3.connect(db.path, isolation_level=None, check_same_thread=False)
    try:
        other.execute("BEGIN IMMEDIATE")
        in_thread = db.batches_in_thread
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                while db.batches_in_thread == in_thread:  # the writer gave up on the lock
                    await anyio.lowlevel.checkpoint()
                yield tg
                await all_tasks_blocked()
                other.execute("COMMIT")
    finally:
        other.close()


async def test_a_claim_that_would_sleep_while_an_add_waits_in_the_writer_joins_the_add(
    queue: DatabaseQueue, looks: list[str]
) -> None:
    """The add is queued first and the claim comes a moment later (on the path users take, the
    claim for the job before): it is handed the add's job when the add runs, without a look."""
    first = job_and_run()
    await add(queue, first)
    [claim] = await queue.claim(QUEUE, 1, "w1", 60.0)  # took all there was: drained
    assert claim.job.id == first[0].id and looks == [QUEUE]

    second = job_and_run()
    claimed: list[Claim] = []

    async def claim_next() -> None:
        claimed.extend(await queue.claim(QUEUE, 1, "w1", 60.0, timeout=LONG))

    async with writer_held(queue, lambda: add(queue, second)) as tg:
        tg.start_soon(claim_next)

    assert [c.job.id for c in claimed] == [second[0].id] and looks == [QUEUE]
    stored = await queue.get_job(second[0].id)
    assert stored is not None and (stored.state, stored.worker, stored.handed) == (
        JobState.ACTIVE,
        "w1",
        True,
    )


async def test_a_claim_that_would_sleep_joins_every_add_of_its_queue_waiting_in_the_writer(
    queue: DatabaseQueue, looks: list[str]
) -> None:
    """Several producers' adds wait in the writer (here: the first in a batch held up by
    another process's lock, the second queued behind it) when the claim comes: it is handed
    both adds' jobs."""
    zero = job_and_run()
    await add(queue, zero)
    [claim] = await queue.claim(QUEUE, 2, "w1", 60.0)  # took all there was: drained
    assert claim.job.id == zero[0].id and looks == [QUEUE]

    first, second = job_and_run(), job_and_run()
    claimed: list[Claim] = []

    async def claim_next() -> None:
        claimed.extend(await queue.claim(QUEUE, 2, "w1", 60.0, timeout=LONG))

    async with writer_held(queue, lambda: add(queue, first)) as tg:
        tg.start_soon(add, queue, second)
        await all_tasks_blocked()
        tg.start_soon(claim_next)

    assert [c.job.id for c in claimed] == [first[0].id, second[0].id] and looks == [QUEUE]


async def test_adds_made_while_a_claim_sleeps_all_hand_it_jobs_up_to_its_free_slots(
    queue: DatabaseQueue, looks: list[str]
) -> None:
    made = [job_and_run() for _ in range(3)]
    claimed: list[Claim] = []

    async def claim() -> None:
        claimed.extend(await queue.claim(QUEUE, 2, "w1", 60.0, timeout=LONG))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(claim)
            await all_tasks_blocked()  # it found nothing and sleeps
            for one in made:  # three producers' adds, made in one turn of the loop
                tg.start_soon(add, queue, one)

    assert [c.job.id for c in claimed] == [made[0][0].id, made[1][0].id]
    assert looks == [QUEUE]
    stored = await queue.get_job(made[2][0].id)
    assert stored is not None and (stored.state, stored.worker) == (JobState.WAITING, None)


async def test_a_look_that_took_an_adds_jobs_after_it_is_not_woken_by_that_add(
    queue: DatabaseQueue, looks: list[str]
) -> None:
    """An add and then a claim's look in one transaction: the look took the add's job, so the
    add wakes no one, and the next claim sleeps until the next add hands it its job (woken, it
    would have looked again for nothing first)."""
    first = job_and_run()
    claimed: list[Claim] = []

    async def claim_first() -> None:
        claimed.extend(await queue.claim(QUEUE, 1, "w1", 60.0))

    assert isinstance(queue, SqliteQueue)
    batches = queue.db.batches
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            # Both queued in one turn of the loop, the add first: the writer's next batch.
            tg.start_soon(add, queue, first)
            tg.start_soon(claim_first)

    assert queue.db.batches == batches + 1
    assert [c.job.id for c in claimed] == [first[0].id] and looks == [QUEUE]
    second = job_and_run()
    [claim] = await claim_while(queue, 1, [second])
    assert claim.job.id == second[0].id and claim.job.handed and looks == [QUEUE]


async def test_a_look_asked_for_before_an_add_of_its_transaction_finds_the_adds_job(
    queue: DatabaseQueue, looks: list[str]
) -> None:
    """A look runs after the other calls of its transaction (`late`): asked for first, it
    still takes the job an add of the same transaction wrote, instead of finding nothing and
    looking again in the next one."""
    made = job_and_run()
    claimed: list[Claim] = []

    async def claim_first() -> None:
        claimed.extend(await queue.claim(QUEUE, 1, "w1", 60.0, timeout=LONG))

    assert isinstance(queue, SqliteQueue)
    batches = queue.db.batches
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(claim_first)  # its look asked for first, in the same turn
            tg.start_soon(add, queue, made)

    assert [c.job.id for c in claimed] == [made[0].id] and looks == [QUEUE]
    assert queue.db.batches == batches + 1


async def test_an_add_hands_its_job_to_the_sleeping_claim_as_a_claim_would_take_it(
    queue: DatabaseQueue, looks: list[str]
) -> None:
    made = job_and_run()
    [claim] = await claim_while(queue, 1, [made])

    assert looks == [QUEUE]  # the first look found nothing; the add needed none
    job = claim.job
    assert (job.id, job.state, job.worker, job.attempts, job.epoch, job.handed) == (
        made[0].id,
        JobState.ACTIVE,
        "w1",
        1,
        1,
        True,
    )
    stored = await queue.get_job(job.id)
    assert stored is not None
    assert (stored.state, stored.worker, stored.attempts, stored.epoch, stored.handed) == (
        JobState.ACTIVE,
        "w1",
        1,
        1,
        True,
    )
    assert stored.lease_until is not None and stored.lease_until > after(50)
    assert (await queue.stats(QUEUE)).active == 1
    # Fenced as any claim: the holder's settle lands at this epoch, a late one does not.
    update = JobUpdate(state=JobState.COMPLETED)
    assert await queue.apply(Transition(job.id, job.epoch - 1, update, ())) is False
    assert await queue.apply(Transition(job.id, job.epoch, update, ())) is True


async def test_the_next_claim_after_a_hand_off_sleeps_until_a_job_is_added(
    queue: DatabaseQueue, looks: list[str]
) -> None:
    """A hand-off leaves the claim drained, as a look that took all there was: the next claim
    does not look for nothing, and a job added before it still wakes it."""
    await claim_while(queue, 1, [job_and_run()])
    second = job_and_run()
    [claim] = await claim_while(queue, 1, [second])
    assert claim.job.id == second[0].id and looks == [QUEUE]  # handed over twice, no look

    third = job_and_run()
    await add(queue, third)  # no claim asleep: added waiting, and the queue woken
    with anyio.fail_after(10):  # not the 30 s look
        [claim] = await queue.claim(QUEUE, 1, "w1", 60.0, timeout=LONG)
    assert claim.job.id == third[0].id and looks == [QUEUE, QUEUE]


async def test_a_queue_paused_by_another_process_gets_no_hand_off(
    queue: DatabaseQueue, other_backend: Backend
) -> None:
    await other_backend.shared.set_paused(QUEUE, True)
    made = job_and_run()
    claimed = await claim_while(queue, 1, [made], timeout=1.0)

    assert claimed == []
    stored = await queue.get_job(made[0].id)
    assert stored is not None and (stored.state, stored.worker) == (JobState.WAITING, None)


async def test_a_delayed_job_is_not_handed_off(queue: DatabaseQueue) -> None:
    made = job_and_run(run_at=after(LONG))
    claimed = await claim_while(queue, 1, [made], timeout=1.0)

    assert claimed == []
    stored = await queue.get_job(made[0].id)
    assert stored is not None and stored.state is JobState.DELAYED


async def test_a_claim_is_handed_no_more_than_its_free_slots(
    queue: DatabaseQueue, other_backend: Backend
) -> None:
    made = [job_and_run() for _ in range(3)]
    claimed = await claim_while(queue, 2, made)

    assert [c.job.id for c in claimed] == [job.id for job, _ in made[:2]]
    stored = await queue.get_job(made[2][0].id)
    assert stored is not None and stored.state is JobState.WAITING
    rest = await other_backend.queue(None).claim(QUEUE, 5, "w2", LONG)
    assert [c.job.id for c in rest] == [made[2][0].id]


async def test_a_job_already_known_is_not_handed_off_again(queue: DatabaseQueue) -> None:
    made = job_and_run()
    assert await add(queue, made) == [made[0].id]
    claimed = await claim_while(queue, 1, [made], timeout=1.0)  # the same id again

    # The first add's job is claimed by the claim's own look; the second add adds nothing.
    assert [c.job.id for c in claimed] == [made[0].id]
    assert claimed[0].job.epoch == 1


async def test_an_add_that_fails_hands_nothing_and_the_claim_goes_on(
    queue: DatabaseQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(conn: object, runs: object) -> None:
        raise RuntimeError("the disk is gone")

    claimed: list[Claim] = []

    async def claim() -> None:
        claimed.extend(await queue.claim(QUEUE, 1, "w1", 60.0, timeout=LONG))

    failed = job_and_run()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(claim)
            await all_tasks_blocked()
            with monkeypatch.context() as patched:
                patched.setattr(sqlite_queue, "write_runs", broken)
                with pytest.raises(RuntimeError, match="the disk is gone"):
                    await add(queue, failed)
            assert await queue.get_job(failed[0].id) is None
            later = job_and_run()
            await add(queue, later)
    assert [c.job.id for c in claimed] == [later[0].id]


async def test_a_handed_off_job_whose_holder_stops_renewing_is_taken_over_as_begun(
    queue: DatabaseQueue, other_backend: Backend
) -> None:
    """As with a claim's handed job: its run may have begun unrecorded, so whoever takes it
    over after the lease runs out hears so (`taken_handed`) and records the run crashed."""
    made = job_and_run()
    [claim] = await claim_while(queue, 1, [made], lease_s=0.2)
    other = other_backend.queue(None)
    with anyio.fail_after(10):  # the other process's claim looks again until the lease ran out
        [takeover] = await other.claim(QUEUE, 1, "w2", LONG, timeout=5.0)
    assert (takeover.job.id, takeover.taken_from, takeover.taken_handed) == (
        claim.job.id,
        "w1",
        True,
    )
    assert takeover.job.epoch == claim.job.epoch + 1


async def test_another_process_s_jobs_wake_only_the_claims_of_their_queue(
    queue: DatabaseQueue, other_backend: Backend, looks: list[str]
) -> None:
    # Next to a process that keeps the file busy, waking every claim at each of its commits
    # had each idle queue of an engine look 20 times a second.
    assert isinstance(queue, SqliteQueue)
    others = other_backend.queue(None)
    assert await queue.claim(QUEUE, 1, "w1", LONG, timeout=0.01) == []
    assert looks == [QUEUE]
    claimed: list[Claim] = []

    async def claim() -> None:
        claimed.extend(await queue.claim(QUEUE, 1, "w1", LONG, timeout=LONG))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(claim)
            await all_tasks_blocked()
            await add(others, job_and_run("elsewhere"))
            queue.others_committed()  # as the backend's watcher does when it sees the commit
            await all_tasks_blocked()
            assert looks == [QUEUE] and claimed == []  # nothing of its queue: still asleep
            mine = job_and_run(QUEUE)
            await add(others, mine)
            queue.others_committed()
    assert [c.job.id for c in claimed] == [mine[0].id]
    assert looks == [QUEUE, QUEUE]


async def test_an_add_to_a_queue_no_claim_here_looks_at_is_committed_by_its_caller(
    queue: DatabaseQueue,
) -> None:
    """A producer's add has no claim of its own process to hand its jobs to: its caller commits
    it after one turn of the loop (engine/backends/sqlite/db.py `outcome`, `soon`). Once a claim
    here has looked at the queue, an add waits for the writer's turns: a slot just freed joins
    it meanwhile and is handed its job without a look."""
    turns = Turns()
    await add(queue, job_and_run())
    assert turns.count <= 1

    await queue.claim(QUEUE, 1, "w1", 60.0)
    turns = Turns()
    await add(queue, job_and_run())
    assert turns.count >= 2
