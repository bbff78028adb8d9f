"""The dead-letter queue's actions: list it, put a dead job back (requeue), or take it out for
good (discard).

Each is a fenced write through the ledger, the same from any process and with no worker alive.
A discarded job is cancelled, not deleted: its runs, its error and its log stay readable until
the retention takes them, as any finished job's do. Kept dead, the janitor never purged it,
and a dead-letter queue nobody meant to drain grew for ever.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from .backends.base import Backend, JobQueue
from .errors import EngineError, UnknownJob, ambiguous_start
from .filters import RunFilter
from .ledger import Ledger
from .models import Job, JobState
from .operations import BulkResult, ProgressCallback, Skip, matching_runs, resolve_stuck, run_bulk
from .replays import refuse_if_replayed
from .validation import check_limit, checked


class Target(Protocol):
    """Where a queue's jobs are: the operator's `QueueTarget`."""

    @property
    def queue(self) -> JobQueue: ...

    @property
    def version(self) -> str: ...


class DeadLetters:
    def __init__(
        self,
        backend: Backend,
        ledger: Ledger,
        target: Callable[[str], Awaitable[Target]],
        run_target: Callable[[str, str], Awaitable[Target]],
        queue_names: Callable[[], Awaitable[list[str]]],
    ) -> None:
        self.backend = backend
        self.ledger = ledger
        self.target = target  # a queue's name → where its jobs are (UnknownQueue if none)
        self.run_target = run_target  # (queue, workflow) → where a new run of it goes
        self.queue_names = queue_names  # the queues known (their dead letters are theirs)

    async def listed(self, queue: str, limit: int | None = 1000) -> list[Job]:
        limit, target = checked(check_limit, limit), await self.target(queue)  # None: all
        return await target.queue.dead_letters(queue, 2**63 - 1 if limit is None else limit)

    async def find(self, word: str) -> Job:
        """The job `word` names: its id, or the start of a dead letter's id (with or without
        `job_`, as the console's dead-letter view shows them shortened). None found, or the
        start of several: an EngineError that says so."""
        found = await self.backend.find_job(word) if word else None
        if found is not None:
            return found[1]
        if not word:
            raise UnknownJob("unknown job '': give a job id")
        prefix = (word if word.startswith("job_") else f"job_{word}").lower()
        matches = [
            job
            for queue in await self.queue_names()
            for job in await self.listed(queue, None)
            if job.id.lower().startswith(prefix)
        ]
        if not matches:
            how = "" if word.startswith("job_") else ": no dead letter's id starts with it"
            raise UnknownJob(f"unknown job {word!r}{how}")
        if len(matches) > 1:
            raise ambiguous_start(word, "dead letters' ids", [job.id for job in matches])
        return matches[0]

    # ---- requeue ---------------------------------------------------------------------------
    async def requeue(self, job_id: str, *, force: bool = False) -> str:
        """A dead (or failed) job back in its queue with a fresh run and retry budget; its id.
        Refused (ReplayedAlready) if a replay of its run completed or has not ended, unless
        `force`."""
        for _ in range(3):
            found = await self.backend.find_job(job_id)
            if found is None:
                raise UnknownJob(f"unknown job {job_id!r}")
            queue, job = found
            if job.state not in (JobState.DEAD, JobState.FAILED):
                raise EngineError(
                    f"job {job_id} is {job.state}, only dead or failed jobs are requeued"
                )
            try:
                target = await self.run_target(job.queue, job.workflow_name)
            except EngineError as error:
                raise EngineError(f"cannot requeue job {job_id}: {error}") from None
            if not force:
                await refuse_if_replayed(self.backend.runs, job_id, job.run_id)
            if await self.ledger.requeue(queue, job, target.version) is not None:
                queue.wake(job.queue)
                return job_id
        raise EngineError(f"job {job_id} changed while being requeued; try again")

    async def requeue_many(
        self,
        jobs: RunFilter | Sequence[str],
        *,
        force: bool = False,
        progress: ProgressCallback | None = None,
    ) -> BulkResult:
        """Put dead-lettered (or failed) jobs back in their queues: these job ids, or the jobs of
        the runs a filter matches. Skipped: jobs not dead or failed, or replayed (`requeue`; but
        `force`)."""

        async def requeue(job_id: str) -> None:
            await self.requeue(job_id, force=force)

        return await self._each("requeue", await self._job_ids(jobs), requeue, progress)

    async def requeue_dead(
        self, queue: str, *, force: bool = False, progress: ProgressCallback | None = None
    ) -> BulkResult:
        """Requeue every dead letter of the queue (but those a replay completed or has not
        ended: `force`)."""
        dead = await self.listed(queue, None)  # every one
        return await self.requeue_many([job.id for job in dead], force=force, progress=progress)

    # ---- discard ---------------------------------------------------------------------------
    async def discard(self, job_id: str) -> str:
        """Take a dead job out of the dead-letter queue for good: it is cancelled and never runs
        again; its runs stay readable until the retention takes them. Its id."""
        for _ in range(3):
            found = await self.backend.find_job(job_id)
            if found is None:
                raise UnknownJob(f"unknown job {job_id!r}")
            queue, job = found
            if job.state is not JobState.DEAD:
                raise EngineError(
                    f"job {job_id} is {job.state}, only dead letters are discarded"
                    + (" (it is no longer in the dead-letter queue)" if job.state.terminal else "")
                )
            run = await self.backend.runs.get_run(job.run_id)
            if await self.ledger.discard(queue, job, run):
                return job_id
        raise EngineError(f"job {job_id} changed while being discarded; try again")

    async def discard_many(
        self, jobs: RunFilter | Sequence[str], *, progress: ProgressCallback | None = None
    ) -> BulkResult:
        """Discard dead letters: these job ids, or the jobs of the runs a filter matches.
        Skipped: jobs that are not dead letters."""
        return await self._each("discard", await self._job_ids(jobs), self.discard, progress)

    async def discard_dead(
        self, queue: str, *, progress: ProgressCallback | None = None
    ) -> BulkResult:
        """Discard every dead letter of the queue."""
        dead = await self.listed(queue, None)  # every one
        return await self.discard_many([job.id for job in dead], progress=progress)

    # ---- bulk ------------------------------------------------------------------------------
    async def _job_ids(self, jobs: RunFilter | Sequence[str]) -> list[str]:
        if isinstance(jobs, RunFilter):
            store = self.backend.runs
            runs = await matching_runs(store, await resolve_stuck(store, jobs))
            return list(dict.fromkeys(run.job_id for run in runs))
        if isinstance(jobs, str):
            raise EngineError("pass a RunFilter or a list of job ids, not one id")
        return list(dict.fromkeys(jobs))

    @staticmethod
    async def _each(
        action: str,
        job_ids: list[str],
        act: Callable[[str], Awaitable[object]],
        progress: ProgressCallback | None,
    ) -> BulkResult:
        async def one(job_id: str) -> None:
            try:
                await act(job_id)
            except UnknownJob:
                raise Skip("unknown job") from None
            except EngineError as error:
                raise Skip(skip_reason(error, job_id)) from None

        return await run_bulk(action, job_ids, str, one, progress)


def skip_reason(error: Exception, ident: str) -> str:
    """An error as a skip reason that many items share: without the item's id."""
    return str(error).replace(f" {ident}", "").replace(f" {ident!r}", "")
