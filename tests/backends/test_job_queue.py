"""The JobQueue contract (engine/backends/base.py), run against every queue of every backend:
each backend's own queue, and the "memory" queue a database backend also serves (its jobs in
this process, its runs in the database).

Above all, fencing: a claim bumps the job's epoch, and every later write for the job — a
transition (`apply`, `submit`), a run's progress (`record`), a log line (`record_log`) — lands
only while the job is still at the epoch it names. Leases that must run out are 50 ms long.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from support import all_tasks_blocked

from engine.backends import Backend
from engine.backends.base import Claim, Fence, JobQueue, JobUpdate, Transition
from engine.backends.database_queue import DatabaseQueue
from engine.backends.held_for import held_for
from engine.models import (
    Attempt,
    AttemptStatus,
    Job,
    JobState,
    Run,
    RunStatus,
    StepRun,
    StepStatus,
    utcnow,
)

from .builders import QUEUE, after, job_and_run, line, new_id, run_of
from .databases import QUEUES, SHARED_QUEUES, QueueCase

pytestmark = pytest.mark.anyio

LONG = 30.0  # a lease that does not run out during a test
SHORT = 0.05  # a lease that does, once `outlive_lease` waited
# A lease a renewal must reach in time: under load (CI with both cores busy) 50 ms between a
# claim and its renewal was not always enough.
RENEWED_IN_TIME = 0.5


async def outlive_lease() -> None:
    await anyio.sleep(SHORT + 0.02)


@pytest.fixture(params=QUEUES, ids=str)
def queue_case(request: pytest.FixtureRequest) -> QueueCase:
    case: QueueCase = request.param
    return case


@pytest.fixture
def database_kind(queue_case: QueueCase) -> str:
    return queue_case.database


@pytest.fixture
def queue(backend: Backend, queue_case: QueueCase) -> JobQueue:
    return backend.queue(queue_case.provider)


async def add(target: JobQueue, count: int = 1, **fields: object) -> list[tuple[Job, Run]]:
    """Enqueue `count` new jobs (built with `fields`) with their first runs."""
    made = [job_and_run(**fields) for _ in range(count)]  # type: ignore[arg-type]
    added = await target.add([job for job, _ in made], [run for _, run in made])
    assert added == [job.id for job, _ in made]
    return made


async def claim_one(queue: JobQueue, worker: str = "w1", lease_s: float = LONG) -> Claim:
    claims = await queue.claim(QUEUE, 1, worker, lease_s)
    assert len(claims) == 1, claims
    return claims[0]


async def job_of(queue: JobQueue, job_id: str) -> Job:
    job = await queue.get_job(job_id)
    assert job is not None
    return job


def done(claim: Claim, run: Run, **update: object) -> Transition:
    """The holder's settle: the job completed and its run with it."""
    finished = run.model_copy(update={"status": RunStatus.COMPLETED, "finished_at": utcnow()})
    job_update = JobUpdate(state=JobState.COMPLETED, **update)  # type: ignore[arg-type]
    return Transition(claim.job.id, claim.job.epoch, job_update, (finished,))


# ---- adding ------------------------------------------------------------------------------
async def test_add_returns_the_jobs_added_and_stores_their_runs(
    backend: Backend, queue: JobQueue
) -> None:
    made = [job_and_run(payload={"n": n}) for n in range(3)]

    added = await queue.add([job for job, _ in made], [run for _, run in made])

    assert added == [job.id for job, _ in made]
    for job, run in made:
        found = await job_of(queue, job.id)
        assert (found.state, found.payload, found.run_id, found.epoch) == (
            JobState.WAITING,
            job.payload,
            run.id,
            0,
        )
        stored = await backend.runs.get_run(run.id)
        assert stored is not None and stored.model_dump() == run.model_dump()


async def test_add_lets_other_tasks_run_before_it_returns(queue: JobQueue) -> None:
    # A producer enqueuing in a loop must not keep this process's workers from running until
    # its loop ends: an add is a checkpoint on every queue.
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    async with anyio.create_task_group() as group:
        group.start_soon(other)
        await add(queue)
        ran.append("add returned")

    assert ran == ["other", "add returned"]


async def test_a_known_job_is_not_added_again_nor_its_run_overwritten(
    backend: Backend, queue: JobQueue
) -> None:
    [(job, run)] = await add(queue, payload={"first": True})
    [claim] = await queue.claim(QUEUE, 1, "w1", LONG)
    twin, twin_run = job_and_run(job_id=job.id, run_id=run.id, payload={"second": True})
    twin_run.status = RunStatus.FAILED
    fresh, fresh_run = job_and_run()

    added = await queue.add([twin, fresh], [twin_run, fresh_run])

    assert added == [fresh.id]
    kept = await job_of(queue, job.id)
    assert (kept.payload, kept.state, kept.epoch) == (
        {"first": True},
        JobState.ACTIVE,
        claim.job.epoch,
    )
    stored = await backend.runs.get_run(run.id)
    assert stored is not None and (stored.status, stored.input) == (
        RunStatus.QUEUED,
        {"first": True},
    )
    assert await queue.add([twin], [twin_run]) == []


async def test_a_run_added_with_steps_is_stored_with_them(
    backend: Backend, queue: JobQueue
) -> None:
    """A replay from a step enqueues a run that carries the steps it reuses (completed, their
    outputs copied from the source run) and the pending ones after them; its job resumes it."""
    started = utcnow()
    reused = StepRun(
        index=0,
        name="fetch",
        status=StepStatus.COMPLETED,
        started_at=started,
        finished_at=started,
        output={"rows": 3},
        attempts=[Attempt(number=1, status=AttemptStatus.COMPLETED, started_at=started)],
    )
    job, _ = job_and_run()
    job.resume = True
    run = run_of(
        job,
        replay_of=new_id("run"),
        replay_from_step="ship",
        steps=[reused, StepRun(index=1, name="ship")],
    )
    plain, plain_run = job_and_run()

    assert await queue.add([job, plain], [run, plain_run]) == [job.id, plain.id]

    stored = await backend.runs.get_run(run.id)
    assert stored is not None and stored.model_dump() == run.model_dump()
    assert [(s.name, s.status, len(s.attempts)) for s in stored.steps] == [
        ("fetch", StepStatus.COMPLETED, 1),
        ("ship", StepStatus.PENDING, 0),
    ]
    stored_plain = await backend.runs.get_run(plain_run.id)
    assert stored_plain is not None and stored_plain.model_dump() == plain_run.model_dump()
    claim = await claim_one(queue)
    assert (claim.job.id, claim.job.resume) == (job.id, True)
    # Known already: neither the job nor its run's steps are written again.
    twin = run_of(job, steps=[StepRun(index=0, name="other")])
    assert await queue.add([job], [twin]) == []
    kept = await backend.runs.get_run(run.id)
    assert kept is not None and [s.name for s in kept.steps] == ["fetch", "ship"]


# ---- claiming ----------------------------------------------------------------------------
async def test_claims_go_by_priority_then_oldest_first(queue: JobQueue) -> None:
    made = []
    for priority in (0, 5, 0, 9, 5):
        made += await add(queue, priority=priority)
    ids = [job.id for job, _ in made]

    claims = await queue.claim(QUEUE, 10, "w1", LONG)

    assert [c.job.id for c in claims] == [ids[3], ids[1], ids[4], ids[0], ids[2]]


