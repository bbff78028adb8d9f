"""A child run ended: its parent, asleep in the subworkflow step that waits on it, is brought
forward at once instead of finding out at its next look."""

from __future__ import annotations

import logging

from .backends.base import Backend
from .ledger import Ledger
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
