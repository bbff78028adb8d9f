"""A node that misbehaves fails its own step, and nothing else, on memory, SQLite and
PostgreSQL: one that raises `CancelledError` itself (it is not the engine's stop), one that
returns a value a database cannot store (NaN, Infinity, an int too long for JSON, a key that is
not a string, a NUL), one whose idempotency key cannot be made. A log call whose arguments do
not fit its format fails nothing at all."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from support import any_database

from engine import Engine, Run, RunStatus, Step, StepStatus, WorkerTrigger, Workflow

pytestmark = pytest.mark.anyio


database = any_database  # the fixture: each of DATABASES in turn (tests/support.py)


def one_step(name: str, node: Any, **step: Any) -> Workflow:
    return Workflow(name=name, trigger=WorkerTrigger(queue=name), steps=[Step("s", node, **step)])


async def finished(engine: Engine, queue: str, body: Any = None) -> Run:
    """The job's run once it ends, as read back from the database (what another process sees)."""
    run = await engine.wait_for_job(await engine.enqueue(queue, body or {}), timeout=20)
    return await engine.get_run(run.id)


async def raises_cancelled(ctx: Any) -> None:
    raise asyncio.CancelledError()


def raises_cancelled_in_a_thread(ctx: Any) -> None:
    raise asyncio.CancelledError()


async def awaits_a_cancelled_task(ctx: Any) -> None:
    # A task of its own, cancelled, awaited: its CancelledError comes out of the node.
    task = asyncio.create_task(asyncio.sleep(3600))
    await asyncio.sleep(0)
    task.cancel()
    await task


async def test_a_cancelled_error_a_node_raises_fails_its_step(
    database: Path | str | None,
) -> None:
    """Taken for the engine's own stop, it sent the job back to the queue to be taken again at
    once, for ever (memory), or ended the worker's task group (SQLite, PostgreSQL)."""
    nodes = {
        "own": raises_cancelled,
        "thread": raises_cancelled_in_a_thread,
        "task": awaits_a_cancelled_task,
    }
    flows = [one_step(name, node) for name, node in nodes.items()]
    flows.append(one_step("fine", lambda ctx: "ok"))
    async with Engine(workflows=flows, database=database) as engine:
        for name in nodes:
            run = await finished(engine, name)
            assert run.status is RunStatus.FAILED, run
            assert run.error is not None and "s failed: CancelledError" in run.error, run.error
            assert [run.id] == [r.id for r in await engine.runs(queue=name)]  # taken once
        # The engine goes on serving.
        assert (await finished(engine, "fine")).output == "ok"


UNSTORABLE = {
    "nan": (float("nan"), "holds NaN at $: not standard JSON"),
    "infinity": ({"a": [1, float("inf")]}, "holds Infinity at $.a[1]: not standard JSON"),
    "long_int": (10**5000, "is an integer of more than 4,300 digits"),
    "int_key": ({1: "a"}, "has a key 1 (int) at $: JSON object keys are strings"),
    "nul": ("a\x00b", "holds a NUL character at $"),
}


async def test_a_return_value_no_database_stores_fails_its_step(
    database: Path | str | None,
) -> None:
    """PostgreSQL refused the run's write after the step passed (the run stayed `running` for
    every other reader); an int too long for JSON ended the database's writer."""

    def returning(value: Any) -> Any:
        return lambda ctx: value

    flows = [one_step(name, returning(value)) for name, (value, _) in UNSTORABLE.items()]
    flows.append(one_step("fine", lambda ctx: {"n": 1.5}))
    async with Engine(workflows=flows, database=database) as engine:
        for name, (_, why) in UNSTORABLE.items():
            run = await finished(engine, name)
            assert run.status is RunStatus.FAILED, (name, run)
            assert run.error is not None and f"the return value of s {why}" in run.error, (
                name,
                run.error,
            )
            assert run.steps[0].output is None
        assert (await finished(engine, "fine")).output == {"n": 1.5}