async def test_a_claim_takes_at_most_limit_jobs(queue: JobQueue) -> None:
    made = await add(queue, 5)
    ids = [job.id for job, _ in made]

    first = await queue.claim(QUEUE, 2, "w1", LONG)
    second = await queue.claim(QUEUE, 2, "w1", LONG)
    third = await queue.claim(QUEUE, 2, "w1", LONG)

    assert [len(first), len(second), len(third)] == [2, 2, 1]
    assert [c.job.id for c in first + second + third] == ids
    assert await queue.claim(QUEUE, 2, "w1", LONG) == []


async def test_a_claim_is_of_one_queue(queue: JobQueue) -> None:
    [(job, _)] = await add(queue, queue="billing")

    assert await queue.claim(QUEUE, 5, "w1", LONG) == []
    [claim] = await queue.claim("billing", 5, "w1", LONG)
    assert claim.job.id == job.id


async def test_a_claim_bumps_the_epoch_and_the_attempts_and_leases_the_job(
    queue: JobQueue,
) -> None:
    [(job, _)] = await add(queue)
    added = await job_of(queue, job.id)
    before = time.monotonic()

    claim = await claim_one(queue, "w1", lease_s=LONG)

    assert claim.job.id == job.id
    assert (claim.job.state, claim.job.worker, claim.job.attempts) == (JobState.ACTIVE, "w1", 1)
    assert claim.job.epoch > added.epoch
    assert claim.taken_from is None
    assert claim.lease_s == LONG
    assert before <= claim.held_since <= time.monotonic()
    assert claim.fence == Fence(job.id, claim.job.epoch)
    assert claim.job.lease_until is not None
    assert abs(claim.job.lease_until - (utcnow() + timedelta(seconds=LONG))) < timedelta(seconds=5)
    stored = await job_of(queue, job.id)
    assert (stored.state, stored.worker, stored.epoch, stored.attempts) == (
        JobState.ACTIVE,
        "w1",
        claim.job.epoch,
        1,
    )


async def test_a_delayed_job_is_not_claimed_before_its_run_at(queue: JobQueue) -> None:
    await add(queue, run_at=after(3600))

    assert await queue.claim(QUEUE, 5, "w1", LONG) == []
    stats = await queue.stats(QUEUE)
    assert (stats.delayed, stats.waiting) == (1, 0)


async def test_a_delayed_job_is_claimed_once_its_run_at_came(queue: JobQueue) -> None:
    due = after(0.1)
    [(job, _)] = await add(queue, run_at=due)

    with anyio.fail_after(5):
        claims = await queue.claim(QUEUE, 1, "w1", LONG, timeout=4)

    assert [c.job.id for c in claims] == [job.id]
    assert time.time() >= due.timestamp()


async def test_a_claim_with_a_timeout_returns_nothing_when_nothing_comes(queue: JobQueue) -> None:
    started = time.monotonic()

    with anyio.fail_after(5):
        claims = await queue.claim(QUEUE, 1, "w1", LONG, timeout=0.1)

    assert claims == []
    assert 0.1 <= time.monotonic() - started < 2


async def test_a_claim_asleep_returns_at_once_when_woken_with_news(queue: JobQueue) -> None:
    # A worker's stop or resume: the claim loop's claim, asleep for jobs, must end now (it is
    # never cancelled: half-way, that would leave jobs leased to nobody). A wake-up without
    # news (a job of the queue added and taken elsewhere) leaves it asleep.
    news = False
    claims: list[Claim] | None = None

    async def claim() -> None:
        nonlocal claims
        claims = await queue.claim(QUEUE, 1, "w1", LONG, timeout=LONG, interrupted=lambda: news)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(claim)
            await all_tasks_blocked()
            queue.wake(QUEUE)
            await all_tasks_blocked()
            assert claims is None
            news = True
            queue.wake(QUEUE)
    assert claims == []


async def test_a_claim_times_out_even_while_woken_at_every_turn(queue: JobQueue) -> None:
    # What a busy queue does to its claim loop: every job added wakes it, and a slot that was
    # already due takes the job first. The claim must still end at its timeout.
    claims: list[Claim] | None = None

    async def wait_for_work() -> None:
        nonlocal claims
        claims = await queue.claim(QUEUE, 1, "w1", LONG, timeout=0.1)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_work)
            while claims is None:
                queue.wake(QUEUE)
                await anyio.lowlevel.checkpoint()

    assert claims == []


async def test_a_waiting_claim_gets_a_job_added_meanwhile(queue: JobQueue) -> None:
    claimed: list[Claim] = []

    async def wait_for_work() -> None:
        claimed.extend(await queue.claim(QUEUE, 1, "w1", LONG, timeout=10))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_work)
            await anyio.sleep(0.02)  # the claim is waiting by now
            [(job, _)] = await add(queue)

    assert [c.job.id for c in claimed] == [job.id]


async def test_a_job_under_a_live_lease_is_not_claimed_again(queue: JobQueue) -> None:
    await add(queue)
    await claim_one(queue, "w1", lease_s=LONG)

    assert await queue.claim(QUEUE, 1, "w2", LONG) == []
    assert await queue.claim(QUEUE, 1, "w1", LONG) == []


async def test_an_expired_lease_is_taken_over_with_a_new_epoch(queue: JobQueue) -> None:
    [(job, _)] = await add(queue)
    first = await claim_one(queue, "w1", lease_s=SHORT)

    await outlive_lease()
    [second] = await queue.claim(QUEUE, 1, "w2", LONG)

    assert second.job.id == job.id
    assert second.taken_from == "w1"
    assert second.job.worker == "w2"
    assert second.job.epoch > first.job.epoch
    assert second.job.attempts == 2
    assert first.lease_lost()
    stored = await job_of(queue, job.id)
    assert (stored.worker, stored.epoch) == ("w2", second.job.epoch)


async def test_a_takeover_says_whether_the_lost_holder_had_been_handed_the_job(
    queue: JobQueue,
) -> None:
    """A claim on a database hands the jobs it returns straight to worker slots (a memory
    queue's never says so: its runs' starts are not committed anywhere); one claimed ahead is
    not handed. Taking either over tells which it was: a handed job's run may have begun
    before its start was recorded."""
    await add(queue, 3)
    first = await claim_one(queue, "w1", lease_s=SHORT)
    later = queue.claim_nowait(QUEUE, "w1", SHORT)  # ahead of the first, or a claim of its own
    assert later is not None
    assert first.job.handed is (queue.provider != "memory")
    assert not later.job.handed

    await outlive_lease()
    taken = {c.job.id: c for c in await queue.claim(QUEUE, 3, "w2", LONG)}

    for lost in (first, later):
        claim = taken[lost.job.id]
        assert claim.taken_from == "w1"
        assert claim.taken_handed is lost.job.handed
        # Returned by this claim: handed on, where the queue hands.
        assert claim.job.handed is first.job.handed


