"""Cluster chores: recovering what dead workers left behind, and the janitor.

Each runs on one worker at a time among those sharing the database (a leader lease in the
shared state, renewed while the chore runs), so ten workers do not purge the same rows or race
each other to release the same dead worker's jobs. Recovery also runs once when a worker boots,
before it claims anything.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from datetime import datetime, timedelta

import anyio

from .backends.base import Backend
from .filters import RunFilter
from .gates import wake_next
from .ledger import Ledger, may_have_begun
from .liveness import pid_names_process_here, process_runs
from .models import RunStatus, WorkerInfo
from .versions import VersionWatch

log = logging.getLogger("blok.chores")

PURGE_CHUNK = 500  # runs deleted in one transaction
JOBS_PURGE_CHUNK = 2000  # finished jobs deleted in one transaction
# After each chunk the janitor rests this many times as long as the chunk took, so that the
# workers' own writes get the database between chunks. With a checkpoint alone, the next chunk
# was queued at once: on SQLite (one writer) a purge of 100,000 runs held every job 1-1.7 s,
# and the finished jobs went in one transaction that held them longer still.
PURGE_REST = 1.0
# A dead worker stays listed, as gone, this long after its last heartbeat (its jobs are taken
# over at once all the same); then it is forgotten.
GONE_KEPT_S = 600.0


async def _rest_after(began: float) -> None:
    await anyio.sleep((time.monotonic() - began) * PURGE_REST)


class Chores:
    def __init__(
        self,
        backend: Backend,
        ledger: Ledger,
        me: WorkerInfo,
        *,
        lease_s: float,
        heartbeat_s: float,
        retention: timedelta,
        janitor_interval: float,
        alive_here: Collection[str] = (),
        janitor: bool = True,
        recovery: bool = True,
    ) -> None:
        """`janitor=False` (BLOK_JANITOR_DISABLED): nothing is purged. `recovery=False`
        (BLOK_CRASH_AUTOFLIP_DISABLED): runs dead workers left are not recorded crashed nor
        their jobs released by recovery; a job whose lease runs out is still taken over."""
        self.backend = backend
        self.ledger = ledger
        self.me = me
        self.lease_s = lease_s
        self.heartbeat_s = heartbeat_s
        self.retention = retention
        self.janitor_interval = janitor_interval
        self.alive_here = alive_here  # engines alive in this very process
        self.janitor = janitor
        self.recovery = recovery
        # The gone workers whose jobs this process released, at their last heartbeat: they
        # stay listed a while (GONE_KEPT_S), and are not looked at again at each heartbeat.
        self._released: dict[str, datetime] = {}
        self.versions = VersionWatch()

    # ---- dead workers ----------------------------------------------------------------------
    def _gone(self, worker: WorkerInfo) -> bool:
        if worker.id == self.me.id or worker.id in self.alive_here:
            return False
        if pid_names_process_here(worker):
            # An earlier engine of this very process that did not close, or a dead process.
            return worker.pid == self.me.pid or not process_runs(worker)
        stale = self.backend.clock.now() - timedelta(
            seconds=max(3 * self.heartbeat_s, self.lease_s)
        )
        return worker.heartbeat_at < stale

    @staticmethod
    def _same_beat(one: datetime | None, other: datetime) -> bool:
        """The same last heartbeat, as two reads give it (PostgreSQL's is its age on the
        server's clock, read here: a few ms apart from one read to the next). A worker that
        came back beats on, its heartbeat seconds later."""
        return one is not None and abs((one - other).total_seconds()) < 1.0

    async def recover(self) -> int:
        """Release the jobs of dead workers (a run one had started is recorded crashed and its
        job gets a new run), record their orphaned runs crashed, and forget them. The number
        of runs found crashed."""
        if not self.recovery:
            return 0
        # Each with its last heartbeat: where its runs ended, not when that was found.
        gone = {w.id: w.heartbeat_at for w in await self.backend.shared.workers() if self._gone(w)}
        self._released = {
            i: beat for i, beat in self._released.items() if self._same_beat(gone.get(i), beat)
        }
        # Kept a while as gone: `blok-tui workers` and the console's `:workers` listed only the
        # survivors a second after a kill -9, and nothing said which worker had died.
        forget_before = self.backend.clock.now() - timedelta(seconds=GONE_KEPT_S)
        for worker_id in [i for i, beat in gone.items() if beat < forget_before]:
            await self.backend.shared.forget_worker(worker_id)
        seen = {i: beat for i, beat in gone.items() if i not in self._released}
        dead = list(seen)
        if not dead:
            return 0

        def reason(worker: str | None) -> str:
            # Not "crashed: …": the run's status says so, and everything that shows the error
            # shows it after the status ("crashed: crashed: …" otherwise). Its own worker: the
            # gone ones stay listed a while, and were named beside it.
            who = worker or ", ".join(dead)
            return f"its worker process {who} died before the run finished (found by recovery)"

        crashed = released = 0
        for queue in self.backend.queues:
            for job in await queue.held_by(dead):
                run = await self.backend.runs.get_run(job.run_id)
                was_running = may_have_begun(run, job)
                why = reason(job.worker)
                if was_running and run is not None and run.status is not RunStatus.RUNNING:
                    # Handed straight to a slot: its code may have run before its start landed.
                    why += "; its start was not recorded, but the run may have begun there"
                last = seen.get(job.worker) if job.worker else None
                if await self.ledger.release(queue, job, run, why, last):
                    released += 1
                    crashed += was_running
        # Runs of memory queues died with their worker's jobs: nothing to hand back.
        orphans = await self.backend.runs.list_runs(
            RunFilter(status=(str(RunStatus.RUNNING),), workers=tuple(dead)), limit=10_000
        )
        for orphan in orphans:
            run = await self.backend.runs.get_run(orphan.id)
            if run is not None and run.status is RunStatus.RUNNING:
                last = seen.get(run.worker) if run.worker else None
                self.ledger.abandon(run, reason(run.worker), last)
                crashed += 1
        for worker_id in dead:  # its concurrency slots go at once, to the jobs held for them
            for run_id, key in await self.backend.shared.forget_worker(worker_id, listed=True):
                await self._wake_held(run_id, key)
        self._released.update(seen)
        await self.backend.runs.flush()
        if crashed or released:
            log.warning(
                "recovery: %d run(s) of dead workers marked crashed, %d job(s) requeued",
                crashed,
                released,
            )
        return crashed

    async def _wake_held(self, run_id: str, key: str) -> None:
        """A dead worker's run held a slot of `key`: the job held longest behind that key goes
        now, not at the end of its backoff (up to 30 s)."""
        run = await self.backend.runs.get_run(run_id)
        if run is None:
            return
        for queue in self.backend.queues:
            await wake_next(self.ledger, queue, run.queue, key)

    # ---- the janitor -----------------------------------------------------------------------
    async def purge(self) -> int:
        """Delete terminal runs older than the retention, finished jobs, expired cache
        entries; the number of runs deleted."""
        cutoff = self.backend.clock.now() - self.retention  # the clock finished_at is on
        total = 0
        while True:
            began = time.monotonic()
            removed = await self.backend.runs.purge(cutoff, limit=PURGE_CHUNK)
            total += removed
            if removed < PURGE_CHUNK:
                break
            await _rest_after(began)
        for queue in self.backend.queues:
            began = time.monotonic()
            while await queue.purge(cutoff, limit=JOBS_PURGE_CHUNK) == JOBS_PURGE_CHUNK:
                await _rest_after(began)
                began = time.monotonic()
        await self.backend.runs.purge_events(cutoff.timestamp())
        return total

    async def dead_here(self) -> None:
        """A worker of this machine whose process is gone (a kill -9, an OOM kill) is found at
        the next heartbeat, and its jobs released at once: found by its lease running out, its
        jobs waited that long (30 s by default) with a live worker beside it that could see
        the pid was gone, and a producer's `wait_for_job` with them. Its peers on the machine
        may all find it: the releases are fenced, one lands."""
        if not self.recovery:
            return
        while True:
            await anyio.sleep(self.heartbeat_s)
            # Not waiting for this worker's own writes: a flush at every heartbeat broke up
            # the writer's batches (and a peer's death is not among them).
            workers = await self.backend.shared.workers(own_writes=False)
            if any(
                pid_names_process_here(w)
                and self._gone(w)
                and not self._same_beat(self._released.get(w.id), w.heartbeat_at)
                for w in workers
            ):
                await self.recover()

    async def loop(self) -> None:
        """Every janitor interval, if this worker holds the chores' lease: recover dead
        workers, then purge. (Between two rounds, the jobs of a worker that died are taken
        over by the ordinary claims as their leases expire, or found by `dead_here` on this
        machine.)"""
        every = self.janitor_interval
        await self.versions.check(self.backend)  # another version served already, at start?
        while True:
            await anyio.sleep(every)
            await self.versions.check(self.backend)  # every worker: each says it in its log
            if await self.backend.shared.try_lead("chores", self.me.id, 2 * every):
                await self.recover()
                if self.janitor:
                    await self.purge()