async def test_a_log_call_whose_arguments_do_not_fit_fails_nothing(
    database: Path | str | None,
) -> None:
    def logs_badly(ctx: Any) -> str:
        ctx.logger.info("%s and %s", 1)
        ctx.logger.warning("%d", "x")
        return "ok"

    async with Engine(workflows=[one_step("logs", logs_badly)], database=database) as engine:
        run = await finished(engine, "logs")
    assert run.status is RunStatus.COMPLETED, run
    assert [line.message for line in run.steps[0].logs] == [
        "%s and %s (1,) (the log call's arguments do not fit its format: TypeError: not "
        "enough arguments for format string)",
        "%d ('x',) (the log call's arguments do not fit its format: TypeError: %d format: "
        "a real number is required, not str)",
    ]


async def test_a_name_the_context_does_not_have_is_said_with_the_one_meant() -> None:
    # `ctx.log.info(...)`, the name other engines use, failed with "'Context' object has no
    # attribute 'log'": the user had to find `ctx.logger` in the docs.
    def logs(ctx: Any) -> None:
        ctx.log.info("hello")

    def reads(ctx: Any) -> None:
        print(ctx.payload["order_id"])

    flows = [one_step("logs", logs), one_step("reads", reads)]
    async with Engine(workflows=flows) as engine:
        logged, read = [await finished(engine, queue) for queue in ("logs", "reads")]
    assert "AttributeError: the context has no attribute 'log': did you mean ctx.logger?" in (
        logged.steps[0].error or ""
    ), logged.steps[0].error
    assert "the context has no attribute 'payload': did you mean ctx.body?" in (
        read.steps[0].error or ""
    ), read.steps[0].error


async def test_an_idempotency_key_that_cannot_be_made_is_said_so(
    database: Path | str | None,
) -> None:
    flow = one_step(
        "charge",
        lambda ctx, oid: oid,
        inputs={"oid": "$.body.oid"},
        idempotency_key="$.body.missing",
    )
    async with Engine(workflows=[flow], database=database) as engine:
        run = await finished(engine, "charge", {"oid": "A1"})
    assert run.steps[0].status is StepStatus.FAILED
    assert run.steps[0].error == (
        "bad idempotency key: $.body.missing: $.body has no key 'missing' (it has oid)"
    )


async def test_a_node_that_changes_its_body_changes_nobody_elses(
    database: Path | str | None,
) -> None:
    """`ctx.body` was the job's payload itself (and, on memory or straight from enqueue, the
    enqueuer's dict): a node that changed it changed the run's recorded input, what the job's
    next delivery ran on, and the next job enqueued with the same dict."""

    def changes_its_body(ctx: Any) -> Any:
        seen = dict(ctx.body, items=list(ctx.body["items"]))
        ctx.body["items"].append("mine")
        ctx.body["new"] = True
        if ctx.job.attempt == 1 and ctx.body["fail_first"]:
            raise RuntimeError("first delivery fails")
        return seen

    flow = Workflow(
        name="changes",
        trigger=WorkerTrigger(queue="changes", retries=1, delay=1),
        steps=[Step("s", changes_its_body)],
    )
    payload = {"items": ["a"], "fail_first": False}
    async with Engine(workflows=[flow], database=database) as engine:
        first = await finished(engine, "changes", payload)
        second = await finished(engine, "changes", payload)
        retried = await finished(engine, "changes", {"items": ["b"], "fail_first": True})
    assert payload == {"items": ["a"], "fail_first": False}
    for run in (first, second):
        assert run.input == {"items": ["a"], "fail_first": False}
        assert run.output == {"items": ["a"], "fail_first": False}
    # The job's second delivery ran on its payload as enqueued.
    assert retried.job_attempt == 2 and retried.status is RunStatus.COMPLETED
    assert retried.output == {"items": ["b"], "fail_first": True}
