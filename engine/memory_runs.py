"""The runs of memory queues whose process is gone.

A memory queue's jobs live in the memory of the process serving it; their runs are written to
the store like any other. The pending runs (queued, delayed, waiting) of a memory queue that
are not in this process's memory are what is left of the jobs of a process that is gone,
unless another live process holds them: a worker serving the queue queues those again, as jobs
of its own, when it starts and every janitor interval after. A run names the worker whose
memory holds its job: the one that queued it (`JobQueue.serve_as`), ran it or took it back. It
is taken if that worker is gone. One that names none (written by an older blok-tui) is taken
only if no other live worker serves its queue, in whose memory it may be (taking it would run
it twice). A worker takes a run back by writing its own name on it where the record still
names the one it read (`RunStore.adopt_runs`, a write for many runs): of two workers taking
back one run, one does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .backends.base import Backend
from .liveness import LiveWorkers
from .models import Job, JobState, Run, RunStatus
from .queue_runtime import QueueRuntime

log = logging.getLogger("blok.worker")


# Runs taken back in one write: a restart after thousands of them makes a write a chunk, not
# a write a run, and no write holds the database for long.
CHUNK = 500


async def requeue_memory_runs(
    backend: Backend, me: str, memory: Sequence[QueueRuntime], *, start: bool
) -> int:
    """Queue again, in the memory queues of `memory` (this worker's, `me`), the pending runs
    no live process holds, oldest first; how many. `start`: at the worker's start, which says
    what it leaves to others."""
    if not memory or not backend.durable:
        return 0
    runs = await backend.runs.pending_runs([runtime.name for runtime in memory])
    if not runs:
        return 0
    by_queue = {runtime.name: runtime for runtime in memory}
    mine: set[str] = set()  # the jobs in this process's memory: its own
    for name, runtime in by_queue.items():
        job_ids = [run.job_id for run in runs if run.queue == name]
        mine.update(job.id for job in await runtime.queue.get_jobs(job_ids))
    others = await LiveWorkers.read(backend, besides=me)
    wanted: list[Run] = []
    left: dict[str, int] = {}
    for run in sorted(runs, key=lambda run: run.created_at):  # first in, first out
        if run.job_id in mine:
            continue
        if others.may_hold(run):
            left[run.queue] = left.get(run.queue, 0) + 1
        else:
            wanted.append(run)
    taken: dict[str, int] = {}
    for first in range(0, len(wanted), CHUNK):
        chunk = wanted[first : first + CHUNK]
        # Of the runs another worker took back first, or that moved on, none is queued here.
        adopted = await backend.runs.adopt_runs([(run.id, run.worker) for run in chunk], me)
        for name, runtime in by_queue.items():
            jobs = [
                _job_of(run, runtime) for run in chunk if run.id in adopted and run.queue == name
            ]
            if jobs:
                await runtime.queue.add(jobs, [])
                taken[name] = taken.get(name, 0) + len(jobs)
    for queue, count in taken.items():
        if not start:
            log.warning(
                "memory queue %s: %d run(s) of a process that is gone queued again", queue, count
            )
    for queue, count in left.items() if start else ():
        log.info(
            "memory queue %s: %d pending run(s) left to the live worker(s) that may hold them",
            queue,
            count,
        )
    return sum(taken.values())


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
