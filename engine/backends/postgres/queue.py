"""Jobs on PostgreSQL: claims under a lease with a fencing token, fenced transitions, signals.

A claim is one statement on a pooled connection (`sql.CLAIM`): it takes due jobs and, in the
same statement, jobs whose lease ran out on the server's clock, noting the worker that lost them
in `taken_from` and bumping the epoch, so the late worker's writes are refused from then on.
Claims run beside the writer, not in its batches: claimers on many machines pass over each
other's rows (SKIP LOCKED) instead of waiting for one another.

A claim takes up to four times what was asked and keeps the extra ahead (as the SQLite queue
does), so that a worker slot that frees up starts its next job without a round trip; while its
slots are busy with short jobs, the worker tops the jobs kept ahead up (`claim_ahead`).
Jobs claimed ahead are `active` under this worker's lease in the database; `stats` counts them
as waiting, and a pause, a stop or a lost lease hands them back (`Ahead`, ../ahead.py).

A claim that finds nothing does not poll the table for the rest of its timeout: it sleeps until
a NOTIFY says its queue has jobs (an enqueue or a settle anywhere, sent in the same
transaction), or until the next delayed job or lease of the queue falls due (an expired lease
is announced by nobody), and looks anyway every LOOK_ANYWAY_S, more often while the listener is
down (notifications may be lost then). A look each second, as before, cost an engine serving
200 idle workflows 200 round trips a second; `benchmarks/idle.py`.

The claim loop around the look (jobs kept ahead, waits between looks) is the one SQLite uses
too (`DatabaseQueue`, ../database_queue.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

import anyio
import asyncpg

from ...models import Job, JobState, LogLine, QueueStats, Run, from_epoch, to_epoch
from ..base import NOTHING_LEFT, Claim, Fence, JobUpdate, Renewal, Transition
from ..database_queue import LOOK_ANYWAY_S, DatabaseQueue
from ..rows import dump, job_from_row, job_row, run_row
from . import sql
from .batch import Conn, clean, write_runs
from .db import PostgresDatabase, Unavailable
from .store import log_params

LOOK_UNHEARD_S = 0.25  # an idle claim looks this often while the listener is down


def update_params(job_id: str, epoch: int, update: JobUpdate) -> tuple[str, tuple[Any, ...]]:
    meta = json.dumps(update.meta) if update.meta is not None else None
    if update.state is JobState.ACTIVE:
        return sql.UPDATE_HELD, (update.run_id, meta, job_id, epoch)
    pending = update.state in (JobState.WAITING, JobState.DELAYED)
    run_at = None if update.force or not pending else to_epoch(update.run_at)
    return sql.UPDATE_JOB, clean(
        (
            str(update.state),
            update.run_id,
            run_at,
            int(update.resume),
            update.error,
            meta,
            update.fresh_budget,
            int(update.force),
            dump(update.headers) if update.headers is not None else None,
            job_id,
            epoch,
        )
    )


class PostgresQueue(DatabaseQueue):
    provider: ClassVar[str] = "postgres"

    def __init__(self, db: PostgresDatabase) -> None:
        super().__init__()
        self.db = db
        self.workers: set[str] = set()  # workers that claimed here
        # A renewal must see every claim this process made before it asked: claims run on
        # their own connections, and a claim committed after the renewal's snapshot would
        # look lost. So a renewal waits for the claims in flight, and new ones wait for it.
        self._claiming = 0
        self._claims_done = anyio.Event()
        self._renewing: anyio.Event | None = None

    # ---- adding and claiming ---------------------------------------------------------------
    async def add(self, jobs: list[Job], runs: list[Run]) -> list[str]:
        if not jobs:
            return []
        job_rows = [clean(job_row(job)) for job in jobs]

        # A run that comes with steps (a replay from a step carries the steps it reuses) is
        # written with its step and attempt rows after its job.
        bare = [clean(run_row(run)) for run in runs if not run.steps]
        whole = [run for run in runs if run.steps]

        async def add(conn: Conn) -> list[str]:
            rows = await conn.fetch(sql.ENQUEUE, job_rows, bare)
            added = [row[0] for row in rows]
            fresh = set(added)
            await write_runs(conn, [(run, None) for run in whole if run.job_id in fresh])
            return added

        # Bare jobs and runs only: the writer may fold them into its batch's statement.
        rows = None if whole else (job_rows, bare)
        added = await self.db.transaction(add, feed=True, enqueue=rows)
        self._wake_added({job.queue for job in jobs})
        return added

    async def _look(
        self,
        queue: str,
        asking: int,
        worker: str,
        lease_s: float,
        *,
        forced_only: bool,
        handing: int,
        deadline: float,
    ) -> tuple[list[Claim], float] | None:
        """One claim statement: up to `asking` jobs, the first `handing` handed to slots, in
        priority order."""
        self.workers.add(worker)
        asked = time.monotonic()
        statement = sql.CLAIM_FORCED if forced_only else sql.CLAIM
        while self._renewing is not None:
            await self._renewing.wait()
        self._claiming += 1
        try:
            rows, next_due = await self.db.pooled(
                lambda c: self._claim(c, statement, queue, asking, worker, lease_s, handing),
                deadline=deadline,
            )
        except Unavailable:
            return None
        finally:
            self._claiming -= 1
            if not self._claiming:
                self._claims_done.set()
                self._claims_done = anyio.Event()
        rows.sort(key=lambda r: (-r["priority"], r["seq"]))
        claims = [
            Claim(
                job_from_row(row),  # type: ignore[arg-type]
                lease_s,
                asked,
                row["taken_from"],
                taken_handed=row["taken_handed"],
            )
            for row in rows
        ]
        return claims, self._look_again_in(next_due)

    def _look_again_in(self, next_due: float | None) -> float:
        """How long a claim that found nothing more waits before it looks again, unless told:
        until something of the queue falls due (`next_due` seconds from now, on the server's
        clock), at most a while (less while notifications may be missed)."""
        look = LOOK_ANYWAY_S if self.db.listener.listening else LOOK_UNHEARD_S
        if next_due is not None:
            look = min(look, max(0.0, float(next_due)))
        return look

    @staticmethod
    async def _claim(
        conn: Conn,
        statement: str,
        queue: str,
        limit: int,
        worker: str,
        lease_s: float,
        handing: int,
    ) -> tuple[list[asyncpg.Record], float | None]:
        rows = await conn.fetch(statement, queue, limit, worker, lease_s, handing)
        if rows:
            return rows, rows[0]["next_due"]
        return rows, await conn.fetchval(sql.NEXT_DUE, queue)

    # ---- transitions -----------------------------------------------------------------------
    def submit(self, transition: Transition) -> None:
        fence = Fence(transition.job_id, transition.epoch)
        for run in transition.runs:
            self.db.save(run, fence)
        for run_id, line in transition.logs:
            self.db.write(sql.INSERT_LOG, log_params(run_id, line, fence), feed=True)
        landed = transition.landed
        if transition.update is not None and (
            landed is None or transition.update.state is not JobState.ACTIVE
        ):
            # A settle whose submitter waits to hear whether it landed rides in the batch's
            # one statement too, which says which jobs it moved on (sql.SETTLED).
            statement, params = update_params(
                transition.job_id, transition.epoch, transition.update
            )
            self.db.write(statement, params, landed=landed)
        elif landed is not None:
            # Whoever waits on this transition is told whether the fence let it land: the job's
            # update (or, for runs alone, the fence itself) inside the batch's transaction.
            job_id, epoch, update = transition.job_id, transition.epoch, transition.update

            async def settle(conn: Conn) -> bool:
                if update is None:
                    return await conn.fetchval(sql.HOLDS, job_id, epoch) is not None
                statement, params = update_params(job_id, epoch, update)
                return await conn.fetchrow(statement, *params) is not None

            self.db.call_soon(settle, lambda done, error: landed(bool(done) and error is None))
        if transition.update is not None and transition.update.state in (
            JobState.WAITING,
            JobState.DELAYED,
        ):
            self.db.after_commit(self.wake_all)

    async def apply(self, transition: Transition) -> bool:
        runs = [(run, None) for run in transition.runs]
        logs = [log_params(run_id, line, None) for run_id, line in transition.logs]

        async def apply(conn: Conn) -> bool:
            if transition.update is not None:
                statement, params = update_params(
                    transition.job_id, transition.epoch, transition.update
                )
                if await conn.fetchrow(statement, *params) is None:
                    return False
            elif await conn.fetchval(sql.HOLDS, transition.job_id, transition.epoch) is None:
                return False
            # The job's update above checked the fence inside this transaction.
            await write_runs(conn, runs)
            if logs:
                await conn.executemany(sql.INSERT_LOG, logs)
            return True

        applied = await self.db.transaction(apply, feed=True)
        if applied and transition.update is not None:
            self.wake_all()
        return applied

    def record(self, run: Run, fence: Fence) -> None:
        self.db.save(run, fence)

    def record_log(self, run_id: str, line: LogLine, fence: Fence) -> None:
        self.db.write(sql.INSERT_LOG, log_params(run_id, line, fence), feed=True)

    async def renew(
        self, worker: str, lease_s: float, leave: Mapping[str, int] = NOTHING_LEFT
    ) -> Renewal:
        self.workers.add(worker)
        asked = time.monotonic()
        renewing = self._renewing = anyio.Event()
        try:
            while self._claiming:
                await self._claims_done.wait()
            rows = await self.db.fetch(
                sql.RENEW, worker, lease_s, list(leave), list(leave.values())
            )
        finally:
            self._renewing = None
            renewing.set()
        held = {row[0]: row[1] for row in rows}
        self._ahead.renewed(held, asked)
        signals = {row[0]: json.loads(row[2]) for row in rows if row[2]}
        return Renewal(held, signals)

    async def signal(self, job_id: str, epoch: int, name: str) -> bool:
        # Straight to the server, not through the writer: it is one statement, and its NOTIFY
        # reaches the holder as soon as it commits.
        rows = await self.db.fetch(sql.SIGNAL, name, job_id, epoch)
        return bool(rows)

    async def signals_for(self, worker: str) -> dict[str, dict[str, float]]:
        self.workers.add(worker)
        rows = await self.db.fetch(sql.SIGNALS_FOR, worker)
        return {row[0]: json.loads(row[1]) for row in rows}

    # ---- reads -----------------------------------------------------------------------------
    async def get_job(self, job_id: str) -> Job | None:
        await self.db.flush()
        row = await self.db.fetchrow(f"{sql.SELECT_JOB} WHERE id = $1", job_id)
        return job_from_row(row) if row else None  # type: ignore[arg-type]

    async def get_jobs(self, job_ids: Sequence[str]) -> list[Job]:
        await self.db.flush()
        rows = await self.db.fetch(f"{sql.SELECT_JOB} WHERE id = ANY($1::text[])", list(job_ids))
        return [job_from_row(row) for row in rows]  # type: ignore[arg-type]

    async def held_by(self, workers: list[str]) -> list[Job]:
        if not workers:
            return []
        await self.db.flush()
        rows = await self.db.fetch(sql.HELD_BY, workers)
        return [job_from_row(row) for row in rows]  # type: ignore[arg-type]

    async def stats(self, queue: str) -> QueueStats:
        await self.db.flush()
        return self._stats(queue, await self.db.fetch(sql.STATS, queue))

    async def oldest_waiting(self, queue: str) -> datetime | None:
        await self.db.flush()
        oldest: float | None = await self.db.fetchval(sql.OLDEST_WAITING, queue)
        # Jobs claimed ahead are waiting too, as in `stats`.
        return from_epoch(self._ahead.oldest_due(queue, oldest))

    async def dead_letters(self, queue: str, limit: int = 1000) -> list[Job]:
        await self.db.flush()
        rows = await self.db.fetch(sql.DEAD_LETTERS, queue, limit)
        return [job_from_row(row) for row in rows]  # type: ignore[arg-type]

    async def gated(self, queue: str, key: str, limit: int) -> list[Job]:
        await self.db.flush()
        rows = await self.db.fetch(sql.GATED, queue, key, limit)
        return [job_from_row(row) for row in rows]  # type: ignore[arg-type]

    async def purge(self, finished_before: datetime, limit: int = 2000) -> int:
        await self.db.flush()
        status = await self.db.pooled(
            lambda c: c.execute(sql.PURGE_JOBS, finished_before.timestamp(), limit)
        )
        return int(status.rsplit(" ", 1)[-1])
