"""wait_for_job's hand-off: a settle made in this process tells the job's waiters once it is
committed, with the run it ended with if the fence let it land, and without (so they read the
job again) if it was refused. A waiter must never be handed a run whose transition did not
land: here a worker whose lease ran out settles after another worker took its job over."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from pg import fresh_database, need_server

from engine import Engine, Step, WorkerTrigger, Workflow
from engine import ledger as ledger_module
from engine import turns as turns_module
from engine.backends import Backend, open_backend
from engine.backends.base import Pace
from engine.events import EventBus
from engine.ledger import Ledger, make_job, make_run
from engine.models import JobState, RunStatus
from engine.records import copy_run
from engine.turns import SLICE_S

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


# ---- a wait that comes after the end ---------------------------------------------------------
# A script that submits a batch and then collects the results asks for most jobs after they
# ended. A job enqueued here and completed here keeps its run for that wait: no read. Only a
# completed run is kept (a failed job may be requeued by another process meanwhile), and only
# for the most recent `PARKED_MAX` jobs enqueued here; the others are read as before. A batch
# enqueued in one call (`enqueue_many`) is kept the same.


async def echo_or_fail(ctx: Any) -> int:
    if ctx.body["fail"]:
        raise ValueError(f"job {ctx.body['i']} fails")
    return int(ctx.body["i"])


def _batch_workflow() -> Workflow:
    # One slot: the jobs end in the order they were enqueued, so waiting for the last one
    # means every earlier one has ended, without waiting for them (which would be a hand-off).
    trigger = WorkerTrigger(queue="batch", concurrency=1, provider=None)
    return Workflow(name="batch", trigger=trigger, steps=[Step("echo", echo_or_fail)])


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def location(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str | None]:
    if request.param == "memory":
        yield None
    elif request.param == "sqlite":
        yield str(tmp_path / "blok.db")
    else:
        await need_server()
        async with fresh_database() as url:
            yield url


@contextmanager
def ids_read(owner: Any, method: str) -> Iterator[list[str]]:
    """The ids asked of `owner.method` (an async read by id) while inside."""
    read: list[str] = []
    real = getattr(owner, method)

    async def counted(ident: str) -> Any:
        read.append(ident)
        return await real(ident)

    setattr(owner, method, counted)
    try:
        yield read
    finally:
        delattr(owner, method)  # the instance attribute goes: the method is back


@contextmanager
def reads_counted(engine: Engine) -> Iterator[list[str]]:
    """The ids of the runs read while inside: from the engine's store, or with their jobs (a
    wait's read, `Backend.find_ended`, which may read both at once)."""
    backend = engine.backend
    real = backend.find_ended

    async def counted(job_id: str) -> Any:
        before = len(read)
        found = await real(job_id)
        if found is not None and found[1] is not None and len(read) == before:
            read.append(found[1].id)  # read with its job, not through the store's get_run
        return found

    wrapped = "find_ended" in vars(backend)  # inside job_reads_counted's own wrapper
    with ids_read(backend.runs, "get_run") as read:
        backend.find_ended = counted  # type: ignore[method-assign]
        try:
            yield read
        finally:
            if wrapped:
                backend.find_ended = real  # type: ignore[method-assign]
            else:
                del backend.find_ended  # the instance attribute goes: the method is back


async def _collect_after_the_end(
    engine: Engine, n: int, failing: set[int], *, one_call: bool = False
) -> tuple[list[str], list[str]]:
    """Enqueue n jobs (`one_call`: with one `enqueue_many`, the last one with them), wait until
    all ended, then count the store's run reads while each is waited for: the job ids, and the
    ids of the runs the waits had to read."""
    bodies = [{"i": i, "fail": i in failing} for i in range(n)] + [{"i": n, "fail": False}]
    if one_call:
        *ids, last = await engine.enqueue_many("batch", bodies)
    else:
        *ids, last = [await engine.enqueue("batch", body) for body in bodies]
    with anyio.fail_after(30):
        await engine.wait_for_job(last)
    with reads_counted(engine) as read:
        runs = [await engine.wait_for_job(job_id, timeout=30) for job_id in ids]
    for i, run in enumerate(runs):
        stored = await engine.get_run(run.id)
        assert run.model_dump() == stored.model_dump()  # what was handed over is the record
        assert run.status is (RunStatus.FAILED if i in failing else RunStatus.COMPLETED)
        assert run.output == (None if i in failing else i)
    return ids, read


@pytest.mark.parametrize("one_call", [False, True], ids=["enqueue", "enqueue_many"])
async def test_a_job_completed_before_its_wait_is_handed_over_without_a_read(
    location: str | None, one_call: bool
) -> None:
    async with Engine(workflows=[_batch_workflow()], database=location) as engine:
        ids, read = await _collect_after_the_end(engine, 12, failing={3, 7}, one_call=one_call)
        runs = {job_id: (await engine.get_job(job_id)).run_id for job_id in ids}
    # The completed ones came without a read; the failed ones were read (not kept).
    assert read == [runs[ids[3]], runs[ids[7]]]