# ---- fencing: transitions ----------------------------------------------------------------
async def test_apply_at_the_current_epoch_writes_the_job_its_runs_and_logs(
    backend: Backend, queue: JobQueue
) -> None:
    [(job, run)] = await add(queue)
    claim = await claim_one(queue)
    cursor = await backend.runs.feed_cursor()
    transition = done(claim, run)
    transition.logs = ((run.id, line("all done")),)

    assert await queue.apply(transition) is True

    stored = await job_of(queue, job.id)
    assert stored.state is JobState.COMPLETED
    assert stored.epoch > claim.job.epoch
    found = await backend.runs.get_run(run.id)
    assert found is not None and found.status is RunStatus.COMPLETED
    page = await backend.runs.feed(cursor)
    assert [entry.message for entry in page.logs] == ["all done"]


async def test_apply_at_a_stale_epoch_returns_false_and_writes_nothing(
    backend: Backend, queue: JobQueue
) -> None:
    [(job, run)] = await add(queue)
    first = await claim_one(queue, "w1", lease_s=SHORT)
    await outlive_lease()
    second = await claim_one(queue, "w2")
    cursor = await backend.runs.feed_cursor()
    other = run_of(job, id="run_stale_extra")
    stale = done(first, run, error="late")
    stale.runs = (*stale.runs, other)
    stale.logs = ((run.id, line("late line")),)

    assert await queue.apply(stale) is False

    stored = await job_of(queue, job.id)
    assert (stored.state, stored.worker, stored.epoch, stored.error) == (
        JobState.ACTIVE,
        "w2",
        second.job.epoch,
        None,
    )
    found = await backend.runs.get_run(run.id)
    assert found is not None and found.status is RunStatus.QUEUED
    assert await backend.runs.get_run(other.id) is None
    page = await backend.runs.feed(cursor)
    assert (page.runs, page.logs) == ([], [])


async def test_apply_with_runs_only_is_fenced_too(backend: Backend, queue: JobQueue) -> None:
    [(job, run)] = await add(queue)
    claim = await claim_one(queue)
    running = run.model_copy(update={"status": RunStatus.RUNNING})

    assert await queue.apply(Transition(job.id, claim.job.epoch, None, (running,))) is True
    stored = await job_of(queue, job.id)
    assert (stored.state, stored.epoch) == (JobState.ACTIVE, claim.job.epoch)
    found = await backend.runs.get_run(run.id)
    assert found is not None and found.status is RunStatus.RUNNING

    late = run.model_copy(update={"status": RunStatus.FAILED})
    assert await queue.apply(Transition(job.id, claim.job.epoch - 1, None, (late,))) is False
    found = await backend.runs.get_run(run.id)
    assert found is not None and found.status is RunStatus.RUNNING


async def test_apply_to_an_unknown_job_returns_false(backend: Backend, queue: JobQueue) -> None:
    job, run = job_and_run()
    update = JobUpdate(state=JobState.COMPLETED)

    assert await queue.apply(Transition(job.id, 0, update, (run,))) is False
    assert await queue.get_job(job.id) is None
    assert await backend.runs.get_run(run.id) is None


async def test_submit_at_the_current_epoch_lands_with_the_next_commit(
    backend: Backend, queue: JobQueue
) -> None:
    [(job, run)] = await add(queue)
    claim = await claim_one(queue)

    queue.submit(done(claim, run))
    await backend.runs.flush()

    assert (await job_of(queue, job.id)).state is JobState.COMPLETED
    found = await backend.runs.get_run(run.id)
    assert found is not None and found.status is RunStatus.COMPLETED


async def test_submit_at_a_stale_epoch_writes_nothing(backend: Backend, queue: JobQueue) -> None:
    [(job, run)] = await add(queue)
    first = await claim_one(queue, "w1", lease_s=SHORT)
    await outlive_lease()
    second = await claim_one(queue, "w2")
    cursor = await backend.runs.feed_cursor()
    stale = done(first, run, error="late")
    stale.logs = ((run.id, line("late line")),)

    queue.submit(stale)
    await backend.runs.flush()

    stored = await job_of(queue, job.id)
    assert (stored.state, stored.worker, stored.epoch) == (JobState.ACTIVE, "w2", second.job.epoch)
    found = await backend.runs.get_run(run.id)
    assert found is not None and found.status is RunStatus.QUEUED
    page = await backend.runs.feed(cursor)
    assert (page.runs, page.logs) == ([], [])


async def test_submit_tells_whether_the_transition_landed_once_committed(
    backend: Backend, queue: JobQueue
) -> None:
    [(job, run), (other, other_run)] = await add(queue, 2)
    first = await claim_one(queue, "w1", lease_s=SHORT)
    await outlive_lease()
    [second, kept] = await queue.claim(QUEUE, 2, "w2", LONG)
    assert (second.job.id, kept.job.id) == (job.id, other.id)
    told: list[tuple[str, bool]] = []
    stale = done(first, run, error="late")
    stale.landed = lambda landed: told.append(("stale", landed))
    fresh = done(second, run)
    fresh.landed = lambda landed: told.append(("fresh", landed))
    # Only the runs (no job update): the fence alone is the answer.
    progress = Transition(kept.job.id, kept.job.epoch, None, (other_run,))
    progress.landed = lambda landed: told.append(("progress", landed))

    queue.submit(stale)
    queue.submit(fresh)
    queue.submit(progress)
    await backend.runs.flush()

    assert told == [("stale", False), ("fresh", True), ("progress", True)]
    assert (await job_of(queue, job.id)).state is JobState.COMPLETED
    assert (await job_of(queue, other.id)).epoch == kept.job.epoch


async def test_of_two_settles_at_one_epoch_only_the_first_lands(
    backend: Backend, queue: JobQueue
) -> None:
    """Submitted together (one batch on a database), as one after the other: the first moves
    the job on, so the second finds it at another epoch."""
    [(job, run)] = await add(queue)
    claim = await claim_one(queue)
    told: list[tuple[str, bool]] = []
    first = done(claim, run)
    first.landed = lambda landed: told.append(("first", landed))
    second = done(claim, run, error="again")
    second.landed = lambda landed: told.append(("second", landed))

    queue.submit(first)
    queue.submit(second)
    await backend.runs.flush()

    assert told == [("first", True), ("second", False)]
    stored = await job_of(queue, job.id)
    assert (stored.state, stored.error, stored.epoch) == (
        JobState.COMPLETED,
        None,
        claim.job.epoch + 1,
    )


# ---- fencing: a holder's progress --------------------------------------------------------
async def test_record_and_record_log_land_at_the_current_fence(
    backend: Backend, queue: JobQueue
) -> None:
    [(_, run)] = await add(queue)
    claim = await claim_one(queue)
    cursor = await backend.runs.feed_cursor()
    running = run.model_copy(update={"status": RunStatus.RUNNING, "started_at": utcnow()})

    queue.record(running, claim.fence)
    queue.record_log(run.id, line("working"), claim.fence)
    await backend.runs.flush()

    found = await backend.runs.get_run(run.id)
    assert found is not None and found.status is RunStatus.RUNNING
    page = await backend.runs.feed(cursor)
    assert [entry.message for entry in page.logs] == ["working"]


async def test_record_and_record_log_at_a_stale_fence_write_nothing(
    backend: Backend, queue: JobQueue
) -> None:
    [(_, run)] = await add(queue)
    first = await claim_one(queue, "w1", lease_s=SHORT)
    await outlive_lease()
    await claim_one(queue, "w2")
    cursor = await backend.runs.feed_cursor()
    late = run.model_copy(update={"status": RunStatus.FAILED, "error": "late"})

    queue.record(late, first.fence)
    queue.record_log(run.id, line("late line"), first.fence)
    await backend.runs.flush()

    found = await backend.runs.get_run(run.id)
    assert found is not None and (found.status, found.error) == (RunStatus.QUEUED, None)
    page = await backend.runs.feed(cursor)
    assert (page.runs, page.logs) == ([], [])


