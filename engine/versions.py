"""Workflows that the live workers serve at different versions: a rolling deploy under way, or
a worker left behind with old files. Its jobs go to whichever worker claims them, so runs of
one workflow split between versions without a word; each worker says so in its log, once for
each split it finds, when it starts and at each janitor round. And what becomes of a run that
resumes on a worker whose version changed its steps (`not_resumable_here`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta

from .backends.base import Backend, Claim, JobQueue, WorkerCatalog
from .ledger import Ledger
from .liveness import LiveWorkers
from .models import Run, StepStatus

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


async def serving_version(backend: Backend, workflow: str, version: str, besides: str) -> list[str]:
    """The live workers but `besides` that serve `workflow` at `version`."""
    return sorted(
        catalog.worker
        for catalog in (await LiveWorkers.read(backend, besides=besides)).catalogs
        if any(i.name == workflow and i.version == version for i in catalog.workflows)
    )


async def not_resumable_here(
    backend: Backend, ledger: Ledger, claim: Claim, queue: JobQueue, run: Run, me: str
) -> None:
    """A resuming run whose version this worker does not have, where the version it has
    changed the steps (`Catalog.resumed_on`): going on by position would run other steps than
    its records say (a step done run again under another's name, the last ones never run). A
    live worker that serves its version takes it: the job is held back a moment for it (a
    rolling deploy under way). With none (its version is gone: a restart, a file changed on
    every worker), the run fails and its job goes to the dead-letter queue, not retried (a
    retry would run its first steps again), saying how to go on."""
    version = run.workflow_version
    holders = await serving_version(backend, run.workflow_name, version, besides=me)
    if holders:
        meta = dict(claim.job.meta)
        if meta.get("left_for") != version:  # said once, however often it is claimed here
            meta["left_for"] = version
            ledger.log(
                run,
                f"version {version} it started on is served by worker {', '.join(holders)}, "
                f"not by {me}, whose version changed its steps: left to it",
            )
        until = backend.clock.now() + timedelta(seconds=HAND_OVER_S)
        ledger.hold(claim, queue, run, run.status, until, meta)
        return
    top = run.own_steps()
    position = next((n for n, s in enumerate(top) if s.status not in DONE), None)
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