async def test_past_the_cap_the_oldest_jobs_are_read(
    location: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger_module, "PARKED_MAX", 4)
    async with Engine(workflows=[_batch_workflow()], database=location) as engine:
        ids, read = await _collect_after_the_end(engine, 10, failing=set())
        runs = [(await engine.get_job(job_id)).run_id for job_id in ids]
    # The last job (the barrier) was waited for and taken; the 3 before it stayed kept.
    assert read == runs[:7]


async def test_jobs_done_before_their_enqueue_returned_are_handed_over_without_a_read(
    location: str | None,
) -> None:
    # Every add is a checkpoint: a slot free to take the next job may run it, and settle it,
    # before its enqueue returns. A job is watched before its add, so its run is kept all the
    # same. Two slots take turns with the producer: some jobs end inside their own enqueue.
    trigger = WorkerTrigger(queue="batch", concurrency=2, provider=None)
    wf = Workflow(name="batch", trigger=trigger, steps=[Step("echo", echo_or_fail)])
    async with Engine(workflows=[wf], database=location) as engine:
        _, read = await _collect_after_the_end(engine, 40, failing=set())
    assert read == []


async def test_enqueuing_a_done_job_again_keeps_its_run_for_the_wait(location: str | None) -> None:
    # The same job id enqueued again is not added (the first one stands); the run the first
    # one completed with here stays kept for the wait.
    async with Engine(workflows=[_batch_workflow()], database=location) as engine:
        first = await engine.enqueue("batch", {"i": 1, "fail": False}, job_id="job-once")
        barrier = await engine.enqueue("batch", {"i": 2, "fail": False})
        with anyio.fail_after(30):
            await engine.wait_for_job(barrier)  # one slot: the first job ended before it
        again = await engine.enqueue("batch", {"i": 9, "fail": False}, job_id="job-once")
        with reads_counted(engine) as read:
            run = await engine.wait_for_job(first, timeout=30)
    assert again == first
    assert run.output == 1
    assert read == []


# ---- a wait that comes before the end ---------------------------------------------------------
# A job enqueued here and not ended here yet needs no read when it is waited for: it ends here
# (its waiter hears it) or in another process, after a commit there that moves the change token
# read before the add (then it is read at once).


def job_reads_counted(engine: Engine) -> AbstractContextManager[list[str]]:
    """The ids of the jobs a wait read (`find_ended`) from the engine's backend while inside."""
    return ids_read(engine.backend, "find_ended")


GATE: dict[str, anyio.Event] = {}


async def gated(ctx: Any) -> int:
    await GATE[ctx.body["gate"]].wait()
    return int(ctx.body["i"])


async def test_a_wait_made_before_the_job_ends_here_reads_nothing(location: str | None) -> None:
    trigger = WorkerTrigger(queue="gated", concurrency=1, provider=None)
    wf = Workflow(name="gated", trigger=trigger, steps=[Step("gated", gated)])
    gate = GATE["before-the-end"] = anyio.Event()
    async with Engine(workflows=[wf], database=location) as engine:
        job_id = await engine.enqueue("gated", {"i": 5, "gate": "before-the-end"})
        runs = []

        async def wait() -> None:
            runs.append(await engine.wait_for_job(job_id, timeout=30))

        with job_reads_counted(engine) as jobs_read, reads_counted(engine) as runs_read:
            async with anyio.create_task_group() as group:
                group.start_soon(wait)
                await anyio.lowlevel.checkpoint()  # the wait is made while the job runs
                gate.set()
    assert [run.output for run in runs] == [5]
    assert (jobs_read, runs_read) == ([], [])


