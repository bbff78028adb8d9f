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
names the one it read (`RunStore.adopt_run`): of two workers taking back one run, one does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .backends.base import Backend
from .liveness import LiveWorkers
from .models import Job, JobState, Run, RunStatus
from .queue_runtime import QueueRuntime

log = logging.getLogger("blok.worker")


async def requeue_memory_runs(
    backend: Backend, me: str, memory: Sequence[QueueRuntime], *, start: bool
) -> int:
    """Queue again, in the memory queues of `memory` (this worker's, `me`), the pending runs
    no live process holds; how many. `start`: at the worker's start, which says what it
    leaves to others."""
    if not memory or not backend.durable:
        return 0
    runs = await backend.runs.pending_runs([runtime.name for runtime in memory])
    if not runs:
        return 0
    others = await LiveWorkers.read(backend, besides=me)
    by_queue = {runtime.name: runtime for runtime in memory}
    taken: dict[str, int] = {}
    left: dict[str, int] = {}
    for run in sorted(runs, key=lambda run: run.created_at):  # first in, first out
        runtime = by_queue[run.queue]
        if await runtime.queue.get_job(run.job_id) is not None:
            continue  # in this process's memory: its own
        if others.may_hold(run):
            left[run.queue] = left.get(run.queue, 0) + 1
            continue
        if not await backend.runs.adopt_run(run.id, run.worker, me):
            continue  # another worker took it back first, or it moved on
        await runtime.queue.add([_job_of(run, runtime)], [])
        taken[run.queue] = taken.get(run.queue, 0) + 1
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