async def test_a_settled_job_takes_no_more_progress(backend: Backend, queue: JobQueue) -> None:
    [(_, run)] = await add(queue)
    claim = await claim_one(queue)
    assert await queue.apply(done(claim, run))
    cursor = await backend.runs.feed_cursor()

    queue.record(run.model_copy(update={"status": RunStatus.RUNNING}), claim.fence)
    queue.record_log(run.id, line("after the end"), claim.fence)
    await backend.runs.flush()

    found = await backend.runs.get_run(run.id)
    assert found is not None and found.status is RunStatus.COMPLETED
    page = await backend.runs.feed(cursor)
    assert (page.runs, page.logs) == ([], [])


# ---- what an update does -----------------------------------------------------------------
async def test_a_terminal_update_finishes_the_job_and_lets_it_go(queue: JobQueue) -> None:
    [(job, run)] = await add(queue)
    claim = await claim_one(queue)
    update = JobUpdate(state=JobState.FAILED, error="boom", meta={"failures": 1})

    assert await queue.apply(Transition(job.id, claim.job.epoch, update, ()))

    stored = await job_of(queue, job.id)
    assert (stored.state, stored.error, stored.meta, stored.worker, stored.lease_until) == (
        JobState.FAILED,
        "boom",
        {"failures": 1},
        None,
        None,
    )
    assert stored.epoch > claim.job.epoch
    assert stored.finished_at is not None
    assert abs(stored.finished_at - utcnow()) < timedelta(seconds=5)
    assert stored.run_id == run.id  # unchanged when the update names no run
    assert await queue.claim(QUEUE, 1, "w2", LONG) == []


@pytest.mark.parametrize("state", [JobState.WAITING, JobState.DELAYED])
async def test_an_update_to_pending_without_run_at_is_due_now(
    queue: JobQueue, state: JobState
) -> None:
    [(job, _)] = await add(queue)
    claim = await claim_one(queue)
    update = JobUpdate(state=state, run_id="run_next", resume=True, error="crashed")

    assert await queue.apply(Transition(job.id, claim.job.epoch, update, ()))

    stored = await job_of(queue, job.id)
    assert (stored.state, stored.run_id, stored.resume, stored.worker, stored.finished_at) == (
        JobState.WAITING,
        "run_next",
        True,
        None,
        None,
    )
    [again] = await queue.claim(QUEUE, 1, "w2", LONG)
    assert (again.job.id, again.job.run_id, again.job.resume) == (job.id, "run_next", True)
    assert again.job.epoch > claim.job.epoch


@pytest.mark.parametrize("state", [JobState.WAITING, JobState.DELAYED])
async def test_an_update_to_pending_with_a_later_run_at_is_delayed(
    queue: JobQueue, state: JobState
) -> None:
    [(job, _)] = await add(queue)
    claim = await claim_one(queue)
    update = JobUpdate(state=state, run_at=after(3600))

    assert await queue.apply(Transition(job.id, claim.job.epoch, update, ()))

    assert (await job_of(queue, job.id)).state is JobState.DELAYED
    assert await queue.claim(QUEUE, 1, "w2", LONG) == []
    stats = await queue.stats(QUEUE)
    assert (stats.delayed, stats.waiting, stats.active) == (1, 0, 0)


async def test_an_update_with_a_past_run_at_is_due_now(queue: JobQueue) -> None:
    [(job, _)] = await add(queue)
    claim = await claim_one(queue)
    update = JobUpdate(state=JobState.DELAYED, run_at=after(-5))

    assert await queue.apply(Transition(job.id, claim.job.epoch, update, ()))

    [again] = await queue.claim(QUEUE, 1, "w2", LONG)
    assert again.job.id == job.id


async def test_attempts_are_kept_unless_the_update_gives_a_fresh_budget(queue: JobQueue) -> None:
    [(job, _)] = await add(queue)
    claim = await claim_one(queue)
    assert await queue.apply(Transition(job.id, claim.job.epoch, JobUpdate(state=JobState.WAITING)))
    claim = await claim_one(queue)
    assert claim.job.attempts == 2
    dead = JobUpdate(state=JobState.DEAD, error="used up")
    assert await queue.apply(Transition(job.id, claim.job.epoch, dead))

    # An operator's requeue of the dead letter, at the epoch it read.
    stored = await job_of(queue, job.id)
    requeue = JobUpdate(state=JobState.WAITING, fresh_budget=True, run_id="run_requeued")
    assert await queue.apply(Transition(job.id, stored.epoch, requeue))

    requeued = await job_of(queue, job.id)
    assert (requeued.state, requeued.attempts, requeued.finished_at, requeued.error) == (
        JobState.WAITING,
        0,
        None,
        None,
    )
    claim = await claim_one(queue)
    assert (claim.job.attempts, claim.job.run_id) == (1, "run_requeued")


async def test_a_forced_job_is_claimed_by_a_forced_only_claim(queue: JobQueue) -> None:
    [(plain, _), (delayed, _)] = await add(queue, 2)
    # The second job waits in a backoff an operator cuts short ("run it now").
    claim = await queue.claim(QUEUE, 2, "w1", LONG)
    assert [c.job.id for c in claim] == [plain.id, delayed.id]
    back = JobUpdate(state=JobState.WAITING)
    assert await queue.apply(Transition(plain.id, claim[0].job.epoch, back))
    later = JobUpdate(state=JobState.DELAYED, run_at=after(3600))
    assert await queue.apply(Transition(delayed.id, claim[1].job.epoch, later))
    stored = await job_of(queue, delayed.id)
    forced = JobUpdate(state=JobState.DELAYED, run_at=after(3600), force=True)
    assert await queue.apply(Transition(delayed.id, stored.epoch, forced))

    forced_claims = await queue.claim(QUEUE, 5, "w2", LONG, forced_only=True)

    assert [c.job.id for c in forced_claims] == [delayed.id]
    assert forced_claims[0].job.force is True
    assert await queue.claim(QUEUE, 5, "w2", LONG, forced_only=True) == []
    assert [c.job.id for c in await queue.claim(QUEUE, 5, "w2", LONG)] == [plain.id]


async def _forced_behind(queue: JobQueue, plain: int) -> tuple[Job, list[Job]]:
    """A job an operator forced (run now), added before `plain` plain waiting jobs: the
    forced one, and the plain ones."""
    [(forced, _)] = await add(queue)
    claim = await claim_one(queue)
    assert await queue.apply(
        Transition(
            forced.id, claim.job.epoch, JobUpdate(state=JobState.DELAYED, run_at=after(3600))
        )
    )
    stored = await job_of(queue, forced.id)
    now = JobUpdate(state=JobState.WAITING, force=True)
    assert await queue.apply(Transition(forced.id, stored.epoch, now))
    return forced, [job for job, _ in await add(queue, plain)]


