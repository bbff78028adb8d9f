"""Cancelling one run, wherever it is.

A run no worker holds (queued, delayed, waiting) is cancelled by a fenced write through the
ledger. A run a worker holds is asked to stop with a `cancel` signal on its job, which that
worker sees on its next renewal (at once, if it is this process), and the canceller waits for
the run to end. A run whose worker is gone is recorded cancelled at once: nobody else would end
it. That includes a run of a memory queue whose worker died, whose job died with it, and a
pending run of a memory queue that no live process holds, which a worker serving the queue
would take back (`memory_runs`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio

from .backends.base import Backend
from .errors import EngineError
from .ledger import Ledger
from .liveness import LiveWorkers, elsewhere, holder_gone, orphaned
from .models import Job, JobState, Run, RunStatus
from .parents import cancelled_with_parent
from .worker import Worker

CANCEL_WAIT_S = 8.0  # how long a cancel waits for the worker holding the run to stop it


class Canceller:
    def __init__(
        self,
        backend: Backend,
        ledger: Ledger,
        get_run: Callable[[str], Awaitable[Run]],
        local: Callable[[], Worker | None],
    ) -> None:
        self.backend = backend
        self.ledger = ledger
        self.get_run = get_run  # the run, or UnknownRun
        self.local = local  # this process's worker, if it has one (it may start later)

    async def cancel_one(self, run_id: str) -> Run:
        """Cancel a running, waiting, delayed or queued run (not the children it waits on); a
        finished run is an error. The run as it is after the cancel."""
        for _ in range(20):
            run = await self.get_run(run_id)
            if run.terminal:
                raise EngineError(
                    f"run {run_id} has already ended ({run.status}); nothing to cancel"
                )
            reason = await cancelled_with_parent(self.backend, run)  # else the operator's
            found = await self.backend.find_job(run.job_id)
            if found is None:
                return await self._cancel_jobless(run, reason)
            queue, job = found
            if job.run_id != run.id or job.state.terminal:
                await anyio.sleep(0.01)  # its job is moving on right now: look again
                continue
            if job.state in (JobState.WAITING, JobState.DELAYED):
                if await self.ledger.cancel_pending(queue, job, run, reason):
                    return await self.get_run(run_id)
                continue  # claimed meanwhile: cancel it where it is held
            if await self._holder_gone(job):
                if await self.ledger.cancel_abandoned(queue, job, run, reason):
                    return await self.get_run(run_id)
                continue
            if not await queue.signal(job.id, job.epoch, "cancel"):
                continue
            worker = self.local()
            if worker is not None:  # it may hold the job: no need to wait for it to notice
                worker.deliver(job.id, "cancel", self.backend.clock.time())
            deadline = time.monotonic() + CANCEL_WAIT_S
            while (left := deadline - time.monotonic()) > 0:
                run = await self._await_end(run_id, min(0.5, left))
                if run.terminal:
                    return run
                now = await queue.get_job(job.id)
                if now is None or now.epoch != job.epoch:
                    run = await self.get_run(run_id)
                    if run.terminal:  # it ended as its job moved on: read after the wait
                        return run
                    break  # handed back (a gate held it) before it ran: cancel it as pending
            else:
                return run  # the worker did not stop it in time: as it is now
        raise EngineError(f"run {run_id} kept changing hands and could not be cancelled")

    async def _cancel_jobless(self, run: Run, reason: str | None) -> Run:
        """A run whose job no queue here has: a memory queue's, in the memory of the process
        serving it, which alone can act on it; unless that process is gone, and the job with
        it: then a running run is orphaned, and a pending one waits in its record until a
        worker serving its queue takes it back (`memory_runs`)."""
        if run.status is RunStatus.RUNNING:
            workers = await self.backend.shared.workers()
            if orphaned(run, None, workers, self.backend.clock.now()) is None:
                raise EngineError(elsewhere(run))
        else:
            local = self.local()
            me = local.info.id if local is not None else None
            if (await LiveWorkers.read(self.backend, besides=me)).may_hold(run):
                raise EngineError(elsewhere(run))
        self.ledger.cancel_jobless(run, reason)
        await self.backend.runs.flush()
        return await self.get_run(run.id)

    async def _holder_gone(self, job: Job) -> bool:
        """The worker holding the job is dead or let its lease run out: nobody runs it."""
        worker = self.local()
        if worker is not None and job.worker == worker.info.id:
            return False
        workers = await self.backend.shared.workers()
        return holder_gone(job, workers, self.backend.clock.now()) is not None

    async def _await_end(self, run_id: str, timeout: float) -> Run:
        """The run once it ended, or as it is after `timeout` seconds."""
        token = await self.backend.change_token()
        with anyio.move_on_after(timeout):
            while True:
                worker = self.local()
                if worker is not None:
                    handle = worker.handles.get(run_id)
                    if handle is not None:
                        await handle.wait_ended()
                run = await self.get_run(run_id)
                if run.terminal:
                    return run
                token = await self.backend.wait_for_change(token, 0.1)
        return await self.get_run(run_id)
