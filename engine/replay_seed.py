"""A replay from a step: the new run starts with the source run's records of the earlier steps,
as cached, so only `from_step` and what follows runs again."""

from __future__ import annotations

from collections.abc import Sequence

from .errors import EngineError
from .models import Run, StepStatus, utcnow
from .runner import Runner, pending_step
from .workflow import Workflow


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
        done_then = (StepStatus.COMPLETED, StepStatus.CACHED, StepStatus.SKIPPED)
        if step is None or step.status not in done_then:
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