async def test_a_forced_job_a_plain_claim_took_is_not_claimed_again_by_a_forced_only_one(
    queue: JobQueue,
) -> None:
    forced, plain = await _forced_behind(queue, 3)
    taken = await queue.claim(QUEUE, 1, "w1", LONG)
    assert [c.job.id for c in taken] == [forced.id]  # first in, among equals

    assert await queue.claim(QUEUE, 5, "w2", LONG, forced_only=True) == []
    assert [c.job.id for c in await queue.claim(QUEUE, 5, "w2", LONG)] == [j.id for j in plain]


async def test_a_forced_job_a_forced_only_claim_took_is_not_claimed_again_by_a_plain_one(
    queue: JobQueue,
) -> None:
    forced, plain = await _forced_behind(queue, 300)

    taken = await queue.claim(QUEUE, 5, "w1", LONG, forced_only=True)

    assert [c.job.id for c in taken] == [forced.id]
    stats = await queue.stats(QUEUE)
    assert (stats.waiting, stats.active) == (300, 1)
    again = await queue.claim(QUEUE, 400, "w2", LONG)
    assert [c.job.id for c in again] == [job.id for job in plain]


async def test_headers_and_meta_are_replaced_only_when_the_update_names_them(
    queue: JobQueue,
) -> None:
    [(job, _)] = await add(queue, headers={"authorization": "secret", "x-id": "1"})
    claim = await claim_one(queue)
    keep = JobUpdate(state=JobState.WAITING)
    assert await queue.apply(Transition(job.id, claim.job.epoch, keep))
    stored = await job_of(queue, job.id)
    assert (stored.headers, stored.meta) == ({"authorization": "secret", "x-id": "1"}, {})

    claim = await claim_one(queue)
    replace = JobUpdate(
        state=JobState.CANCELLED, headers={"authorization": "[redacted]"}, meta={"by": "op"}
    )
    assert await queue.apply(Transition(job.id, claim.job.epoch, replace))

    stored = await job_of(queue, job.id)
    assert (stored.headers, stored.meta) == ({"authorization": "[redacted]"}, {"by": "op"})


async def test_an_active_update_keeps_the_holder_and_the_epoch(
    backend: Backend, queue: JobQueue
) -> None:
    [(job, run)] = await add(queue)
    claim = await claim_one(queue)
    crashed = run.model_copy(update={"status": RunStatus.CRASHED, "finished_at": utcnow()})
    fresh = run_of(job, id="run_fresh")
    update = JobUpdate(state=JobState.ACTIVE, run_id=fresh.id, meta={"takeover": 1})

    assert await queue.apply(Transition(job.id, claim.job.epoch, update, (crashed, fresh)))

    stored = await job_of(queue, job.id)
    assert (stored.state, stored.worker, stored.epoch, stored.run_id, stored.meta) == (
        JobState.ACTIVE,
        "w1",
        claim.job.epoch,
        fresh.id,
        {"takeover": 1},
    )
    assert await backend.runs.get_run(fresh.id) is not None
    # Still the holder: its fence holds, nobody else may claim the job.
    assert await queue.claim(QUEUE, 1, "w2", LONG) == []
    assert await queue.apply(done(claim, fresh))
    assert (await job_of(queue, job.id)).state is JobState.COMPLETED


# ---- leases and signals ------------------------------------------------------------------
async def test_renew_returns_the_jobs_held_with_their_epochs(queue: JobQueue) -> None:
    mine = await add(queue, 2)
    claims = await queue.claim(QUEUE, 2, "w1", LONG)
    [(theirs, _)] = await add(queue)
    other = await claim_one(queue, "w2")
    assert other.job.id == theirs.id

    renewal = await queue.renew("w1", LONG)

    assert renewal.held == {c.job.id: c.job.epoch for c in claims}
    assert set(renewal.held) == {job.id for job, _ in mine}
    assert renewal.signals == {}
    assert (await queue.renew("nobody", LONG)).held == {}


async def test_renew_extends_the_lease(queue: JobQueue) -> None:
    await add(queue)
    claim = await claim_one(queue, "w1", lease_s=RENEWED_IN_TIME)

    renewal = await queue.renew("w1", LONG)
    assert renewal.held == {claim.job.id: claim.job.epoch}
    await anyio.sleep(RENEWED_IN_TIME + 0.05)

    assert await queue.claim(QUEUE, 1, "w2", LONG) == []


async def test_a_claim_left_is_not_renewed_and_its_lease_runs_out(queue: JobQueue) -> None:
    """A worker that gave a claim up without a word (its outcome not recorded) does not keep
    it: renewed with its other jobs, it stayed the worker's for ever."""
    await add(queue, 2)
    left, kept = await queue.claim(QUEUE, 2, "w1", RENEWED_IN_TIME)

    renewal = await queue.renew("w1", LONG, {left.job.id: left.job.epoch})
    assert renewal.held == {kept.job.id: kept.job.epoch}
    # Another epoch of the same job is not the claim left: it is renewed.
    leave = {left.job.id: left.job.epoch, kept.job.id: kept.job.epoch + 1}
    assert (await queue.renew("w1", LONG, leave)).held == {kept.job.id: kept.job.epoch}
    await anyio.sleep(RENEWED_IN_TIME + 0.05)
    [taken] = await queue.claim(QUEUE, 1, "w2", LONG)
    assert taken.job.id == left.job.id and taken.taken_from == "w1"


async def test_a_job_taken_over_is_no_longer_renewed_by_its_old_holder(queue: JobQueue) -> None:
    [(job, _)] = await add(queue)
    await claim_one(queue, "w1", lease_s=SHORT)
    await outlive_lease()
    second = await claim_one(queue, "w2")

    assert (await queue.renew("w1", LONG)).held == {}
    assert (await queue.renew("w2", LONG)).held == {job.id: second.job.epoch}


async def test_a_signal_reaches_the_holder_at_its_epoch_only(queue: JobQueue) -> None:
    [(job, _)] = await add(queue)
    claim = await claim_one(queue)
    before = time.time()

    assert await queue.signal(job.id, claim.job.epoch - 1, "cancel") is False
    assert await queue.signal(job.id, claim.job.epoch, "cancel") is True
    assert await queue.signal(job.id, claim.job.epoch, "retry_now") is True

    waiting = await queue.signals_for("w1")
    assert set(waiting) == {job.id}
    assert set(waiting[job.id]) == {"cancel", "retry_now"}
    assert all(before <= at <= time.time() for at in waiting[job.id].values())
    assert await queue.signals_for("w2") == {}
    renewal = await queue.renew("w1", LONG)
    assert renewal.signals == waiting


async def test_a_job_nobody_holds_takes_no_signal(queue: JobQueue) -> None:
    [(job, _)] = await add(queue)

    assert await queue.signal(job.id, 0, "cancel") is False
    assert await queue.signal("job_nobody", 0, "cancel") is False

    claim = await claim_one(queue)
    assert await queue.apply(done(claim, run_of(claim.job)))
    settled = await job_of(queue, job.id)
    assert await queue.signal(job.id, settled.epoch, "cancel") is False


async def test_signals_go_with_the_epoch_they_were_left_at(queue: JobQueue) -> None:
    [(job, _)] = await add(queue)
    first = await claim_one(queue, "w1", lease_s=SHORT)
    assert await queue.signal(job.id, first.job.epoch, "cancel")
    await outlive_lease()

    second = await claim_one(queue, "w2")

    assert second.job.signals == {}
    assert await queue.signals_for("w2") == {}
    assert (await queue.renew("w2", LONG)).signals == {}


