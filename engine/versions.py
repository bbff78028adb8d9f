"""Workflows that the live workers serve at different versions: a rolling deploy under way, or
a worker left behind with old files. Its jobs go to whichever worker claims them, so runs of
one workflow split between versions without a word; each worker says so in its log, once for
each split it finds, when it starts and at each janitor round. And what becomes of a run that
resumes on a worker whose version changed its steps (`not_resumable_here`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import timedelta

from .backends.base import Backend, Claim, JobQueue, WorkerCatalog
from .backends.held_for import held_for
from .errors import DatabaseError
from .ledger import Ledger
from .liveness import LiveWorkers
from .models import Run, StepRun, StepStatus, WorkflowInfo
from .records import assign
from .runner import pending_step
from .workflow import Workflow

DONE = (StepStatus.COMPLETED, StepStatus.CACHED, StepStatus.SKIPPED)

log = logging.getLogger("blok.versions")


async def version_splits(backend: Backend) -> dict[str, dict[str, list[str]]]:
    """Workflow name → version → the live workers serving it at that version, for the
    workflows served at more than one."""
    return splits_in((await LiveWorkers.read(backend)).catalogs)


def splits_in(catalogs: Sequence[WorkerCatalog]) -> dict[str, dict[str, list[str]]]:
    """`version_splits` of these catalogs (the live workers')."""
    served: dict[str, dict[str, list[str]]] = {}
    for catalog in catalogs:
        for info in catalog.workflows:
            served.setdefault(info.name, {}).setdefault(info.version, []).append(catalog.worker)
    return {name: versions for name, versions in served.items() if len(versions) > 1}


def split_line(workflow: str, versions: dict[str, list[str]]) -> str:
    by = "; ".join(
        f"{version} by {', '.join(sorted(workers))}"
        for version, workers in sorted(versions.items())
    )
    return (
        f"workflow {workflow!r} is served at {len(versions)} versions ({by}): its jobs run on "
        "whichever worker claims them"
    )


def shared_queues_in(catalogs: Sequence[WorkerCatalog]) -> dict[str, dict[str, list[str]]]:
    """The queues the live workers serve with more than one workflow (two services that chose
    one queue name, a deploy that renamed a workflow while the old one still runs): queue →
    workflow → its workers."""
    served: dict[str, dict[str, list[str]]] = {}
    for catalog in catalogs:
        for info in catalog.workflows:
            if info.queue is not None:
                workers = served.setdefault(info.queue, {}).setdefault(info.name, [])
                workers.append(catalog.worker)
    return {queue: names for queue, names in served.items() if len(names) > 1}


def shared_queue_line(queue: str, workflows: dict[str, list[str]]) -> str:
    by = "; ".join(
        f"{name!r} by {', '.join(sorted(workers))}" for name, workers in sorted(workflows.items())
    )
    return (
        f"queue {queue!r} is served with {len(workflows)} workflows ({by}): each worker runs "
        "only the jobs enqueued for its own (one queue, one workflow: rename one queue)"
    )


class VersionWatch:
    """Says each split once in this process's log."""

    def __init__(self) -> None:
        self._told: set[str] = set()

    async def check(self, backend: Backend) -> list[str]:
        """The splits found now, each logged the first time it is seen."""
        lines = [split_line(name, v) for name, v in sorted((await version_splits(backend)).items())]
        for line in lines:
            if line not in self._told:
                self._told.add(line)
                log.warning("%s", line)
        return lines


HAND_OVER_S = 1.0  # a run left to a worker that has its version is claimed again after this
# ... by that worker; the worker that left it passes it over this long more (`held_for.py`).
PASSED_OVER_S = 5.0


async def serving(
    backend: Backend, besides: str, wanted: Callable[[WorkflowInfo], bool]
) -> list[str]:
    """The live workers but `besides` that serve a workflow `wanted` holds of."""
    return sorted(
        catalog.worker
        for catalog in (await LiveWorkers.read(backend, besides=besides)).catalogs
        if any(wanted(info) for info in catalog.workflows)
    )


async def say_other_declarations(backend: Backend, me: str, here: dict[str, Workflow]) -> None:
    """Warn of a queue this worker serves that a live worker serves with another workflow: an
    enqueue names the queue's latest declaration (this worker's, now), and each worker runs
    only the jobs enqueued for its own (`left_to_its_workflow`). Two services that chose one
    queue name, or a deploy that renamed a workflow while the old one still runs."""
    mine = {queue: wf.name for queue, wf in here.items()}
    try:
        live = await LiveWorkers.read(backend, besides=me)
    except DatabaseError as error:  # a warning it could not give: the start goes on, and
        # what stops the worker (a database dropped as it started) is said once, by the worker
        log.warning("could not read the other workers' queues: %s", error)
        return
    except Exception:
        log.warning("could not read the other workers' queues", exc_info=True)
        return
    for catalog in live.catalogs:
        for info in catalog.workflows:
            ours = mine.get(info.queue or "")
            if ours is not None and info.name != ours:
                log.warning(
                    "queue %r is served here with workflow %r, and by worker %s with workflow "
                    "%r: jobs enqueued to it now run %r; each worker runs only the jobs "
                    "enqueued for its own workflow (one queue, one workflow: rename one queue)",
                    info.queue,
                    ours,
                    catalog.worker,
                    info.name,
                    ours,
                )


async def left_to_its_workflow(
    backend: Backend,
    ledger: Ledger,
    claim: Claim,
    queue: JobQueue,
    run: Run,
    me: str,
    current: Workflow,
) -> bool:
    """A job enqueued for another workflow than the one this worker runs on its queue: two
    deployments declare the queue with different workflows (a rolling deploy that renamed
    it, two services that chose one queue name). Run here, it ran this worker's code under
    the other's name and record. A live worker that serves its workflow on this queue takes
    it: held back a moment for it (True). With none, the workflow was renamed: this worker's
    runs it (False), as a reload that renames a workflow promises its queued jobs."""
    job = claim.job
    holders = await serving(
        backend, me, lambda info: info.name == job.workflow_name and info.queue == job.queue
    )
    if not holders:
        return False
    said = (
        f"workflow {job.workflow_name!r} it was enqueued for is served on queue {job.queue!r} "
        f"by worker {', '.join(holders)}; worker {me} serves that queue with workflow "
        f"{current.name!r}: left to it"
    )
    _hand_over(backend, ledger, claim, queue, run, me, ("left_to", job.workflow_name), said)
    return True


def _hand_over(
    backend: Backend,
    ledger: Ledger,
    claim: Claim,
    queue: JobQueue,
    run: Run,
    me: str,
    mark: tuple[str, str],
    said: str,
) -> None:
    """Hold the job back a moment for a live worker that has what it needs, saying why in the
    run's log once however often it is claimed here (`mark`: the meta key, and the value that
    says it was said). This worker passes it over a while after (`held_for.py`)."""
    meta = dict(claim.job.meta)
    key, value = mark
    if meta.get(key) != value:
        meta[key] = value
        ledger.log(run, said)
    now = backend.clock.now()
    until = now + timedelta(seconds=HAND_OVER_S)
    meta = held_for(meta, me, now.timestamp(), until.timestamp(), PASSED_OVER_S)
    ledger.hold(claim, queue, run, run.status, until, meta)


async def not_resumable_here(
    backend: Backend,
    ledger: Ledger,
    claim: Claim,
    queue: JobQueue,
    run: Run,
    me: str,
    current: Workflow,
) -> Workflow | None:
    """A resuming run whose version this worker does not have, where the version it has
    changed the steps (`Catalog.resumed_on`): going on by position would run other steps than
    its records say (a step done run again under another's name, the last ones never run). A
    live worker that serves its version takes it: the job is held back a moment for it (a
    rolling deploy under way). With none (its version is gone: a restart, a file changed on
    every worker), it goes on with `current` when the steps it ran and the one it goes on at
    are unchanged (`adopt_new_steps`; returned); else the run fails and its job goes to the
    dead-letter queue, not retried (a retry would run its first steps again), saying how to
    go on (None)."""
    version = run.workflow_version
    holders = await serving(
        backend, me, lambda info: info.name == run.workflow_name and info.version == version
    )
    if holders:
        said = (
            f"version {version} it started on is served by worker {', '.join(holders)}, "
            f"not by {me}, whose version changed its steps: left to it"
        )
        _hand_over(backend, ledger, claim, queue, run, me, ("left_for", version), said)
        return None
    at_step = adopt_new_steps(run, current)
    if at_step is not None:
        ledger.log(
            run,
            f"resumed on version {current.version} (started on {version}, which no live worker "
            f"serves): the steps up to {at_step!r}, where it goes on, are unchanged; the steps "
            "after it are the new version's",
        )
        return current
    top = run.own_steps()
    position = _goes_on_at(top)
    at = top[position].name if position is not None else None
    then = (
        f"replay it from step {at!r} (blok-tui replay {run.id} --from-step {at}), or " if at else ""
    )
    where = f"[step {position + 1}/{len(top)}] {at}: " if position is not None else ""
    why = (
        f"{where}version {version} it started on is served by no live worker, and the steps of the "
        "version served now differ from its own: not resumed, as going on by position would "
        f"run other steps than its record says; {then}requeue it to run it from its first step"
    )
    ledger.give_up(claim, queue, run, why, at)
    return None


def adopt_new_steps(run: Run, current: Workflow) -> str | None:
    """Give `run` the steps of `current` after the step it goes on at, when the steps up to
    that one are the same (names and kinds) as its records: a step added after a wait, or
    one changed after it, is what a deploy does most; a run parked in the wait went to the
    dead-letter queue for it (with the event it had been sent). Only for a run whose records
    are all top-level ones (a nested or middleware record sits after them in `run.steps`, and
    points at them by index). The name of the step it goes on at; None: not done."""
    records = run.steps
    if any(r.parent is not None or r.tags for r in records):
        return None
    position = _goes_on_at(records)
    if position is None or position >= len(current.steps):
        return None
    kept = [(r.name, r.kind) for r in records[: position + 1]]
    if kept != [(s.name, s.kind) for s in current.steps[: position + 1]]:
        return None
    tail = [
        pending_step(i, step.name, step.kind, max_attempts=getattr(step, "max_attempts", 1))
        for i, step in enumerate(current.steps)
        if i > position
    ]
    assign(run, steps=records[: position + 1] + tail)
    return records[position].name


def _goes_on_at(records: Sequence[StepRun]) -> int | None:
    """The index of the first of a run's top-level step records not done: where it goes on."""
    return next((n for n, r in enumerate(records) if r.status not in DONE), None)
