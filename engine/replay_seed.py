"""A replay from a step: the new run starts with the source run's records of the earlier steps,
as cached, so only `from_step` and what follows runs again."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from .backends.base import RunStore
from .errors import EngineError
from .ledger import AFTER_CRASH
from .models import Job, Run, StepRun, StepStatus, utcnow
from .redact import REDACTED
from .runner import Runner, pending_step
from .workflow import Workflow

# A step that ended and whose record says all a later step needs of it.
_DONE = (StepStatus.COMPLETED, StepStatus.CACHED, StepStatus.SKIPPED)


def seed_from_step(
    workflow_name: str,
    steps: Sequence[tuple[str, str]],
    workflow: Workflow | None,
    source: Run,
    run: Run,
    from_step: str,
) -> None:
    """Give `run`, a replay of `source` from `from_step`, the source's records of the steps
    before it (as cached: they do not run again) and the state they left, and start its cursor
    at `from_step`. `steps` are the workflow's top-level (name, kind); `workflow` is None when
    it is not loaded in this process (a producer replays for a worker elsewhere)."""
    names = [name for name, _ in steps]
    if from_step not in names:
        raise EngineError(
            f"workflow {workflow_name} has no step {from_step!r} (steps: {', '.join(names)})"
        )
    index = names.index(from_step)
    done = {s.name: s for s in source.steps}
    if workflow is not None:
        Runner.prepare(workflow, run)
    else:
        run.steps = [pending_step(i, name, kind) for i, (name, kind) in enumerate(steps)]
    for i in range(index):
        step = done.get(names[i])
        if step is None or step.status not in _DONE:
            raise EngineError(
                f"cannot replay from {from_step!r}: step {names[i]!r} did not complete in "
                f"run {source.id}"
            )
        record = run.steps[i]
        record.started_at = record.finished_at = utcnow()
        if step.status is StepStatus.SKIPPED:  # switched off (active=False): still is
            record.status = StepStatus.SKIPPED
            continue
        record.status = StepStatus.CACHED
        record.output = step.output
        record.input = step.input
        record.cached_from = source.id
        if steps[i][1] == "wait":  # nodes and primitives keep an output
            continue
        if workflow is None:
            run.state[names[i]] = step.output
            continue
        definition = workflow.steps[i]
        if definition.recorded and definition.runs:
            try:
                definition.keep(run.state, step.output)  # under as_, spread: as it ran
            except TypeError as error:
                raise EngineError(f"cannot replay from {from_step!r}: {error}") from None
    run.cursor = [index]


async def resume_after_crash(
    runs: RunStore, log: Callable[[Run, str], None], workflow: Workflow, job: Job, run: Run
) -> bool:
    """Whether `run`, about to start, is the next delivery of a run that crashed its worker
    (`AFTER_CRASH` in its job's meta) and now goes on where that one was: with its records of
    the top-level steps it completed (cached: they do not run again, a card is not charged
    twice) and the state they left, its cursor at the first step it did not complete. They
    ran again from the first step (DBOS and Temporal go on from the last step recorded)."""
    after = job.meta.get(AFTER_CRASH)
    if not isinstance(after, dict) or after.get("run") != run.id or run.started_at or run.steps:
        return False
    crashed = await runs.get_run(str(after.get("crashed")))
    if crashed is None:  # purged meanwhile (a job requeued long after): from the start
        return False
    at = _seed_after_crash(workflow, run, crashed)
    if at is not None:
        log(
            run,
            f"resumes at step {at}: the steps before it completed in run {crashed.id} "
            "(cached: not run again)",
        )
    return at is not None


def _seed_after_crash(workflow: Workflow, fresh: Run, crashed: Run) -> str | None:
    """The step `fresh` resumes at, quoted, and what of it was done (`_carried`),
    given `crashed`'s records of the steps before it; None, and nothing given, when that run
    did nothing to go on from, ran another version (its steps may not be these), or a step it
    completed kept no output (`ephemeral`) or kept it with a secret hidden: that step runs
    again, and what follows it."""
    if crashed.workflow_version != workflow.version:
        return None
    done = {record.name: record for record in crashed.steps}
    first = 0
    for step in workflow.steps:
        record = done.get(step.name)
        if record is None or record.status not in _DONE or (step.runs and not step.recorded):
            break
        if REDACTED in json.dumps(record.output, default=str):
            break  # a secret header value it returned, stored hidden: it runs again for it
        first += 1
    if first == len(workflow.steps):  # all done: its end was lost, run it again
        return None
    steps = [(step.name, step.kind) for step in workflow.steps]
    name = workflow.steps[first].name
    try:
        seed_from_step(workflow.name, steps, workflow, crashed, fresh, name)
    except EngineError:  # an output that no longer fits the step (`spread` of a non-dict)
        fresh.steps, fresh.state, fresh.cursor = [], {}, []
        return None
    carried = _carried(done.get(name), fresh.steps[first])
    if first == 0 and not carried:  # nothing done to go on from
        fresh.steps, fresh.cursor = [], []
        return None
    return repr(name) + carried


def _carried(crashed: StepRun | None, fresh: StepRun) -> str:
    """What the crashed run had done of the step it resumes at, handed on as a stop hands it
    on, said for the resume line: a for_each's items (fixed on its first pass) and the outputs
    of those it finished, which it keeps as it goes (" (after N of its M items)"); the child a
    subworkflow step started, which the step follows rather than start a second (" (its child
    run …)"); "" for any other step."""
    if crashed is None or not isinstance(crashed.input, dict):
        return ""
    if crashed.kind == "subworkflow" and crashed.child_run_id and "job_id" in crashed.input:
        fresh.input, fresh.child_run_id = crashed.input, crashed.child_run_id
        return f" (its child run {crashed.child_run_id})"
    items = crashed.input.get("items")
    done = crashed.output.get("done") if isinstance(crashed.output, dict) else None
    if crashed.kind != "for_each" or not isinstance(items, list) or not done:
        return ""
    fresh.input, fresh.output = {"items": items}, {"done": dict(done)}
    return f" (after {len(done)} of its {len(items)} items)"
