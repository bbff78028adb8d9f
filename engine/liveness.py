"""Whether a worker registered in the shared state is still alive, and whether a run recorded
running still has one that runs it."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from .models import Job, JobState, Run, RunStatus, WorkerInfo, utcnow

if TYPE_CHECKING:
    from .backends.base import Backend, WorkerCatalog

STALE_HEARTBEAT_S = 10.0  # a worker on another host is gone after this long without one
# What becomes of a run nobody runs any more (`holder_gone`): recovery, or the claim that finds
# its lease run out.
TAKEN_OVER = (
    "a live worker takes its job over: the run is recorded crashed and its job gets a new run"
)
# ... and of one whose job was a memory queue's: it was in the dead worker's memory only.
LOST_WITH_IT = (
    "a live worker records it crashed: its job was on a memory queue, in that worker's memory, "
    "and is lost with it"
)
# Added to either when no worker is alive: nothing happens until one starts.
NONE_ALIVE = " (no worker is alive now: start one)"


def _pid_space() -> str:
    """Where a pid names one process: this boot of the kernel (a random id each boot) and this
    process's PID namespace. Host names do not tell: VMs cloned from one image, containers on
    the host's network and pods with `hostNetwork` share theirs, and a pid taken on one of them
    means nothing on another. Without /proc (not Linux), the host name is all there is."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return socket.gethostname()
    return f"{boot}/{namespace}"


PID_SPACE = _pid_space()


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (the state first), None where
    /proc does not say."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return fields if len(fields) > 19 else None


def _began(pid: int | str) -> str | None:
    """When the process began, in clock ticks since boot (field 22 of /proc/PID/stat): with
    its pid, it names one process for the life of the boot, and no step of the wall clock
    moves it."""
    fields = _stat(pid)
    return None if fields is None else fields[19]


def process_of(pid: int | str) -> str:
    """A process of this pid space as `WorkerInfo.process` records it: the pid space, then `#`
    and when it began."""
    began = _began(pid)
    return PID_SPACE if began is None else f"{PID_SPACE}#{began}"


def this_process() -> str:
    """This process, read when asked, not at import: a process forked after the import began
    later."""
    return process_of("self")


def pid_names_process_here(worker: WorkerInfo) -> bool:
    """Whether `worker.pid` is a pid of this process's pid space: asking the system about it
    then tells whether that worker runs. A row without its process (an engine of before it was
    recorded) is judged by its host name, as it was then."""
    if worker.process:
        return worker.process.partition("#")[0] == PID_SPACE
    return worker.host == socket.gethostname()


def process_runs(worker: WorkerInfo) -> bool:
    """Whether the worker's process (its pid names a process here) still runs: its pid is alive
    and names the process that began when the worker's did. A pid is given again once its
    process ended: judged by the pid alone, a worker killed long ago lived on in whatever
    process got its pid, so recovery never released its jobs nor forgot it, and `blok-tui
    health` said a worker was alive when none was."""
    if not pid_alive(worker.pid):
        return False
    fields = _stat(worker.pid)
    if fields is None:
        return True  # the pid is taken, and nothing more is known
    if fields[0] == "Z":
        return False  # killed, and not yet reaped by its parent: it runs no more
    recorded = worker.process.partition("#")[2]
    return not recorded or fields[19] == recorded


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def worker_alive(
    worker: WorkerInfo, now: datetime | None = None, stale_s: float = STALE_HEARTBEAT_S
) -> bool:
    """Alive: its process runs (its pid names a process here) or its heartbeat is recent by
    `now` on the clock heartbeats are on, its backend's (another machine, another container)."""
    if pid_names_process_here(worker):
        return process_runs(worker)
    return worker.heartbeat_at >= (now or utcnow()) - timedelta(seconds=stale_s)


# What an operator is told of a worker (`worker_state`): health counts only those that serve.
SERVING = "alive"
SUSPENDED = "suspended"
STALLED = "stalled"
SUSPENDED_OR_STALLED = "suspended or stalled"
STOPPING = "stopping"  # draining: it claims nothing more and ends its runs
GONE = "gone"


