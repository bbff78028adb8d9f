"""The runs of memory queues after a restart.

A memory queue's jobs live in the memory of the process serving it; their runs are written to
the store like any other. When a worker starts on a durable store, the pending runs (queued,
delayed, waiting) of the memory queues it serves are what is left of the jobs of a process
that is gone, unless a live process still holds them; those it queues again, as jobs of its
own. A run that began names the worker that ran it: it is taken if that worker is gone. One
that never began names none: it is taken only if no other live worker serves its queue, in
whose memory it may be (taking it would run it twice).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from .backends.base import Backend
from .liveness import worker_alive
from .models import Job, JobState, Run, RunStatus
from .queue_runtime import QueueRuntime

log = logging.getLogger("blok.worker")


@dataclass(frozen=True, slots=True)
class Others:
    """The other live workers on the database, and the queues they serve."""

    alive: frozenset[str]
    serving: frozenset[str]

    @classmethod
    async def read(cls, backend: Backend, me: str | None) -> Others:
        now = backend.clock.now()
        workers = await backend.shared.workers()
        alive = frozenset(w.id for w in workers if w.id != me and worker_alive(w, now))
        serving = frozenset(
            served.name
            for catalog in await backend.shared.catalogs()
            if catalog.worker in alive
            for served in catalog.queues
        )
        return cls(alive, serving)

    def may_hold(self, run: Run) -> bool:
        """Whether one of them may hold the job of a memory queue's run not in this process:
        the worker that ran it (a run that began), or any serving its queue (one never
        started)."""
        return run.worker in self.alive or (run.worker is None and run.queue in self.serving)


async def requeue_memory_runs(backend: Backend, me: str, memory: Sequence[QueueRuntime]) -> int:
    """Queue again, in the memory queues of `memory` (this worker's, `me`), the pending runs
    no live process holds; how many."""
    if not memory or not backend.durable:
        return 0
    runs = await backend.runs.pending_runs([runtime.name for runtime in memory])
    if not runs:
        return 0
    others = await Others.read(backend, me)
    by_queue = {runtime.name: runtime for runtime in memory}
    left: dict[str, int] = {}
    for run in sorted(runs, key=lambda run: run.created_at):  # first in, first out
        if others.may_hold(run):
            left[run.queue] = left.get(run.queue, 0) + 1
            continue
        await by_queue[run.queue].queue.add([_job_of(run, by_queue[run.queue])], [])
    for queue, count in left.items():
        log.info(
            "memory queue %s: %d pending run(s) left to the live worker(s) that may hold them",
            queue,
            count,
        )
    return len(runs) - sum(left.values())


def _job_of(run: Run, runtime: QueueRuntime) -> Job:
    """The job of a run read back from the store, as this process's own."""
    trigger = runtime.workflow.trigger
    return Job(
        id=run.job_id,
        queue=run.queue,
        workflow_name=run.workflow_name,
        payload=run.input,
        headers=run.headers,
        priority=run.priority,
        state=JobState.DELAYED if (run.wait_until or run.run_at) else JobState.WAITING,
        run_at=run.wait_until or run.run_at,
        run_id=run.id,
        created_at=run.created_at,
        resume=run.status is RunStatus.WAITING or bool(run.cursor),
        max_retries=trigger.retries if trigger else 0,
        meta={"recovered": True},
    )