async def test_a_wait_for_other_processes_stops_when_the_job_ends_here(tmp_path: Path) -> None:
    """On a database other processes share, a wait also watches the database for changes (an
    end over there); the end here stops that watch at once. A watch left to run out would
    return the run only a second later. (On SQLite: this process's own commits do not move
    the change token, so nothing else ends the watch.)"""
    trigger = WorkerTrigger(queue="gated", concurrency=1, provider=None)
    wf = Workflow(name="gated", trigger=trigger, steps=[Step("gated", gated)])
    gate = GATE["ends-here"] = anyio.Event()
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        backend = engine.backend
        ran_out: list[float] = []
        watch = backend.wait_for_change

        async def watched(token: int, timeout: float, pace: Pace | None = None) -> int:
            moved = await watch(token, timeout, pace)
            if moved == token:
                ran_out.append(timeout)
            return moved

        backend.wait_for_change = watched  # type: ignore[method-assign]
        job_id = await engine.enqueue("gated", {"i": 7, "gate": "ends-here"})
        runs = []

        async def wait() -> None:
            runs.append(await engine.wait_for_job(job_id, timeout=30))

        async with anyio.create_task_group() as group:
            group.start_soon(wait)
            await anyio.lowlevel.checkpoint()  # the wait watches while the job runs
            gate.set()
        del backend.wait_for_change
    assert [run.output for run in runs] == [7]
    assert ran_out == []


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_job_enqueued_here_that_another_process_ended_is_read_at_once(
    kind: str, tmp_path: Path
) -> None:
    """A client enqueues; another engine on the database (another process, to the change
    token) runs the job and ends it before the client waits. The commit that ended it came
    after the token the client read before its add, so the wait reads the job at once rather
    than wait for the next change (a second, at most, with nothing else committing)."""
    trigger = WorkerTrigger(queue="batch", concurrency=1, provider=kind)
    wf = Workflow(name="batch", trigger=trigger, steps=[Step("echo", echo_or_fail)])
    async with contextlib.AsyncExitStack() as stack:
        if kind == "sqlite":
            database = str(tmp_path / "blok.db")
        else:
            await need_server()
            database = await stack.enter_async_context(fresh_database())
        worker = await stack.enter_async_context(Engine(workflows=[wf], database=database))
        client = await stack.enter_async_context(
            Engine(workflows=[wf], database=database, consume=False)
        )
        job_id = await client.enqueue("batch", {"i": 3, "fail": False})
        with anyio.fail_after(30):
            await worker.wait_for_job(job_id)  # ended over there, before the client waits
        run = await client.wait_for_job(job_id, timeout=0.8)  # the next look: 1 s
    assert run.output == 3


# ---- a caller whose awaits never wait ----------------------------------------------------------
class Turns:
    """How many turns of the event loop a task beside the code under test has had."""

    def __init__(self) -> None:
        self.count = 0


@contextlib.asynccontextmanager
async def turns_beside() -> AsyncIterator[Turns]:
    """A task beside the block that counts the turns the event loop gives it while the block
    runs (from after its first one), and stops with the block."""
    turns = Turns()

    async def tick() -> None:
        while True:
            turns.count += 1
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as group:
        group.start_soon(tick)
        await anyio.lowlevel.checkpoint()  # the ticker runs once
        turns.count = 0
        yield turns
        group.cancel_scope.cancel()


@pytest.mark.parametrize("ask", ["wait_for_job", "get_run", "get_job"])
async def test_a_loop_of_calls_that_find_their_answer_at_once_lets_other_tasks_run(
    location: str | None, ask: str
) -> None:
    # A job that has ended is found at once (in memory, or read in the loop's own thread from
    # SQLite): the call returns without a turn of the loop. A caller looping over such calls
    # (waiting for 100,000 jobs that have ended) held the loop for as long as its loop ran,
    # 7 s on SQLite: no other task of the process ran, and the watchdog said the loop was
    # blocked. The calls give the loop a turn once a slice (engine/turns.py).

    async with Engine(workflows=[_batch_workflow()], database=location) as engine:
        job_id = await engine.enqueue("batch", {"i": 1, "fail": False})
        run = await engine.wait_for_job(job_id, timeout=30)
        calls = {
            "wait_for_job": lambda: engine.wait_for_job(job_id, timeout=30),
            "get_run": lambda: engine.get_run(run.id),
            "get_job": lambda: engine.get_job(job_id),
        }
        call = calls[ask]
        async with turns_beside() as turns:
            ends = time.monotonic() + 5 * SLICE_S
            while time.monotonic() < ends:  # five slices' worth of calls, whatever they cost
                await call()
    assert turns.count >= 3


async def test_a_loop_of_waits_handed_their_runs_from_memory_lets_other_tasks_run(
    location: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A wait for a job enqueued and ended here takes its run from what the process kept
    # (`Ledger.parked`), with no read at all: it shares the slice too. With a slice of 0 every
    # such wait gives the loop a turn, so 40 of them let a task beside them run 40 times.
    monkeypatch.setattr(turns_module, "SLICE_S", 0.0)

    async with Engine(workflows=[_batch_workflow()], database=location) as engine:
        ids = [await engine.enqueue("batch", {"i": i, "fail": False}) for i in range(41)]
        with anyio.fail_after(30):
            await engine.wait_for_job(ids.pop())  # every job before it has ended too
        with reads_counted(engine) as read:
            async with turns_beside() as turns:
                runs = [await engine.wait_for_job(job_id, timeout=30) for job_id in ids]
    assert read == []  # every wait was handed its run: the path under test
    assert [run.output for run in runs] == list(range(40))
    assert turns.count >= 40