def worker_state(
    worker: WorkerInfo, now: datetime | None = None, stale_s: float = STALE_HEARTBEAT_S
) -> str:
    """What a worker is doing, for an operator (`blok-tui health`, `blok-tui workers`): SERVING
    (alive, its heartbeat recent), GONE (not `worker_alive`), STOPPING (alive, draining after a
    SIGTERM: it claims nothing more, and health counted it serving), or, for a process of this
    pid space that runs but has not heartbeat for `stale_s` (the staleness other hosts' workers
    are judged by), SUSPENDED (stopped: SIGSTOP, Ctrl-Z), STALLED (not stopped: its event loop is
    blocked, or its heartbeats do not reach the database) or SUSPENDED_OR_STALLED (no /proc to
    tell). A suspended process serves nothing, though its pid is alive: counted alive, health
    said all was well while no job was claimed. Recovery does not ask this: it judges by
    `process_runs` and leases as before, so a stopped worker keeps its jobs until their leases
    run out, whatever this says."""
    if not worker_alive(worker, now, stale_s):
        return GONE
    if worker.stopping_since is not None:
        return STOPPING
    if worker.heartbeat_at >= (now or utcnow()) - timedelta(seconds=stale_s):
        return SERVING
    fields = _stat(worker.pid)
    if fields is None:
        return SUSPENDED_OR_STALLED
    return SUSPENDED if fields[0] in ("T", "t") else STALLED  # T: stopped, t: stopped by a tracer


def why_not_serving(worker: WorkerInfo, state: str, now: datetime | None = None) -> str:
    """Why a worker alive by its process serves nothing (`worker_state` said `state`), in a
    clause: "worker ID is suspended (process 123 is stopped; no heartbeat for 14s)"."""
    silent = max(((now or utcnow()) - worker.heartbeat_at).total_seconds(), 0.0)
    if state == STOPPING and worker.stopping_since is not None:
        since = max(((now or utcnow()) - worker.stopping_since).total_seconds(), 0.0)
        return (
            f"worker {worker.id} is stopping (for {since:.0f}s: it claims nothing more and "
            "ends its runs)"
        )
    what = {
        SUSPENDED: "is stopped, as by SIGSTOP or Ctrl-Z",
        STALLED: "runs but its heartbeats stopped: a blocked event loop, or database writes "
        "that do not get through",
    }.get(state, "exists")
    return (
        f"worker {worker.id} is {state} (process {worker.pid} {what}; "
        f"no heartbeat for {silent:.0f}s)"
    )


def worker_gone(worker_id: str, workers: Iterable[WorkerInfo], now: datetime) -> str | None:
    """Why the worker is known dead, in a sentence; None while it may be alive (one not
    registered counts as alive: a worker that just started)."""
    for worker in workers:
        if worker.id != worker_id or worker_alive(worker, now):
            continue
        if pid_names_process_here(worker):
            return f"its worker {worker.id} is gone (its process {worker.pid} no longer runs)"
        return (
            f"its worker {worker.id} is gone (no heartbeat since "
            f"{worker.heartbeat_at.isoformat(timespec='seconds')})"
        )
    return None


def holder_gone(job: Job, workers: Iterable[WorkerInfo], now: datetime) -> str | None:
    """Why nobody runs a job its record says a worker holds (`active`): its worker is dead or
    let its lease run out; None while that worker may still run it. `now`: the clock leases
    and heartbeats are on, the backend's."""
    if job.worker is None:
        return "no worker holds its job"
    # First: a worker known dead is named so, whether or not its lease has run out yet.
    dead = worker_gone(job.worker, workers, now)
    if dead is not None:
        return dead
    if job.lease_until is not None and job.lease_until < now:
        return (
            f"its worker {job.worker} let the lease on its job run out at "
            f"{job.lease_until.isoformat(timespec='seconds')} (the worker is frozen, or gone)"
        )
    return None