# ---- reads -------------------------------------------------------------------------------
async def test_stats_count_the_jobs_in_each_state(queue: JobQueue) -> None:
    made = await add(queue, 5)
    claims = await queue.claim(QUEUE, 5, "w1", LONG)
    assert [c.job.id for c in claims] == [job.id for job, _ in made]
    for claim, state in zip(
        claims,
        (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.DEAD),
        strict=False,
    ):
        assert await queue.apply(Transition(claim.job.id, claim.job.epoch, JobUpdate(state=state)))
    await add(queue, 2)
    await add(queue, run_at=after(3600))
    await add(queue, 3, queue="billing")

    stats = await queue.stats(QUEUE)

    assert stats.queue == QUEUE
    assert (
        stats.waiting,
        stats.delayed,
        stats.active,
        stats.completed,
        stats.failed,
        stats.cancelled,
        stats.dead,
    ) == (2, 1, 1, 1, 1, 1, 1)
    billing = await queue.stats("billing")
    assert (billing.waiting, billing.active, billing.completed) == (3, 0, 0)
    empty = await queue.stats("unused")
    assert empty.model_dump() == {
        "queue": "unused",
        "waiting": 0,
        "active": 0,
        "completed": 0,
        "failed": 0,
        "delayed": 0,
        "dead": 0,
        "cancelled": 0,
    }


async def test_a_delayed_job_whose_time_has_come_counts_as_waiting_since_it_came(
    queue: JobQueue,
) -> None:
    """Of the delayed jobs, those due are waiting (a claim takes them) and those later are
    delayed; the queue's oldest wait counts a due one from its time. Counted by index now (a
    backlog of later jobs was read row by row), the split is the contract's."""
    [(due, _)] = await add(queue, run_at=after(-60))
    await add(queue, 2)
    await add(queue, 3, run_at=after(3600))

    stats = await queue.stats(QUEUE)

    assert (stats.waiting, stats.delayed, stats.active) == (3, 3, 0)
    oldest = await queue.oldest_waiting(QUEUE)
    assert oldest is not None and due.run_at is not None
    assert abs((oldest - max(due.created_at, due.run_at)).total_seconds()) < 0.001
    assert await queue.oldest_waiting("unused") is None


async def test_a_job_claimed_but_not_handed_out_counts_as_waiting(queue: JobQueue) -> None:
    # A queue may claim ahead of what was asked; what it did not hand out nobody runs yet.
    made = await add(queue, 3)
    await queue.claim(QUEUE, 1, "w1", LONG)

    stats = await queue.stats(QUEUE)

    assert (stats.waiting, stats.active) == (2, 1)
    # And it has waited since it was made: the oldest of them, the second job added.
    oldest = await queue.oldest_waiting(QUEUE)
    assert oldest is not None
    assert abs((oldest - made[1][0].created_at).total_seconds()) < 0.001


async def test_claim_ahead_keeps_jobs_for_claim_nowait_each_of_them_handed(
    queue: JobQueue,
) -> None:
    """A queue that claims ahead claims more on request (the worker tops up while its slots
    are busy with short jobs): leased to the worker, in priority order, kept for
    `claim_nowait`, each `handed` in the database (they start within moments, and their starts
    are not committed before their code runs), counted by `ahead` and as waiting. A queue that
    does not claim ahead claims nothing."""
    made = []
    for priority in (0, 5, 0):
        made += await add(queue, priority=priority)
    ids = [job.id for job, _ in made]

    got = await queue.claim_ahead(QUEUE, 2, "w1", LONG)

    stats = await queue.stats(QUEUE)
    assert (stats.waiting, stats.active) == (3, 0)
    if not queue.claims_ahead:
        assert (got, queue.ahead(QUEUE)) == (0, 0)
        return
    assert (got, queue.ahead(QUEUE)) == (2, 2)
    stored = await job_of(queue, ids[1])
    assert (stored.state, stored.worker, stored.handed) == (JobState.ACTIVE, "w1", True)
    taken = [queue.claim_nowait(QUEUE, "w1", LONG) for _ in range(2)]
    assert [c.job.id for c in taken if c is not None] == [ids[1], ids[0]]
    assert all(c is not None and c.job.handed for c in taken)
    assert queue.ahead(QUEUE) == 0
    assert await queue.claim_ahead(QUEUE, 5, "w1", LONG) == 1
    assert await queue.claim_ahead(QUEUE, 5, "w1", LONG) == 0


async def test_a_delayed_job_counts_as_waiting_once_due(queue: JobQueue) -> None:
    due = after(0.2)
    await add(queue, run_at=due)
    assert (await queue.stats(QUEUE)).delayed == 1

    await anyio.sleep(due.timestamp() - time.time() + 0.02)

    stats = await queue.stats(QUEUE)
    assert (stats.waiting, stats.delayed) == (1, 0)


async def test_dead_letters_are_newest_first(queue: JobQueue) -> None:
    made = await add(queue, 3)
    claims = await queue.claim(QUEUE, 3, "w1", LONG)
    for claim in claims:
        dead = JobUpdate(state=JobState.DEAD, error=f"dead {claim.job.id}")
        assert await queue.apply(Transition(claim.job.id, claim.job.epoch, dead))
    await add(queue, 1, queue="billing")

    letters = await queue.dead_letters(QUEUE)

    ids = [job.id for job, _ in made]
    assert [job.id for job in letters] == ids[::-1]
    assert all(job.state is JobState.DEAD and job.error == f"dead {job.id}" for job in letters)
    assert [job.id for job in await queue.dead_letters(QUEUE, limit=2)] == ids[:0:-1]
    assert await queue.dead_letters("billing") == []


async def test_gated_lists_the_jobs_held_behind_a_concurrency_key_in_claim_order(
    queue: JobQueue,
) -> None:
    made = await add(queue, 5)
    claims = await queue.claim(QUEUE, 5, "w1", LONG)
    gates = [
        {"gate": "concurrency", "key": "k", "until": 1.0},
        {"gate": "concurrency", "key": "other", "until": 1.0},
        {"gate": "rate", "key": "k", "until": 1.0},  # a rate limit's hold, of the same key
        None,  # a plain retry backoff
        {"gate": "concurrency", "key": "k", "until": 1.0},
    ]
    for claim, gate in zip(claims, gates, strict=True):
        meta = {"gate": gate} if gate is not None else {}
        held = JobUpdate(state=JobState.DELAYED, run_at=after(60), meta=meta)
        assert await queue.apply(Transition(claim.job.id, claim.job.epoch, held))
    ids = [job.id for job, _ in made]

    assert [job.id for job in await queue.gated(QUEUE, "k", 10)] == [ids[0], ids[4]]
    assert [job.id for job in await queue.gated(QUEUE, "k", 1)] == [ids[0]]
    assert all(j.state is JobState.DELAYED for j in await queue.gated(QUEUE, "k", 10))
    assert await queue.gated("billing", "k", 10) == []
    # A job of a higher priority goes first, as a claim would take it.
    [(urgent, _)] = await add(queue, 1, priority=5)
    [claim] = await queue.claim(QUEUE, 1, "w1", LONG)
    held = JobUpdate(state=JobState.DELAYED, run_at=after(60), meta={"gate": gates[0]})
    assert await queue.apply(Transition(claim.job.id, claim.job.epoch, held))
    assert [job.id for job in await queue.gated(QUEUE, "k", 10)] == [urgent.id, ids[0], ids[4]]
    # Once due again (woken, or its backoff over), a job is no longer held.
    urgent_now = await job_of(queue, urgent.id)
    due = JobUpdate(state=JobState.WAITING, meta=urgent_now.meta)
    assert await queue.apply(Transition(urgent.id, urgent_now.epoch, due))
    first = await job_of(queue, ids[0])
    due = JobUpdate(state=JobState.WAITING, meta=first.meta)
    assert await queue.apply(Transition(first.id, first.epoch, due))
    assert [job.id for job in await queue.gated(QUEUE, "k", 10)] == [ids[4]]


