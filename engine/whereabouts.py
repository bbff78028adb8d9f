"""Where a running run's code is now, for an operator who asks (a stuck run: is it waiting on
a socket, a lock, a loop that never ends?). The question is a `where` signal on the run's job,
as a cancel is, so it reaches the worker that holds the job on any machine; that worker answers
with a line on the run's log (`NodeCalls.where_now`), which the asker reads back."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

import anyio

from .backends.base import Backend
from .errors import EngineError
from .liveness import elsewhere, job_orphaned, orphaned
from .models import JobState, Run, RunStatus, WorkerInfo
from .origin import WHERE_ANSWER

WHERE = "where"  # the signal
ANSWER = WHERE_ANSWER  # how each line of an answer begins (as origin.where_text writes it)
NOTHING_RUNS = (
    f"{ANSWER}no step's code runs now (the run is between steps, in a retry's backoff or in a "
    "short wait)"
)

# The answer to a question that reached the worker before the run began: it holds the job,
# claimed ahead of a free slot, and starts it now.
STARTING = f"{ANSWER}the run starts now: none of its steps' code runs yet"


class Holder(Protocol):
    """This process's worker, as the asker sees it (`Worker`)."""

    @property
    def by_job(self) -> Mapping[str, Any]: ...

    def deliver(self, job_id: str, name: str, at: float) -> None: ...


def _answers(run: Run) -> list[str]:
    return [line.message for line in run.logs if line.message.startswith(ANSWER)]


def _beyond_reach(run: Run, workers: list[WorkerInfo], now: datetime) -> EngineError:
    """Why a run whose job no queue here has cannot be asked: it ended and its job was
    purged, or its job is a memory queue's, in the memory of the process that runs it."""
    if run.status is not RunStatus.RUNNING:
        return EngineError(f"run {run.id} is {run.status}: none of its code runs now")
    orphan = orphaned(run, None, workers, now)
    if orphan is not None:
        return EngineError(f"run {run.id}: none of its code runs now: {orphan}")
    return EngineError(elsewhere(run))


async def ask_where(backend: Backend, run: Run, here: Holder | None, timeout: float) -> str:
    """The holder's answer: a `where: …` line for each node of the run that runs now. `here`:
    this process's worker, which answers at once for a job it holds."""
    found = await backend.find_job(run.job_id)
    if found is None:
        raise _beyond_reach(run, await backend.shared.workers(), backend.clock.now())
    queue, job = found
    # Held by a worker, whatever the record says yet: a node that blocks its event loop from
    # its first line keeps the start (`running`) from being written.
    if job.state is not JobState.ACTIVE or job.run_id != run.id:
        if run.status is RunStatus.RUNNING:
            raise EngineError(
                f"run {run.id} is recorded running but no worker holds its job now ({job.state})"
            )
        raise EngineError(f"run {run.id} is {run.status}: none of its code runs now")
    held_here = here is not None and job.id in here.by_job
    if not held_here:
        # Asked of the job, not the run: a run held ahead may still be recorded `queued`.
        orphan = job_orphaned(job, await backend.shared.workers(), backend.clock.now())
        if orphan is not None:
            # Nobody would answer: said now, not after the timeout.
            raise EngineError(f"run {run.id}: none of its code runs now: {orphan}")
    before = len(_answers(run))
    token = await backend.change_token()  # before the signal: the answer's commit moves it
    if here is not None and held_here:
        here.deliver(job.id, WHERE, time.time())  # answered now, into this process's writer
        await backend.runs.flush()
    elif not await queue.signal(job.id, job.epoch, WHERE):
        raise EngineError(f"run {run.id} changed hands; try again")
    with anyio.move_on_after(timeout):
        while True:
            now = await backend.runs.get_run(run.id)
            if now is None:
                raise EngineError(f"run {run.id} is gone from the store")
            answers = _answers(now)[before:]
            if answers:
                return "\n".join(answers)
            if now.terminal:
                raise EngineError(f"run {run.id} ended ({now.status}) before its worker answered")
            token = await backend.wait_for_change(token, 1.0)
    raise EngineError(
        f"run {run.id}: its worker {job.worker} did not answer within {timeout:g}s: it is gone, "
        "a node blocks its event loop (its log names which), or it has not started the run "
        "yet; blok-tui workers lists the live ones"
    )
