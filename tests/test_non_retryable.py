"""Failures no retry can mend go to the dead-letter queue at once: a step whose input reads the
job's body where the body lacks it (every retry reads the same body), and a node that raises
`NonRetryable`. Failures a retry may mend keep their budgets."""

from __future__ import annotations

from typing import Any

import pytest
from support import any_database

from engine import (
    Engine,
    JobState,
    NonRetryable,
    Retry,
    RunStatus,
    Step,
    StepStatus,
    WorkerTrigger,
    Workflow,
    try_catch,
)

database = any_database
pytestmark = pytest.mark.anyio


async def charge(ctx: Any, order_id: str) -> str:
    return order_id


async def first(ctx: Any) -> dict[str, Any]:
    return {"shape": "not what the next step reads"}


calls: list[int] = []


async def declined(ctx: Any) -> None:
    calls.append(ctx.attempt)
    raise NonRetryable("card declined")


def flow(name: str, *steps: Any) -> Workflow:
    # A short backoff: a retry that should not happen would show within the test's wait.
    return Workflow(
        name=name, trigger=WorkerTrigger(queue=name, retries=3, delay="10ms"), steps=list(steps)
    )


async def runs_of(engine: Engine, job_id: str) -> list[Any]:
    job = await engine.get_job(job_id)
    return [run for run in await engine.runs(queue=job.queue, limit=100) if run.job_id == job_id]


async def test_a_body_without_what_a_step_reads_is_a_dead_letter_at_once(
    database: Any, caplog: pytest.LogCaptureFixture
) -> None:
    workflows = [flow("bodies", Step("charge", charge, inputs={"order_id": "$.body.order_id"}))]
    async with Engine(workflows=workflows, database=database) as engine:
        job_id = await engine.enqueue("bodies", {"orderid": "A1"})
        run = await engine.wait_for_job(job_id, timeout=10)
        assert run.status is RunStatus.FAILED
        assert "$.body" in (run.error or "") and "order_id" in (run.error or "")
        assert (await engine.get_job(job_id)).state is JobState.DEAD
        assert [run.id for run in await runs_of(engine, job_id)] == [run.id]
        assert [dead.job_id for dead in await engine.dead_letters("bodies")] == [job_id]
        said = [line.message for line in (await engine.get_run(run.id)).logs]
        assert any("not retried" in line and "--input" in line for line in said), said
    # The worker's line names the job `requeue` takes, with no parenthesis in a parenthesis.
    (line,) = [r.getMessage() for r in caplog.records if r.name == "blok.runs"]
    fate = f"({job_id} moved to the dead-letter queue, not retried: a retry reads the same body"
    assert line.startswith(f"bodies failed {fate}; replay the run with --input"), line
    assert "(" not in line.split("): [step 1/1]")[0].removeprefix("bodies failed ("), line


async def test_a_step_output_without_what_a_step_reads_keeps_its_retries(
    database: Any,
) -> None:
    # The next delivery runs `first` again and may return another shape: worth a retry.
    workflows = [
        flow(
            "outputs",
            Step("first", first),
            Step("charge", charge, inputs={"order_id": "$.state.first.order_id"}),
        )
    ]
    async with Engine(workflows=workflows, database=database) as engine:
        job_id = await engine.enqueue("outputs", {})
        run = await engine.wait_for_job(job_id, timeout=10)
        assert run.status is RunStatus.FAILED
        assert (await engine.get_job(job_id)).state is JobState.DEAD
        assert len(await runs_of(engine, job_id)) == 4  # the first delivery and 3 retries


async def test_a_node_raising_non_retryable_uses_neither_budget(database: Any) -> None:
    calls.clear()
    workflows = [flow("cards", Step("charge", declined, retry=Retry(max_attempts=3)))]
    async with Engine(workflows=workflows, database=database) as engine:
        job_id = await engine.enqueue("cards", {})
        run = await engine.wait_for_job(job_id, timeout=10)
        assert calls == [1]
        assert run.status is RunStatus.FAILED
        assert "card declined" in (run.error or "") and "not retried" in (run.error or "")
        step = run.steps[0]
        assert step.status is StepStatus.FAILED and len(step.attempts) == 1
        assert (await engine.get_job(job_id)).state is JobState.DEAD
        assert len(await runs_of(engine, job_id)) == 1


async def test_a_try_catch_still_catches_non_retryable(database: Any) -> None:
    calls.clear()

    async def fallback(ctx: Any) -> str:
        return "refunded"

    workflows = [
        flow(
            "caught",
            try_catch("pay", try_=[Step("charge", declined)], catch=[Step("fallback", fallback)]),
        )
    ]
    async with Engine(workflows=workflows, database=database) as engine:
        run = await engine.wait_for_job(await engine.enqueue("caught", {}), timeout=10)
        assert run.status is RunStatus.COMPLETED, run.error
        assert calls == [1]
