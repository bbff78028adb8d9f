"""The Backend contract (engine/backends/base.py), run against every backend: its queues by
provider, finding a job in any of them, the change token another process moves, health."""

from __future__ import annotations

import time

import anyio
import pytest

from engine.backends import Backend
from engine.backends.base import JobUpdate, Transition
from engine.backends.memory import MemoryQueue
from engine.models import JobState, RunStatus

from .builders import QUEUE, a_run, finished_run, job_and_run, line
from .databases import DATABASES, MULTI_PROCESS

pytestmark = pytest.mark.anyio

PROVIDERS = ("memory", "sqlite", "postgres")  # every provider some backend serves


async def test_the_backend_is_what_its_kind_says(backend: Backend, database_kind: str) -> None:
    assert backend.kind == database_kind
    assert backend.multi_process is DATABASES[database_kind].multi_process
    assert backend.runs is not None and backend.shared is not None
    health = await backend.health()
    assert health["ok"] is True


async def test_its_clock_on_one_machine_is_this_processs(
    backend: Backend, database_kind: str
) -> None:
    """Every process on the database reads the backend's clock (the server's, for PostgreSQL):
    on one machine that is this process's own, unmoved by the noise of a reading; and a
    memory queue of a database keeps its jobs' times on the same clock as the database."""
    assert backend.clock.skew == 0.0
    before = time.time()
    assert before <= backend.clock.time() <= time.time()
    for provider in DATABASES[database_kind].providers:
        queue = backend.queue(provider)
        if isinstance(queue, MemoryQueue):
            assert queue.clock is backend.clock


async def test_each_provider_served_has_one_queue(backend: Backend, database_kind: str) -> None:
    served = DATABASES[database_kind].providers
    for provider in served:
        queue = backend.queue(provider)
        assert queue.provider == provider
        assert backend.queue(provider) is queue
    # The default is the database's own queue, listed first among those opened.
    assert backend.queue(None) is backend.queue(served[0])
    assert backend.queues[0] is backend.queue(None)
    assert {q.provider for q in backend.queues} == set(served)


async def test_a_provider_the_backend_does_not_serve_is_refused(
    backend: Backend, database_kind: str
) -> None:
    served = DATABASES[database_kind].providers
    for provider in [p for p in (*PROVIDERS, "redis") if p not in served]:
        with pytest.raises(ValueError, match=provider) as refused:
            backend.queue(provider)
        # The refusal says what to use instead: every provider this backend serves.
        for instead in served:
            assert repr(instead) in str(refused.value)


async def test_find_job_looks_in_every_queue(backend: Backend, database_kind: str) -> None:
    placed = {}
    for provider in DATABASES[database_kind].providers:
        queue = backend.queue(provider)
        job, run = job_and_run()
        assert await queue.add([job], [run]) == [job.id]
        placed[job.id] = queue

    for job_id, queue in placed.items():
        found = await backend.find_job(job_id)
        assert found is not None
        assert found[0] is queue
        assert (found[1].id, found[1].queue) == (job_id, QUEUE)
    assert await backend.find_job("job_nobody") is None


async def test_find_jobs_reads_many_ids_from_every_queue_at_once(
    backend: Backend, database_kind: str
) -> None:
    placed: dict[str, str] = {}
    for provider in DATABASES[database_kind].providers:
        made = [job_and_run() for _ in range(3)]
        assert (
            len(await backend.queue(provider).add([j for j, _ in made], [r for _, r in made])) == 3
        )
        placed.update((job.id, provider) for job, _ in made)
    asked = [*placed, "job_nobody", next(iter(placed))]  # an unknown id, a repeated one

    found = await backend.find_jobs(asked)

    assert set(found) == set(placed)
    assert all(job.id == job_id and job.queue == QUEUE for job_id, job in found.items())
    assert await backend.find_jobs([]) == {}


async def test_find_ended_reads_a_job_and_once_it_ended_its_whole_run(
    backend: Backend, database_kind: str
) -> None:
    """What a `wait_for_job` reads, in any queue: the job, and its run only once the job has
    ended, as the store has it (steps, attempts, log lines in their places)."""
    for provider in DATABASES[database_kind].providers:
        queue = backend.queue(provider)
        job, run = job_and_run()
        assert await queue.add([job], [run]) == [job.id]
        found = await backend.find_ended(job.id)
        assert found is not None and found[1] is None  # not ended: no run
        assert (found[0].id, found[0].state) == (job.id, JobState.WAITING)

        [claim] = await queue.claim(QUEUE, 1, "w1", 30.0)
        # Its lines on the record and with the transition, as the ledger writes them.
        on_run, on_step = line("on the run"), line("on a step", step=0)
        ended = finished_run(id=run.id, job_id=job.id, queue=QUEUE, logs=[on_run])
        ended.steps[0].logs = [on_step]
        update = JobUpdate(state=JobState.COMPLETED)
        lines = ((run.id, on_run), (run.id, on_step))
        assert await queue.apply(Transition(job.id, claim.job.epoch, update, (ended,), lines))
        found = await backend.find_ended(job.id)
        assert found is not None and found[1] is not None
        assert (found[0].id, found[0].state) == (job.id, JobState.COMPLETED)
        stored = await backend.runs.get_run(run.id)
        assert stored is not None and found[1].model_dump() == stored.model_dump()
        assert found[1].status is RunStatus.COMPLETED and found[1].output == ended.output
        assert [len(step.attempts) for step in found[1].steps] == [2, 0]
        assert [ln.message for ln in found[1].logs] == ["on the run"]
        assert [ln.message for ln in found[1].steps[0].logs] == ["on a step"]
    assert await backend.find_ended("job_nobody") is None


@pytest.mark.parametrize("database_kind", MULTI_PROCESS, indirect=True)
async def test_the_change_token_moves_when_another_process_commits(
    backend: Backend, other_backend: Backend
) -> None:
    token = await backend.change_token()
    assert await backend.wait_for_change(token, timeout=0.1) == token  # nothing happened

    other_backend.runs.save_run(a_run())
    await other_backend.runs.flush()

    with anyio.fail_after(5):
        moved = await backend.wait_for_change(token, timeout=4)
    assert moved != token


@pytest.mark.parametrize("database_kind", MULTI_PROCESS, indirect=True)
async def test_a_change_after_a_change_mark_shows_as_a_move(
    backend: Backend, other_backend: Backend
) -> None:
    """A mark may be older than the token (SQLite's is the last one read), never newer: a
    commit of another process after it is always seen."""
    mark = await backend.change_mark()
    other_backend.runs.save_run(a_run())
    await other_backend.runs.flush()
    with anyio.fail_after(5):
        moved = await backend.wait_for_change(mark, timeout=4)
    assert moved != mark
    mark = await backend.change_mark()
    assert mark in (moved, await backend.change_token())


@pytest.mark.parametrize("database_kind", MULTI_PROCESS, indirect=True)
async def test_the_change_token_moves_for_another_processes_job_writes(
    backend: Backend, other_backend: Backend
) -> None:
    queue = other_backend.queue(None)
    job, run = job_and_run()
    await queue.add([job], [run])
    token = await backend.change_token()

    [claim] = await queue.claim(QUEUE, 1, "w2", 30.0)

    with anyio.fail_after(5):
        assert await backend.wait_for_change(token, timeout=4) != token
    token = await backend.change_token()
    assert await queue.signal(job.id, claim.job.epoch, "cancel")
    with anyio.fail_after(5):
        assert await backend.wait_for_change(token, timeout=4) != token
