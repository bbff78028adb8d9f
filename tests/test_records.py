"""engine.records.construct builds the same records as pydantic's model_construct."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support import DATABASES, DURABLE, a_database, provider_of, raised_at

from engine import Engine, Step, WorkerTrigger, Workflow
from engine.context import Context
from engine.models import Attempt, AttemptStatus, Job, LogLine, Run, RunStatus, StepRun
from engine.records import assign, construct, copy_run
from engine.runner import Runner


def test_construct_matches_model_construct() -> None:
    fields = {name: None for name in Attempt.model_fields}
    fields.update(number=1, status=AttemptStatus.RUNNING, started_at=None)
    fast = construct(Attempt, dict(fields))
    slow = Attempt.model_construct(**fields)
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_fields_set == slow.model_fields_set
    fast.error = "boom"  # assignment still goes through pydantic and is recorded
    assert fast.error == "boom" and "error" in fast.model_fields_set


def test_assign_sets_what_setattr_sets() -> None:
    now = datetime.now(UTC)
    # One built by the engine (every field set, the class's shared set) and one by pydantic
    # with some fields left to their defaults (a set of its own).
    fields = {name: None for name in Attempt.model_fields}
    fields.update(number=1, status=AttemptStatus.RUNNING, started_at=now)
    for made in (
        lambda: construct(Attempt, dict(fields)),
        lambda: Attempt(number=1, started_at=now),
    ):
        fast, slow = made(), made()
        assign(fast, status=AttemptStatus.COMPLETED, finished_at=now, error="late")
        slow.status, slow.finished_at, slow.error = AttemptStatus.COMPLETED, now, "late"
        assert fast.model_dump() == slow.model_dump()
        assert fast.model_fields_set == slow.model_fields_set
        assert fast.model_dump(exclude_unset=True) == slow.model_dump(exclude_unset=True)
    shared = construct(Attempt, dict(fields)).model_fields_set
    assign(construct(Attempt, dict(fields)), error="x")
    assert shared == set(Attempt.model_fields)  # the class's shared set is not grown


async def noop(ctx: object) -> dict[str, int]:
    return {"ok": 1}


@pytest.mark.anyio
async def test_hot_path_records_carry_every_field() -> None:
    workflow = Workflow(
        name="records",
        trigger=WorkerTrigger(queue="records", provider="memory"),
        steps=[Step("noop", noop)],
    )
    async with Engine(workflows=[workflow]) as engine:
        job_id = await engine.enqueue("records", {"a": 1})
        run = await engine.wait_for_job(job_id, timeout=10)
        job = await engine.get_job(job_id)
    assert set(run.__dict__) == set(Run.model_fields)
    assert set(job.__dict__) == set(Job.model_fields)
    (step,) = run.steps
    assert set(step.__dict__) == set(StepRun.model_fields)
    assert set(step.attempts[0].__dict__) == set(Attempt.model_fields)
    assert run.status == "completed" and step.output == {"ok": 1}


def test_prepare_records_carry_every_field() -> None:
    workflow = Workflow(name="prep", steps=[Step("a", noop), Step("b", noop)])
    run = Run.model_construct(id="r", steps=[])
    Runner.prepare(workflow, run)
    assert [set(s.__dict__) == set(StepRun.model_fields) for s in run.steps] == [True, True]


def test_copy_run_is_a_record_of_its_own() -> None:
    now = datetime.now(UTC)
    attempt = Attempt(number=1, status=AttemptStatus.FAILED, started_at=now)
    line = LogLine(ts=now, level="info", message="hello")
    step = StepRun(index=0, name="a", attempts=[attempt], logs=[line], tags=["t"])
    run = Run(
        id="r",
        workflow_name="w",
        workflow_version="v",
        queue="q",
        job_id="j",
        status=RunStatus.RUNNING,
        created_at=now,
        headers={"x": "1"},
        cursor=[0],
        state={"a": 1},
        steps=[step],
        logs=[line],
    )
    before = run.model_dump()

    copy = copy_run(run)
    assert copy.model_dump() == before
    copy.status = RunStatus.FAILED
    copy.cursor.append(1)
    copy.state["b"] = 2
    copy.headers["y"] = "2"
    copy.logs.append(line)
    copy.steps[0].attempts[0].error = "boom"
    copy.steps[0].attempts.append(attempt)
    copy.steps[0].logs.clear()
    copy.steps[0].tags.append("u")
    copy.steps.append(step)

    assert run.model_dump() == before


def test_copies_of_records_do_not_share_what_they_set() -> None:
    fields = {name: None for name in Attempt.model_fields}
    fields.update(number=1, status=AttemptStatus.RUNNING)
    one = construct(Attempt, dict(fields))
    other = construct(Attempt, dict(fields))
    changed = one.model_copy(update={"error": "boom"})
    assert (changed.error, one.error, other.error) == ("boom", None, None)
    assert one.model_fields_set == other.model_fields_set == set(Attempt.model_fields)


async def logs(ctx: Context) -> dict[str, int]:
    ctx.logger.info("a line")
    return {"ok": 1}


async def fail(ctx: Context) -> None:
    raise ValueError("no")


@pytest.mark.anyio
@pytest.mark.parametrize("kind", DATABASES)
async def test_a_finished_job_leaves_no_reference_cycle_behind(kind: str, tmp_path: Path) -> None:
    """What a job needed is freed as it ends, not left to the cyclic garbage collector, whose
    collections then come more often and walk every record kept alive meanwhile. The cycles
    found: a run's context and its log sink (it held the context strongly; the collector ran a
    third more often), and on SQLite an add handed to a sleeping claim (the add's function,
    its pending hand-off and the claim's offer held each other: 6 % of a job at N = 5,000).
    One job at a time, as here, is an add handed to the claim asleep on the queue. And a step
    that failed for good: its frame kept the node's error, whose traceback keeps the frame."""
    async with a_database(kind, tmp_path) as database:
        provider = "memory" if database is None else provider_of(str(database))
        workflows = [
            Workflow(
                name=name,
                trigger=WorkerTrigger(queue=name, provider=provider, concurrency=2),
                steps=steps,
            )
            for name, steps in (
                ("cycles", [Step("noop", noop), Step("logs", logs)]),
                ("fails", [Step("fail", fail)]),
            )
        ]
        async with Engine(workflows=workflows, database=database) as engine:

            async def job(i: int) -> None:
                run = await engine.wait_for_job(await engine.enqueue("cycles", {"i": i}), 10)
                assert run.status is RunStatus.COMPLETED and run.steps[1].logs
                run = await engine.wait_for_job(await engine.enqueue("fails", {"i": i}), 10)
                assert run.status is RunStatus.FAILED
                assert run.error == f"[step 1/1] fail failed: no (at {raised_at(fail)})"

            await assert_no_cycle_a_job(job)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", DURABLE)
async def test_a_producers_wait_leaves_no_reference_cycle_behind(kind: str, tmp_path: Path) -> None:
    """A producer engine waits for jobs another engine (another process, to it) runs: it
    watches the database and its own ends at once. Watching both with a task that was
    cancelled at each change left a reference cycle a change (in anyio's own frames)."""
    async with a_database(kind, tmp_path) as database:
        workflow = Workflow(
            name="cycles",
            trigger=WorkerTrigger(queue="cycles", provider=provider_of(str(database))),
            steps=[Step("noop", noop)],
        )
        async with (
            Engine(workflows=[workflow], database=database),
            Engine(database=database) as producer,
        ):

            async def job(i: int) -> None:
                run = await producer.wait_for_job(await producer.enqueue("cycles", {"i": i}), 10)
                assert run.status is RunStatus.COMPLETED

            await assert_no_cycle_a_job(job)


async def assert_no_cycle_a_job(job: Callable[[int], Awaitable[None]], n: int = 60) -> None:
    """`job(i)` for i in range(n) leaves no reference cycle a job: nothing for the cyclic
    collector but what was there already."""
    for i in range(5):  # first calls build caches that stay
        await job(i)
    gc.collect()
    gc.disable()
    # What an earlier test in this process lets go of meanwhile is garbage too (seen under
    # xdist: an earlier engine, its triggers, its tasks' cancellations and their tracebacks,
    # some hundred objects of a type), but it was made before: not counted.
    before = {id(o) for o in gc.get_objects()}
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for i in range(n):
            await job(i)
        gc.collect()
        left = Counter(type(o).__name__ for o in gc.garbage if id(o) not in before)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    # A cycle a job made would leave n of each object in it (counted by type, not in all: a
    # few made meanwhile may be another's).
    assert max(left.values(), default=0) < n, left.most_common(8)
