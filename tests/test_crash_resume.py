"""Where the next run of a run that crashed its worker goes on (engine/replay_seed.py), and where
it does not: the steps the crashed run completed are cached unless the workflow's version
changed, or a step's output was not stored as it was (`ephemeral`, or a secret hidden in it).
The whole path, with a worker killed -9 and one frozen: tests/test_crash.py."""

from __future__ import annotations

from typing import Any

from backends.builders import job_and_run, run_of

from engine import Step, WorkerTrigger, Workflow, for_each, subworkflow
from engine.models import Run, StepStatus
from engine.redact import REDACTED
from engine.replay_seed import _seed_after_crash
from engine.runner import Runner


def shop(**charge: Any) -> Workflow:
    return Workflow(
        name="shop",
        trigger=WorkerTrigger(queue="shop"),
        steps=[
            Step("charge", lambda ctx: 1, **charge),
            Step("pack", lambda ctx: 2),
            Step("ship", lambda ctx: 3),
        ],
    )


CHARGED = {"charged": 42}


def runs_of(workflow: Workflow, charged: Any = CHARGED) -> tuple[Run, Run]:
    """(a run that crashed in `pack` having completed `charge` with the output `charged`, the
    job's next run)."""
    job, _ = job_and_run("shop")
    crashed = run_of(job, workflow_version=workflow.version)
    Runner.prepare(workflow, crashed)
    crashed.steps[0].status, crashed.steps[0].output = StepStatus.COMPLETED, charged
    crashed.steps[1].status = StepStatus.FAILED
    return crashed, run_of(job, id="run_next", workflow_version=workflow.version)


def test_the_next_run_resumes_at_the_step_that_crashed_with_the_state_before_it() -> None:
    workflow = shop()
    crashed, fresh = runs_of(workflow)
    assert _seed_after_crash(workflow, fresh, crashed) == "'pack'"
    assert (fresh.cursor, fresh.state) == ([1], {"charge": {"charged": 42}})
    assert [s.status for s in fresh.steps] == ["cached", "pending", "pending"]
    assert fresh.steps[0].cached_from == crashed.id


def test_it_starts_over_where_the_crashed_run_is_not_one_to_go_on_from() -> None:
    workflow = shop()
    crashed, fresh = runs_of(workflow)
    # Another version: its steps may not be these.
    crashed.workflow_version = "0ld0ld00"
    assert _seed_after_crash(workflow, fresh, crashed) is None
    # The first step's output never stored (ephemeral), or stored with a secret hidden.
    for workflow, charged in ((shop(ephemeral=True), None), (shop(), f"token {REDACTED}")):
        crashed, fresh = runs_of(workflow, charged)
        assert _seed_after_crash(workflow, fresh, crashed) is None
        assert (fresh.cursor, fresh.state, fresh.steps) == ([], {}, [])
    # Nothing completed: nothing to go on from.
    workflow = shop()
    crashed, fresh = runs_of(workflow)
    crashed.steps[0].status = StepStatus.RUNNING
    assert _seed_after_crash(workflow, fresh, crashed) is None


def test_a_for_each_and_a_sub_workflow_go_on_with_what_the_crashed_run_had_done() -> None:
    """A for_each its items (fixed on its first pass) and those finished; a subworkflow step
    the child it started, which it follows: dispatched again, under the new run's id, it
    started a second child (tests/test_crash.py runs the for_each with a worker killed)."""
    workflow = Workflow(
        name="shop",
        trigger=WorkerTrigger(queue="shop"),
        steps=[
            Step("charge", lambda ctx: 1),
            for_each("each", items="$.body.items", steps=[Step("item", lambda ctx: 2)]),
            subworkflow("call", workflow="child"),
        ],
    )
    crashed, fresh = runs_of(workflow)
    crashed.steps[1].status = StepStatus.RUNNING
    crashed.steps[1].input = {"items": ["a", "b", "c"]}
    crashed.steps[1].output = {"done": {"0": 2}}
    assert _seed_after_crash(workflow, fresh, crashed) == "'each' (after 1 of its 3 items)"
    assert (fresh.steps[1].input, fresh.steps[1].output) == (
        {"items": ["a", "b", "c"]},
        {"done": {"0": 2}},
    )
    crashed, fresh = runs_of(workflow)
    crashed.steps[1].status = StepStatus.COMPLETED
    crashed.steps[1].output = [2, 2, 2]
    crashed.steps[2].status = StepStatus.WAITING
    crashed.steps[2].child_run_id = "run_child"
    crashed.steps[2].input = {"workflow": "child", "job_id": f"{crashed.id}.2", "input": {}}
    assert _seed_after_crash(workflow, fresh, crashed) == "'call' (its child run run_child)"
    assert fresh.steps[2].child_run_id == "run_child"
    assert fresh.steps[2].input == crashed.steps[2].input
    assert fresh.state == {"charge": CHARGED, "each": [2, 2, 2]}
