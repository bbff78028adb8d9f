"""The durable queue on SQLite: jobs survive a restart and several processes share one file.

A claim is one `UPDATE … RETURNING` inside the writer's `BEGIN IMMEDIATE` transaction, so two
processes can never take the same job. A claimed job carries a lease that its worker renews;
once a lease expires (the worker died) the next claim takes the job again and marks the run
the dead worker left behind as crashed.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import deque
from datetime import datetime
from functools import partial
from typing import Any

import anyio

from .models import Job, JobState, QueueStats, Run, from_epoch, to_epoch
from .queue import JobQueue, QueueError
from .redact import redact_headers
from .sqlite_db import SqliteDatabase
from .sqlite_store import crash_runs

JOB_COLUMNS = (
    "id, queue, workflow_name, payload, headers, priority, state, run_at, attempts,"
    " max_retries, run_id, created_at, finished_at, error, worker, lease_until, resume, meta"
)
INSERT_JOB = f"INSERT OR IGNORE INTO jobs ({JOB_COLUMNS}) VALUES ({', '.join('?' * 18)})"
SETTLE_DONE = (
    "UPDATE jobs SET state = ?, finished_at = ?, error = ?, run_id = ?, meta = ?, worker = NULL,"
    " lease_until = NULL, headers = coalesce(?, headers) WHERE id = ? AND worker IS ?"
)
SETTLE_AGAIN = (
    "UPDATE jobs SET state = ?, run_at = ?, run_id = ?, resume = ?, error = ?, meta = ?,"
    " worker = NULL, lease_until = NULL WHERE id = ? AND worker IS ?"
)
# Both settle only a job the settling worker still holds (`AND worker IS ?`): once its lease
# expired and another worker took the job, a late settle from the first one is dropped.
CRASH_REASON = "worker {worker} stopped holding the job (lease expired); the job was redelivered"


def job_from_row(row: Any) -> Job:
    meta = json.loads(row[17]) if row[17] else {}
    job = Job.model_construct(
        id=row[0],
        queue=row[1],
        workflow_name=row[2],
        payload=json.loads(row[3]) if row[3] is not None else None,
        headers=json.loads(row[4]) if row[4] else {},
        priority=row[5],
        state=JobState(row[6]),
        run_at=from_epoch(row[7]),
        attempts=row[8],
        max_retries=row[9],
        run_id=row[10],
        created_at=from_epoch(row[11]),
        finished_at=from_epoch(row[12]),
        error=row[13],
        worker=row[14],
        resume=bool(row[16]),
        meta=meta,
    )
    return job


class SqliteQueue(JobQueue):
    provider = "sqlite"

    def __init__(self, db: SqliteDatabase, lease_s: float = 30.0, poll_s: float = 0.05) -> None:
        self.db = db
        self.lease_s = lease_s
        self.poll_s = poll_s
        self._signals: dict[str, anyio.Event] = {}
        self._store_rows: Any = None
        self._next_lease_check = 0.0
        # Claimed ahead (a claim takes four times what was asked, like Celery's default
        # prefetch; the extra wait here), so that a worker slot that frees up starts its next
        # job without a claim round trip, which is what bounds a busy SQLite queue. They are
        # `active` under this worker's lease in the file; `stats` counts them as waiting,
        # since nothing runs them yet, and a pause, a stop or a cancel hands them back.
        self._ahead: dict[str, deque[Job]] = {}

    async def health(self) -> dict[str, object]:
        row = await self.db.fetchone("PRAGMA quick_check")
        return {
            "provider": self.provider,
            "ok": bool(row and row[0] == "ok"),
            "path": str(self.db.path),
        }

    def wake(self, queue: str) -> None:
        signal = self._signals.pop(queue, None)
        if signal is not None:
            signal.set()

    async def add(self, jobs: list[Job], runs: list[Run]) -> None:
        for job in jobs:
            self.db.write(INSERT_JOB, _job_row(job))
        await self.db.flush()
        for queue in {job.queue for job in jobs}:
            self.wake(queue)

    def claim_nowait(self, queue: str, worker: str) -> Job | None:
        ahead = self._ahead.get(queue)
        return ahead.popleft() if ahead else None

    def return_ahead(self, queue: str) -> None:
        ahead = self._ahead.pop(queue, None)
        for job in ahead or ():
            self.settle(job, JobState.WAITING)

    async def claim(self, queue: str, limit: int, worker: str, timeout: float) -> list[Job]:
        ahead = self._ahead.get(queue)
        if ahead:
            return [ahead.popleft() for _ in range(min(limit, len(ahead)))]
        deadline = time.monotonic() + timeout
        while True:
            now = time.time()
            check_leases = now >= self._next_lease_check
            if check_leases:
                self._next_lease_check = now + min(1.0, self.lease_s / 3)
            jobs, next_due = await self.db.run_claim(
                partial(
                    _claim,
                    queue=queue,
                    limit=4 * limit,
                    worker=worker,
                    now=now,
                    lease_s=self.lease_s,
                    check_leases=check_leases,
                )
            )
            if jobs:
                if len(jobs) > limit:
                    self._ahead.setdefault(queue, deque()).extend(jobs[limit:])
                return jobs[:limit]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            pause = min(remaining, self.poll_s if next_due is None else max(0.0, next_due - now))
            # Another process may add jobs at any time, so a local wake-up is only a shortcut.
            signal = self._signals.setdefault(queue, anyio.Event())
            with anyio.move_on_after(max(pause, 0.001)):
                await signal.wait()

    def settle(self, job: Job, state: JobState, *, run_at: datetime | None = None) -> None:
        if state in (JobState.WAITING, JobState.DELAYED):
            delayed = run_at is not None and run_at.timestamp() > time.time()
            self.db.write(
                SETTLE_AGAIN,
                (
                    str(JobState.DELAYED if delayed else JobState.WAITING),
                    to_epoch(run_at),
                    job.run_id,
                    int(job.resume),
                    job.error,
                    _meta(job),
                    job.id,
                    job.worker,
                ),
            )
            self.wake(job.queue)
        else:
            self.db.write(
                SETTLE_DONE,
                (
                    str(state),
                    time.time(),
                    job.error,
                    job.run_id,
                    _meta(job),
                    _headers_once_ended(job, state),
                    job.id,
                    job.worker,
                ),
            )

    def assign_run(self, job: Job) -> None:
        self.db.write(
            "UPDATE jobs SET run_id = ?, meta = ? WHERE id = ?", (job.run_id, _meta(job), job.id)
        )

    def renew(self, worker: str, lease_s: float) -> None:
        self.db.write(
            "UPDATE jobs SET lease_until = ? WHERE worker = ? AND state = 'active'",
            (time.time() + lease_s, worker),
        )

    async def release_worker(self, worker: str) -> int:
        for ahead in self._ahead.values():  # this worker's active jobs: released below
            for job in [j for j in ahead if j.worker == worker]:
                ahead.remove(job)

        def release(conn: sqlite3.Connection) -> int:
            cursor = conn.execute(
                "UPDATE jobs SET state = 'waiting', worker = NULL, lease_until = NULL"
                " WHERE worker = ? AND state = 'active'",
                (worker,),
            )
            return cursor.rowcount

        return await self.db.run_claim(release)

    async def cancel_pending(self, job_id: str) -> bool:
        for ahead in self._ahead.values():
            held = next((job for job in ahead if job.id == job_id), None)
            if held is not None:
                ahead.remove(held)
                return await self.db.run_claim(partial(_cancel_held, job=held))

        def cancel(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE jobs SET state = 'cancelled', finished_at = ? WHERE id = ?"
                " AND state IN ('waiting', 'delayed')",
                (time.time(), job_id),
            )
            return cursor.rowcount == 1

        return await self.db.run_claim(cancel)

    async def get_job(self, job_id: str) -> Job | None:
        await self.db.flush()
        row = await self.db.fetchone(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,))
        return job_from_row(row) if row else None

    async def stats(self, queue: str) -> QueueStats:
        await self.db.flush()
        now = time.time()
        rows = await self.db.fetchall(
            "SELECT state, run_at > ? AS later, count(*) FROM jobs WHERE queue = ?"
            " GROUP BY state, later",
            (now, queue),
        )
        counts = dict.fromkeys(JobState, 0)
        for state, later, count in rows:
            job_state = JobState(state)
            if job_state in (JobState.WAITING, JobState.DELAYED):
                job_state = JobState.DELAYED if later else JobState.WAITING
            counts[job_state] += count
        ahead = len(self._ahead.get(queue) or ())
        counts[JobState.ACTIVE] -= ahead
        counts[JobState.WAITING] += ahead
        return QueueStats(
            queue=queue,
            waiting=counts[JobState.WAITING],
            active=counts[JobState.ACTIVE],
            completed=counts[JobState.COMPLETED],
            failed=counts[JobState.FAILED],
            delayed=counts[JobState.DELAYED],
            dead=counts[JobState.DEAD],
            cancelled=counts[JobState.CANCELLED],
        )

    async def dead_letters(self, queue: str, limit: int = 1000) -> list[Job]:
        await self.db.flush()
        rows = await self.db.fetchall(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE queue = ? AND state = 'dead'"
            " ORDER BY finished_at DESC LIMIT ?",
            (queue, limit),
        )
        return [job_from_row(row) for row in rows]

    async def requeue(self, job_id: str, run: Run) -> Job:
        def requeue(conn: sqlite3.Connection) -> Job:
            row = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise QueueError(f"no job {job_id!r}")
            if row[6] not in ("dead", "failed"):
                raise QueueError(f"job {job_id} is {row[6]}, only dead or failed jobs are requeued")
            conn.execute(
                "UPDATE jobs SET state = 'waiting', run_id = ?, attempts = 0, run_at = NULL,"
                " finished_at = NULL, error = NULL, resume = 0 WHERE id = ?",
                (run.id, job_id),
            )
            row = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
            return job_from_row(row)

        # QueueError is not an sqlite3.Error, so it aborts the whole batch; check first.
        current = await self.get_job(job_id)
        if current is None:
            raise QueueError(f"no job {job_id!r}")
        if current.state not in (JobState.DEAD, JobState.FAILED):
            raise QueueError(
                f"job {job_id} is {current.state}, only dead or failed jobs are requeued"
            )
        job = await self.db.run_claim(lambda conn: _safe(requeue, conn))
        if isinstance(job, QueueError):
            raise job
        self.wake(job.queue)
        return job

    async def take(self, job_id: str, worker: str) -> Job | None:
        lease_until = time.time() + self.lease_s

        def take(conn: sqlite3.Connection) -> Job | None:
            row = conn.execute(
                "UPDATE jobs SET state = 'active', worker = ?, lease_until = ?,"
                " attempts = attempts + 1 WHERE id = ? AND state IN ('waiting', 'delayed')"
                f" RETURNING {JOB_COLUMNS}",
                (worker, lease_until, job_id),
            ).fetchone()
            return job_from_row(row) if row else None

        return await self.db.run_claim(take)

    async def make_due(self, job_id: str) -> Job | None:
        now = time.time()

        def make_due(conn: sqlite3.Connection) -> Job | None:
            row = conn.execute(
                "UPDATE jobs SET state = 'waiting', run_at = ? WHERE id = ?"
                f" AND state IN ('waiting', 'delayed') RETURNING {JOB_COLUMNS}",
                (now, job_id),
            ).fetchone()
            return job_from_row(row) if row else None

        job = await self.db.run_claim(make_due)
        if job is not None:
            self.wake(job.queue)
        return job


def _headers_once_ended(job: Job, state: JobState) -> str | None:
    """A job that can no longer run needs no secret header values: keep them redacted, like
    its run. Failed and dead jobs keep theirs, since a requeue runs them again."""
    if state in (JobState.COMPLETED, JobState.CANCELLED) and job.headers:
        redacted = redact_headers(job.headers)
        if redacted != job.headers:
            return json.dumps(redacted)
    return None


def _cancel_held(conn: sqlite3.Connection, job: Job) -> bool:
    """Cancel a job this worker claimed ahead and has not started."""
    cursor = conn.execute(
        "UPDATE jobs SET state = 'cancelled', finished_at = ?, worker = NULL, lease_until = NULL"
        " WHERE id = ? AND state = 'active' AND worker IS ?",
        (time.time(), job.id, job.worker),
    )
    return cursor.rowcount == 1


def _meta(job: Job) -> str | None:
    return json.dumps(job.meta) if job.meta else None


def _safe(fn: Any, conn: sqlite3.Connection) -> Any:
    try:
        return fn(conn)
    except QueueError as error:
        return error


def _job_row(job: Job) -> tuple[Any, ...]:
    return (
        job.id,
        job.queue,
        job.workflow_name,
        json.dumps(job.payload),
        json.dumps(job.headers) if job.headers else None,
        job.priority,
        str(job.state),
        to_epoch(job.run_at),
        job.attempts,
        job.max_retries,
        job.run_id,
        job.created_at.timestamp(),
        None,
        None,
        None,
        None,
        int(job.resume),
        json.dumps(job.meta) if job.meta else None,
    )


def _claim(
    conn: sqlite3.Connection,
    queue: str,
    limit: int,
    worker: str,
    now: float,
    lease_s: float,
    check_leases: bool,
) -> tuple[list[Job], float | None]:
    """Runs inside the writer's transaction: take due jobs, and jobs whose lease expired."""
    jobs: list[Job] = []
    if check_leases:
        expired = conn.execute(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE state = 'active' AND lease_until < ?"
            " AND queue = ? LIMIT ?",
            (now, queue, limit),
        ).fetchall()
        for row in expired:
            crashed = crash_runs(conn, CRASH_REASON.format(worker=row[14]), run_ids=[row[10]])
            conn.execute(
                "UPDATE jobs SET worker = ?, lease_until = ?, attempts = attempts + 1 WHERE id = ?",
                (worker, now + lease_s, row[0]),
            )
            job = job_from_row(row)
            job.worker, job.attempts = worker, job.attempts + 1
            if crashed:
                # Its run died with the worker: the next delivery starts a new run.
                job.meta["redelivered"] = True
                job.resume = False
            jobs.append(job)
    if len(jobs) < limit:
        rows = conn.execute(
            f"UPDATE jobs SET state = 'active', worker = ?, lease_until = ?,"
            f" attempts = attempts + 1 WHERE seq IN (SELECT seq FROM jobs"
            f" WHERE queue = ? AND state IN ('waiting', 'delayed')"
            f" AND (run_at IS NULL OR run_at <= ?) ORDER BY priority DESC, seq LIMIT ?)"
            f" RETURNING {JOB_COLUMNS}, priority AS p, seq",
            (worker, now + lease_s, queue, now, limit - len(jobs)),
        ).fetchall()
        # RETURNING does not keep the subquery's order.
        rows.sort(key=lambda r: (-r[18], r[19]))
        jobs.extend(job_from_row(row) for row in rows)
    next_due = None
    if not jobs:
        row = conn.execute(
            "SELECT min(run_at) FROM jobs WHERE queue = ? AND state = 'delayed'", (queue,)
        ).fetchone()
        next_due = row[0] if row else None
    return jobs, next_due