@dataclass(frozen=True, slots=True)
class Orphan:
    """A run recorded running that nobody runs any more: why, and what becomes of it."""

    why: str  # "its worker … is gone (…)"
    then: str  # TAKEN_OVER or LOST_WITH_IT, and NONE_ALIVE when no worker is alive
    # The last moment its holder was known alive with it: that worker's last heartbeat, or the
    # end of its lease if sooner. None: not known.
    since: datetime | None = None

    def __str__(self) -> str:
        return f"{self.why}; {self.then}"


def orphaned(
    run: Run, job: Job | None, workers: Iterable[WorkerInfo], now: datetime
) -> Orphan | None:
    """Whether nobody runs `run` any more, given its job as read now (None: no queue here has
    it) and the workers as read now; None while it is not running or its worker may run it."""
    if run.status is not RunStatus.RUNNING:
        return None
    if job is None:
        # A running run's job is kept until it ends, so it is a memory queue's, in the memory
        # of the process that runs it: that process's life is the job's.
        why = worker_gone(run.worker, workers, now) if run.worker else None
        if why is None:
            return None
        return Orphan(why, _then(LOST_WITH_IT, workers, now), _last_seen(run.worker, workers))
    if job.run_id != run.id:
        return None
    return job_orphaned(job, workers, now)


def job_orphaned(job: Job, workers: Iterable[WorkerInfo], now: datetime) -> Orphan | None:
    """`orphaned` asked of a job a worker holds (`active`), whatever its run's record says yet
    (a run held ahead of a free slot is still recorded `queued`)."""
    if job.state is not JobState.ACTIVE:
        return None
    why = holder_gone(job, workers, now)
    if why is None:
        return None
    # Whichever came first: a frozen or killed worker's heartbeats stopped before its lease ran
    # out; a worker that heartbeats on without renewing held the job only until its lease did.
    seen = [t for t in (_last_seen(job.worker, workers), job.lease_until) if t is not None]
    return Orphan(why, _then(TAKEN_OVER, workers, now), min(seen, default=None))


def _last_seen(worker_id: str | None, workers: Iterable[WorkerInfo]) -> datetime | None:
    """The worker's last heartbeat, if it is registered."""
    return next((w.heartbeat_at for w in workers if w.id == worker_id), None)


def _then(then: str, workers: Iterable[WorkerInfo], now: datetime) -> str:
    """What becomes of an orphan: `then`, once a live worker sees it; there is none now?"""
    return then if any(worker_alive(worker, now) for worker in workers) else then + NONE_ALIVE


def elsewhere(run: Run) -> str:
    """Why a run whose job no queue here has cannot be acted on from here: its job is a memory
    queue's, in the memory of the process that serves it."""
    held = f" (worker {run.worker})" if run.worker else ""
    return (
        f"run {run.id} is on memory queue {run.queue!r}: its job is in the memory of the "
        f"process serving it{held}, so only that process can act on it"
    )


@dataclass(frozen=True, slots=True)
class LiveWorkers:
    """The live workers on a database (besides one, if asked), the queues they serve, and
    what each declared it serves (its catalog)."""

    ids: frozenset[str]
    serving: frozenset[str]
    catalogs: tuple[WorkerCatalog, ...] = ()

    @classmethod
    async def read(cls, backend: Backend, *, besides: str | None = None) -> LiveWorkers:
        now = backend.clock.now()  # the clock heartbeats are on
        workers = await backend.shared.workers()
        ids = frozenset(w.id for w in workers if w.id != besides and worker_alive(w, now))
        catalogs = tuple(c for c in await backend.shared.catalogs() if c.worker in ids)
        serving = frozenset(served.name for catalog in catalogs for served in catalog.queues)
        return cls(ids, serving, catalogs)

    def may_hold(self, run: Run) -> bool:
        """Whether one of them may hold the job of a memory queue's run not in this process:
        the worker it names, or, if it names none, any serving its queue."""
        return run.worker in self.ids or (run.worker is None and run.queue in self.serving)