async def test_held_by_lists_the_active_jobs_of_these_workers(queue: JobQueue) -> None:
    [(one, _)] = await add(queue)
    await claim_one(queue, "w1")
    [(two, _)] = await add(queue)
    await claim_one(queue, "w2")
    [(_, run)] = await add(queue)
    finished = await claim_one(queue, "w1")
    assert await queue.apply(done(finished, run))

    assert [job.id for job in await queue.held_by(["w1"])] == [one.id]
    assert sorted(job.id for job in await queue.held_by(["w1", "w2"])) == sorted([one.id, two.id])
    assert await queue.held_by(["w3"]) == []
    assert await queue.held_by([]) == []


async def test_purge_forgets_finished_jobs_that_ended_before_the_cut_off(queue: JobQueue) -> None:
    made = await add(queue, 5)
    claims = await queue.claim(QUEUE, 5, "w1", LONG)
    states = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.DEAD)
    for claim, state in zip(claims, states, strict=False):
        assert await queue.apply(Transition(claim.job.id, claim.job.epoch, JobUpdate(state=state)))
    [(waiting, _)] = await add(queue)
    ids = [job.id for job, _ in made]

    assert await queue.purge(after(-3600)) == 0  # all of them ended after that
    assert await queue.purge(after(1)) == 3

    for job_id in ids[:3]:
        assert await queue.get_job(job_id) is None
    assert (await job_of(queue, ids[3])).state is JobState.DEAD  # dead letters stay
    assert (await job_of(queue, ids[4])).state is JobState.ACTIVE
    assert (await job_of(queue, waiting.id)).state is JobState.WAITING
    stats = await queue.stats(QUEUE)
    assert (stats.completed, stats.failed, stats.cancelled, stats.dead) == (0, 0, 0, 1)
    assert await queue.purge(after(1)) == 0


async def test_purge_forgets_at_most_limit_jobs_at_a_time(queue: JobQueue) -> None:
    # One DELETE of every finished job held the SQLite writer, and every job's write with it,
    # for as long as it took (the janitor now deletes them in chunks, resting between).
    made = await add(queue, 5)
    for claim in await queue.claim(QUEUE, 5, "w1", LONG):
        update = JobUpdate(state=JobState.COMPLETED)
        assert await queue.apply(Transition(claim.job.id, claim.job.epoch, update))
    assert [await queue.purge(after(1), limit=2) for _ in range(4)] == [2, 2, 1, 0]
    assert [await queue.get_job(job.id) for job, _ in made] == [None] * 5
    assert (await queue.stats(QUEUE)).completed == 0


async def test_get_job_of_an_unknown_id_is_none(queue: JobQueue) -> None:
    assert await queue.get_job("job_nobody") is None


async def test_get_jobs_reads_the_jobs_it_has_as_they_are_now(queue: JobQueue) -> None:
    made = await add(queue, 3)
    claim = await claim_one(queue)
    ids = [job.id for job, _ in made]

    jobs = {job.id: job for job in await queue.get_jobs([*ids, "job_nobody"])}

    assert set(jobs) == set(ids)  # the unknown id left out
    # As they are now: the claimed one held (the others may be claimed ahead: not asserted).
    held = jobs[claim.job.id]
    assert (held.state, held.worker, held.epoch) == (JobState.ACTIVE, "w1", claim.job.epoch)
    assert await queue.get_jobs([]) == []


async def test_get_jobs_reads_more_ids_than_one_statement_names(queue: JobQueue) -> None:
    made = await add(queue, 1200)
    ids = [job.id for job, _ in made]
    assert sorted(job.id for job in await queue.get_jobs(ids)) == sorted(ids)


# ---- two processes on one database -------------------------------------------------------
@pytest.fixture
def other_queue(other_backend: Backend, queue_case: QueueCase) -> JobQueue:
    return other_backend.queue(queue_case.provider)


two_processes = pytest.mark.parametrize("queue_case", SHARED_QUEUES, indirect=True, ids=str)


@two_processes
async def test_concurrent_claims_never_hand_a_job_to_both(
    queue: JobQueue, other_queue: JobQueue
) -> None:
    made = await add(queue, 200)
    taken: dict[str, list[str]] = {"w1": [], "w2": []}

    async def drain(from_queue: JobQueue, worker: str) -> None:
        for _ in range(len(made) + 1):  # a job handed out twice would keep this going
            claims = await from_queue.claim(QUEUE, 1, worker, LONG)
            if not claims:
                return
            taken[worker] += [c.job.id for c in claims]
            await anyio.lowlevel.checkpoint()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain, queue, "w1")
            tg.start_soon(drain, other_queue, "w2")

    # Which process gets how many is up to the database's locks (one may get them all).
    assert not set(taken["w1"]) & set(taken["w2"])
    assert sorted(taken["w1"] + taken["w2"]) == sorted(job.id for job, _ in made)


