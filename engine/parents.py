"""A child run and its parent: a child that ended brings its parent, asleep in the subworkflow
step that waits on it, forward at once instead of at its next look; a child cancelled because
its parent was says so."""

from __future__ import annotations

import logging

from .backends.base import Backend
from .errors import DatabaseError
from .ledger import CANCELLED, Ledger
from .models import JobState, Run, RunStatus, StepStatus

log = logging.getLogger("blok.worker")


async def wake_parent(backend: Backend, ledger: Ledger, child: Run) -> None:
    """Make the parent's job due if the parent waits on `child` (a shortcut only: it finds the
    child done at its next look anyway, so a failure here is logged, not raised)."""
    try:
        assert child.parent_run_id is not None
        parent = await backend.runs.get_run(child.parent_run_id)
        if parent is None or parent.status is not RunStatus.WAITING:
            return
        if not any(
            r.kind == "subworkflow"
            and r.status is StepStatus.WAITING
            and r.child_run_id == child.id
            for r in parent.steps
        ):
            return
        found = await backend.find_job(parent.job_id)
        if (
            found is not None
            and found[1].run_id == parent.id
            and found[1].state in (JobState.WAITING, JobState.DELAYED)
        ):
            await ledger.make_due(found[0], found[1], None, force=False)
    except Exception:
        log.warning("could not wake the parent of run %s", child.id, exc_info=True)


async def cancelled_with_parent(backend: Backend, run: Run) -> str | None:
    """Why a child run is cancelled, when it is because its parent was (a parent cancelled
    cancels the children its steps wait on): "cancelled with its parent run …". Those read
    "cancelled by operator", and the operator had cancelled only the parent. None for any other
    run (a detached child goes on when its parent is cancelled)."""
    if run.parent_run_id is None:
        return None
    parent = await backend.runs.get_run(run.parent_run_id)
    if parent is None or parent.status is not RunStatus.CANCELLED:
        return None
    waited = any(
        r.kind == "subworkflow" and "sub" in r.tags and r.child_run_id == run.id
        for r in parent.steps
    )
    return f"cancelled with its parent run {parent.id}" if waited else None


async def why_cancelled(backend: Backend, run: Run) -> str:
    """The error of a run its worker stopped for a cancel: its parent's (above), else the
    operator's. The parent unreadable (the database out of reach), the operator's: the cancel
    is recorded all the same."""
    try:
        return await cancelled_with_parent(backend, run) or CANCELLED
    except DatabaseError as error:
        log.warning(
            "run %s: its parent could not be read (%s): said cancelled by operator", run.id, error
        )
        return CANCELLED
