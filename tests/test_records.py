"""engine.records.construct builds the same records as pydantic's model_construct."""

from __future__ import annotations

import pytest

from engine import Engine, Step, WorkerTrigger, Workflow
from engine.models import Attempt, AttemptStatus, Job, Run, StepRun
from engine.records import construct
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