@two_processes
async def test_a_job_held_back_for_another_worker_is_passed_over_by_the_one_that_held_it(
    queue: JobQueue, other_queue: JobQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`held_for.py`: a worker that left a job to another deployment's (or version's)
    worker claimed it back, a second at a time, whenever both looked as it fell due."""
    [(job, _)] = await add(queue)
    claim = await claim_one(queue, "w1")
    due = after(0.2)
    window_s = 3.0
    meta = held_for({}, "w1", time.time(), due.timestamp(), window_s)
    hold = JobUpdate(state=JobState.DELAYED, run_at=due, meta=meta)
    assert await queue.apply(Transition(job.id, claim.job.epoch, hold))

    # Due, and passed over by the worker that held it: its claim waits on for nothing, and
    # does not take the passed-over job's time for a moment to look again (it looked again
    # at once, some 800 times in this second, on SQLite).
    assert isinstance(queue, DatabaseQueue)
    looks = 0
    look = queue._look

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal looks
        looks += 1
        return await look(*args, **kwargs)

    monkeypatch.setattr(queue, "_look", counted)
    with anyio.fail_after(5):
        assert await queue.claim(QUEUE, 1, "w1", LONG, timeout=1.0) == []
    # At the start, as it fell due, and for any other commit heard: a few, not hundreds.
    assert looks <= 10, looks
    assert time.time() < due.timestamp() + window_s  # (still in the window: the test holds)
    # The worker it was left to (in another process) takes it.
    with anyio.fail_after(5):
        [taken] = await other_queue.claim(QUEUE, 1, "w2", LONG, timeout=2.0)
    assert taken.job.id == job.id
    # Given back by that one: once the window is over, the first worker claims it again
    # (the worker it was left to is gone, or busy).
    back = JobUpdate(state=JobState.DELAYED, run_at=after(0.1))
    assert await other_queue.apply(Transition(job.id, taken.job.epoch, back))
    with anyio.fail_after(15):
        claims: list[Claim] = []
        while not claims:
            claims = await queue.claim(QUEUE, 1, "w1", LONG, timeout=0.5)
    assert claims[0].job.id == job.id
    assert time.time() >= due.timestamp() + window_s


@two_processes
async def test_claims_taking_turns_between_processes_share_the_jobs_out(
    queue: JobQueue, other_queue: JobQueue
) -> None:
    made = await add(queue, 12)
    taken: dict[str, list[str]] = {"w1": [], "w2": []}
    turns = [(queue, "w1"), (other_queue, "w2")]

    for _ in range(len(made) + 1):  # a job handed out twice would keep this going
        claims = [await q.claim(QUEUE, 1, worker, LONG) for q, worker in turns]
        if not any(claims):
            break
        for (_, worker), got in zip(turns, claims, strict=True):
            taken[worker] += [c.job.id for c in got]

    assert taken["w1"] and taken["w2"]
    assert not set(taken["w1"]) & set(taken["w2"])
    assert sorted(taken["w1"] + taken["w2"]) == sorted(job.id for job, _ in made)


@two_processes
async def test_a_stale_process_writes_nowhere_after_a_takeover(
    backend: Backend, other_backend: Backend, queue: JobQueue, other_queue: JobQueue
) -> None:
    [(job, run)] = await add(queue)
    frozen = await claim_one(queue, "w1", lease_s=SHORT)
    await outlive_lease()
    taker = await claim_one(other_queue, "w2")
    assert (taker.taken_from, taker.job.id) == ("w1", job.id)
    cursor = await other_backend.runs.feed_cursor()

    # The frozen worker wakes up and writes what it had: progress, a line, its settle.
    late = run.model_copy(update={"status": RunStatus.RUNNING, "worker": "w1"})
    queue.record(late, frozen.fence)
    queue.record_log(run.id, line("woke up"), frozen.fence)
    queue.submit(done(frozen, run, error="late"))
    assert await queue.apply(done(frozen, run)) is False
    await backend.runs.flush()

    stored = await job_of(other_queue, job.id)
    assert (stored.state, stored.worker, stored.epoch) == (JobState.ACTIVE, "w2", taker.job.epoch)
    found = await other_backend.runs.get_run(run.id)
    assert found is not None and (found.status, found.worker) == (RunStatus.QUEUED, None)
    page = await other_backend.runs.feed(cursor)
    assert (page.runs, page.logs) == ([], [])
    # The worker that took over settles it.
    assert await other_queue.apply(done(taker, run))
    assert (await job_of(queue, job.id)).state is JobState.COMPLETED


@two_processes
async def test_jobs_handed_back_can_be_claimed_by_another_process(
    backend: Backend, queue: JobQueue, other_queue: JobQueue
) -> None:
    made = await add(queue, 3)
    [mine] = await queue.claim(QUEUE, 1, "w1", LONG)

    queue.return_ahead(QUEUE)
    await backend.runs.flush()

    theirs = await other_queue.claim(QUEUE, 5, "w2", LONG)
    assert sorted(c.job.id for c in theirs) == sorted(
        job.id for job, _ in made if job.id != mine.job.id
    )


@two_processes
async def test_a_process_does_not_hand_out_a_job_whose_lease_it_lost(
    queue: JobQueue, other_queue: JobQueue
) -> None:
    await add(queue, 2)
    [first] = await queue.claim(QUEUE, 1, "w1", SHORT)
    await outlive_lease()

    taken = await other_queue.claim(QUEUE, 5, "w2", LONG)
    assert {c.job.id: c.taken_from for c in taken}[first.job.id] == "w1"
    assert len(taken) == 2

    assert await queue.claim(QUEUE, 5, "w1", LONG) == []
    assert queue.claim_nowait(QUEUE, "w1", LONG) is None
    assert first.lease_lost()


@two_processes
async def test_a_job_added_by_another_process_is_claimed(
    queue: JobQueue, other_queue: JobQueue
) -> None:
    [(job, _)] = await add(other_queue)

    with anyio.fail_after(5):
        claims = await queue.claim(QUEUE, 1, "w1", LONG, timeout=4)

    assert [c.job.id for c in claims] == [job.id]


@two_processes
async def test_a_waiting_claim_finds_another_process_job_while_a_delayed_one_is_far_off(
    queue: JobQueue, other_queue: JobQueue
) -> None:
    # The delayed job an hour off must not stretch the claim's wait past its usual look.
    await add(queue, run_at=after(3600))
    claimed: list[Claim] = []

    async def wait_for_work() -> None:
        claimed.extend(await queue.claim(QUEUE, 1, "w1", LONG, timeout=30))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_work)
            await anyio.sleep(0.1)  # the claim looked, found nothing due, and waits
            [(job, _)] = await add(other_queue)

    assert [c.job.id for c in claimed] == [job.id]


@two_processes
async def test_stats_do_not_count_jobs_whose_lease_this_process_lost(
    queue: JobQueue, other_queue: JobQueue
) -> None:
    await add(queue, 4)
    await queue.claim(QUEUE, 1, "w1", SHORT)
    await outlive_lease()

    taken = await other_queue.claim(QUEUE, 4, "w2", LONG)
    for claim in taken:
        assert await other_queue.apply(done(claim, run_of(claim.job)))

    for stats in (await queue.stats(QUEUE), await other_queue.stats(QUEUE)):
        assert (stats.waiting, stats.active, stats.completed) == (0, 0, 4)
    assert (await queue.oldest_waiting(QUEUE), await other_queue.oldest_waiting(QUEUE)) == (
        None,
        None,
    )


@two_processes
async def test_a_pause_from_another_process_holds_claims_before_the_worker_hears_of_it(
    queue: JobQueue, other_backend: Backend
) -> None:
    # The operator in another process pauses; this process's worker has not followed the pause
    # yet (it does so about once a second), so the claim itself must read it.
    await other_backend.shared.set_paused(QUEUE, True)
    [(held, _)] = await add(queue)
    assert await queue.claim(QUEUE, 5, "w1", LONG) == []
    assert (await job_of(queue, held.id)).state is JobState.WAITING

    await other_backend.shared.set_paused(QUEUE, False)
    assert [c.job.id for c in await queue.claim(QUEUE, 5, "w1", LONG)] == [held.id]


@two_processes
async def test_a_pause_from_another_process_still_lets_a_forced_job_through(
    queue: JobQueue, other_backend: Backend
) -> None:
    # An operator ran one job now ("force") on a queue another process paused; the worker here
    # has not heard of the pause, so its claim is a plain one: it must take the forced job and
    # leave the other.
    [(plain, _), (forced, _)] = await add(queue, 2)
    stored = await job_of(queue, forced.id)
    now = JobUpdate(state=JobState.WAITING, force=True)
    assert await queue.apply(Transition(forced.id, stored.epoch, now))
    await other_backend.shared.set_paused(QUEUE, True)

    assert [c.job.id for c in await queue.claim(QUEUE, 5, "w1", LONG)] == [forced.id]
    assert (await job_of(queue, plain.id)).state is JobState.WAITING
