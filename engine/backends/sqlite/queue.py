"""Jobs on SQLite: claims under a lease with a fencing token, fenced transitions, signals.

A claim runs inside the writer's transaction: it finds due jobs and jobs whose lease ran out,
then takes each with an UPDATE … RETURNING that notes the worker that lost it in `taken_from`
and bumps the epoch, so the late worker's writes are refused from then on.

A claim takes up to four times what was asked (like Celery's default prefetch) and keeps the
extra ahead, so that a worker slot that frees up starts its next job without a round trip to
the writer, which is what bounds a busy SQLite queue; while its slots are busy with short jobs,
the worker tops the jobs kept ahead up (`claim_ahead`). Jobs claimed ahead are `active` under
this worker's lease in the file; `stats` counts them as waiting since nothing runs them yet,
and a pause, a stop or a lost lease hands them back (`Ahead`, ../ahead.py). The jobs a claim
gives straight to worker slots are marked `handed` in their rows, in the claim's transaction:
their runs' starts need not be committed before their code runs (engine/worker.py), since a
worker taking such a job over records its run crashed whatever the run's record says. So are
the jobs of a top-up (`claim_ahead`, made only while the worker's jobs are short).

A claim that finds nothing does not poll the file: it sleeps until this process adds or hands
back a job of its queue, another connection commits and may have left its queue something to
claim (the backend watches the file's `data_version`, `SqliteBackend._hear_others`, and
`others_committed` reads which queues), or the queue's next delayed job or lease falls due, and
looks anyway every `LOOK_ANYWAY_S`. Before, each idle queue looked every 50 ms: a
write transaction each, some 4,000 a second for an engine serving 200 idle workflows.

The claim loop around the look (jobs kept ahead, waits between looks) is the one PostgreSQL
uses too (`DatabaseQueue`, ../database_queue.py).
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any, ClassVar

from ...models import Job, JobState, LogLine, QueueStats, Run, from_epoch, to_epoch
from ...records import construct
from .. import rows
from ..base import NOTHING_LEFT, Claim, Fence, JobUpdate, Renewal, Transition
from ..database_queue import LOOK_ANYWAY_S, DatabaseQueue, Offer, PendingAdd
from ..held_for import HELD_FOR
from ..rows import JOB_COLUMNS, dump, job_from_row, job_row
from .db import INLINE_WEIGHT, INSERT_LOG, InTransaction, SqliteDatabase, write_runs
from .store import log_row

STATS = rows.STATS.format(unstarted=rows.UNSTARTED_RUN, now="?1", queue="?2")
OLDEST_WAITING = rows.OLDEST_WAITING.format(greatest="max", now="?1", queue="?2")
CHUNK = 500  # ids one statement names: well under SQLite's limit on bound values
SELECT_JOB = f"SELECT {', '.join(JOB_COLUMNS)} FROM jobs"
# The concurrency gate's held jobs of a key, read from their own index (schema.py: jobs_gated).
GATED = (
    f"{SELECT_JOB} WHERE queue = ? AND state = 'delayed'"
    " AND json_extract(meta, '$.gate.gate') = 'concurrency'"
    " AND json_extract(meta, '$.gate.key') = ? ORDER BY priority DESC, seq LIMIT ?"
)
INSERT_JOB = (
    f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)}) VALUES ({', '.join('?' * len(JOB_COLUMNS))})"
    " ON CONFLICT(id) DO NOTHING"
)
UPDATE_JOB = (
    "UPDATE jobs SET state = ?, run_id = ?, run_at = ?, resume = ?, error = ?,"
    " meta = coalesce(?, meta), attempts = CASE WHEN ? THEN 0 ELSE attempts END, forced = ?,"
    " headers = coalesce(?, headers), finished_at = ?, worker = NULL, lease_until = NULL,"
    " signals = NULL, handed = 0, epoch = epoch + 1 WHERE id = ? AND epoch = ?"
)
# The same when the job keeps its run (a settle): run_id, indexed, is left out of the SET, so
# its index entry is not rewritten.
UPDATE_JOB_SAME_RUN = UPDATE_JOB.replace(" run_id = ?,", "")
# The holder's own update while it keeps the job: a new run after a takeover, or the record of
# a run it stopped. The run's record is the holder's own from then on: no longer `handed`.
UPDATE_HELD = (
    "UPDATE jobs SET run_id = coalesce(?, run_id), meta = coalesce(?, meta), handed = 0"
    " WHERE id = ? AND epoch = ?"
)


def update_params(job_id: str, epoch: int, update: JobUpdate) -> tuple[str, tuple[Any, ...]]:
    meta = json.dumps(update.meta) if update.meta is not None else None
    if update.state is JobState.ACTIVE:
        return UPDATE_HELD, (update.run_id, meta, job_id, epoch)
    pending = update.state in (JobState.WAITING, JobState.DELAYED)
    run_at = None if update.force or not pending else to_epoch(update.run_at)
    state = update.state
    if pending:
        state = (
            JobState.DELAYED if run_at is not None and run_at > time.time() else JobState.WAITING
        )
    if update.run_id is None:
        return UPDATE_JOB_SAME_RUN, (
            str(state),
            run_at,
            int(update.resume),
            update.error,
            meta,
            int(update.fresh_budget),
            int(update.force),
            dump(update.headers) if update.headers is not None else None,
            None if pending else time.time(),
            job_id,
            epoch,
        )
    return UPDATE_JOB, (
        str(state),
        update.run_id,
        run_at,
        int(update.resume),
        update.error,
        meta,
        int(update.fresh_budget),
        int(update.force),
        dump(update.headers) if update.headers is not None else None,
        None if pending else time.time(),
        job_id,
        epoch,
    )


# A claim finds its jobs first, then takes them one UPDATE by primary key each: one statement
# with the search as a subquery (`WHERE seq IN (SELECT … UNION ALL … ORDER BY … LIMIT ?)`)
# cost ten times as much (a co-routine, a list subquery and a temporary b-tree for every claim).
_DUE = (
    "SELECT seq, priority, 0 FROM jobs WHERE queue = ?1 AND state = 'waiting'"
    " AND (run_at IS NULL OR run_at <= ?2) AND {forced} ORDER BY priority DESC, seq LIMIT ?3"
)
# Delayed jobs whose time has come, found by their time (`jobs_due_at`): searched in claim
# order with the waiting ones, a claim walked every delayed job of the queue (80 ms a claim
# with 100,000 scheduled a month ahead, or as many runs in a `wait.for_`).
# A job this worker (?4) held back for another it passes over a while (`held_for.py`).
_DUE_DELAYED = (
    "SELECT seq, priority, 0 FROM jobs WHERE queue = ?1 AND state = 'delayed' AND run_at <= ?2"
    f" AND NOT (coalesce(json_extract(meta, '$.{HELD_FOR}.until') > ?2, 0) AND EXISTS"
    f" (SELECT 1 FROM json_each(meta, '$.{HELD_FOR}.not') WHERE value = ?4))"
    " AND {forced} ORDER BY priority DESC, seq LIMIT ?3"
)
# A queue paused by another process gives only forced jobs even before this worker hears of
# the pause: the pause is a row the claim reads, so a job enqueued after `pause` returned
# waits. Read inside the search (SQLite evaluates the subquery once a statement), not by a
# statement of its own before it: one statement fewer a claim, as on PostgreSQL.
_UNPAUSED = "(forced = 1 OR NOT EXISTS (SELECT 1 FROM paused_queues WHERE queue = ?1))"
DUE = _DUE.format(forced=_UNPAUSED)
DUE_FORCED = _DUE.format(forced="forced = 1")
DUE_DELAYED = _DUE_DELAYED.format(forced=_UNPAUSED)
DUE_DELAYED_FORCED = _DUE_DELAYED.format(forced="forced = 1")
# Jobs whose lease ran out, the longest expired first (the order of the jobs_active index: no
# sort); merged with the due ones by priority below.
EXPIRED = (
    "SELECT seq, priority, handed FROM jobs WHERE queue = ? AND state = 'active' AND lease_until < ?"
    " ORDER BY lease_until LIMIT ?"
)
TAKE = (
    "UPDATE jobs SET taken_from = CASE WHEN state = 'active' THEN worker END,"
    " state = 'active', worker = ?, lease_until = ?, attempts = attempts + 1,"
    " epoch = epoch + 1, signals = NULL, handed = ? WHERE seq = ?"
    f" RETURNING {', '.join(JOB_COLUMNS)}, taken_from"
)
FORCED_WAITING = (
    "SELECT 1 FROM jobs WHERE queue = ? AND state IN ('waiting', 'delayed') AND forced = 1 LIMIT 1"
)


def _claim(
    conn: sqlite3.Connection,
    queue: str,
    limit: int,
    worker: str,
    lease_s: float,
    forced_only: bool,
    handing: int,
) -> tuple[list[Claim], float | None]:
    """Inside the writer's transaction: take due jobs and jobs whose lease ran out, highest
    priority first, then oldest; the first `handing` go straight to worker slots (`handed`),
    the rest are kept ahead."""
    asked = time.monotonic()
    now = time.time()
    params = (queue, now, limit)
    due = conn.execute(DUE_FORCED if forced_only else DUE, params).fetchall()
    delayed = DUE_DELAYED_FORCED if forced_only else DUE_DELAYED
    due += conn.execute(delayed, (*params, worker)).fetchall()
    due += conn.execute(EXPIRED, params).fetchall()
    found = sorted(due, key=lambda r: (-r[1], r[0]))[:limit]
    claimed: list[Claim] = []
    for i, (seq, _, was_handed) in enumerate(found):
        row = conn.execute(TAKE, (worker, now + lease_s, int(i < handing), seq)).fetchone()
        taken_from = row["taken_from"]
        claimed.append(
            Claim(
                job_from_row(row),
                lease_s,
                asked,
                taken_from,
                taken_handed=taken_from is not None and bool(was_handed),
            )
        )
    next_due = None
    if len(claimed) < limit:  # all there was: when to look again (`SqliteQueue.claim`)
        next_due = conn.execute(NEXT_DUE, (queue, now)).fetchone()[0]
    return claimed, next_due


# When something of the queue falls due: its next delayed job, or the next lease to run out
# (another worker's, which nobody announces; this worker's own are renewed long before). A
# delayed job due already and not claimed is one the claim passed over (held for another
# worker, or the queue paused by another process): counted, it made the claim look again
# at once, and again, until it was claimed.
NEXT_DUE = (
    "SELECT min(due) FROM (SELECT min(run_at) AS due FROM jobs WHERE queue = ?1"
    " AND state = 'delayed' AND run_at > ?2 UNION ALL SELECT min(lease_until) FROM jobs"
    " WHERE queue = ?1 AND state = 'active')"
)
# Of the queues given (a JSON array), those where another connection's commit may have left
# something to claim: a job waiting or delayed, or a lease running out before the next look.
MAY_HAVE_JOBS = (
    "SELECT value FROM json_each(?1) WHERE EXISTS (SELECT 1 FROM jobs WHERE queue = value"
    " AND state IN ('waiting', 'delayed')) OR EXISTS (SELECT 1 FROM jobs WHERE queue = value"
    " AND state = 'active' AND lease_until < ?2)"
)


PAUSED = "SELECT 1 FROM paused_queues WHERE queue = ?"


def handed_job(job: Job, offer: Offer, now: float) -> Job:
    """A job being added, as the claim of `offer` takes it (`TAKE`): active under its worker's
    lease, one delivery, the epoch moved on, and `handed` straight to a slot."""
    fields = dict(job.__dict__)
    fields.update(
        state=JobState.ACTIVE,
        attempts=job.attempts + 1,
        epoch=job.epoch + 1,
        worker=offer.worker,
        lease_until=from_epoch(now + offer.lease_s),
        signals={},
        handed=True,
    )
    return construct(Job, fields)


async def _handed_to(
    call: InTransaction[tuple[list[str], dict[Offer, list[Claim]]]], offer: Offer
) -> list[Claim]:
    """What the sleeping claim of `offer` gets from an add: its claims once committed, none if
    the add failed (its caller hears why)."""
    await call.done.wait()
    if call.error is not None or call.result is None:
        return []
    return call.result[1].get(offer, [])


class SqliteQueue(DatabaseQueue):
    provider: ClassVar[str] = "sqlite"
    hands_off: ClassVar[bool] = True

    def __init__(self, db: SqliteDatabase, poll_s: float = LOOK_ANYWAY_S) -> None:
        super().__init__()
        self.db = db
        self.poll_s = poll_s
        # The writer's order of adds and looks (`_wake_added`): a number each when it runs,
        # and by queue, the number of the last look that took all there was.
        self._order = itertools.count()
        self._drained_at: dict[str, int] = {}

    # ---- adding and claiming ---------------------------------------------------------------
    async def add(self, jobs: list[Job], runs: list[Run]) -> list[str]:
        by_job = {run.job_id: run for run in runs}
        pending: PendingAdd | None = None  # set as soon as the add is queued
        ran = 0  # its place in the writer's order (`_drained_at`), once it ran

        def add(conn: sqlite3.Connection) -> tuple[list[str], dict[Offer, list[Claim]]]:
            nonlocal ran
            ran = next(self._order)
            added: list[str] = []
            handed: dict[Offer, list[Claim]] = {}
            offers = pending.assign(jobs) if pending is not None else {}
            asked, now = time.monotonic(), time.time()
            # Handed over only where no other process has paused the queue: a claim reads
            # the pause in the same transaction (`DUE`). Read once a queue.
            offered = {job.queue for job in jobs if job.id in offers}
            open_queues = {q for q in offered if not conn.execute(PAUSED, (q,)).fetchone()}
            for job in jobs:
                offer = offers.get(job.id)
                if offer is not None and job.queue in open_queues:
                    taken = handed_job(job, offer, now)
                    if conn.execute(INSERT_JOB, job_row(taken)).rowcount == 1:
                        added.append(job.id)
                        handed.setdefault(offer, []).append(Claim(taken, offer.lease_s, asked))
                elif conn.execute(INSERT_JOB, job_row(job)).rowcount == 1:
                    added.append(job.id)
            write_runs(conn, [(by_job[i], None) for i in added if i in by_job])
            return added, handed

        try:
            call = self.db.call_soon(add, weight=len(jobs) + len(runs))
            pending = self._pending_add(jobs, partial(_handed_to, call))
            soon = not self.claimed_here(job.queue for job in jobs)
            added, handed = await self.db.outcome(call, soon=soon)
        finally:
            self._added(pending)
            # `add` reads it and `pending` holds `call`, which holds `add`: a reference cycle
            # an add, left to the cyclic collector (its collections, walking every record a
            # caller keeps, took 6 % of a job on the contract path at N = 5,000).
            pending = None
        taken = {c.job.id for claims in handed.values() for c in claims}
        # A queue a look took all of after this add ran (in the same transaction, mostly:
        # the claim's look queued behind the add) has no claim to wake for these jobs: that
        # look took them. Woken, the claim would look again for nothing, in the transaction
        # after, rather than wait for the next add and be handed its jobs.
        looked = self._drained_at
        self._wake_added(
            {job.queue for job in jobs if job.id not in taken and looked.get(job.queue, -1) < ran}
        )
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
    ) -> tuple[list[Claim], float]:
        """One claim in the writer's transaction (`_claim`), after the transaction's adds
        (`late`), so that it takes their jobs; the writer waits for the file however long it
        is locked, so `deadline` is not needed."""
        # A paused queue's claims want only jobs an operator forced, which no index finds:
        # looked for with a read in aiosqlite's thread, not in a write transaction.
        if forced_only and not await self.db.fetchone(FORCED_WAITING, (queue,)):
            return [], self.poll_s

        def look(conn: sqlite3.Connection) -> tuple[list[Claim], float | None]:
            ran = next(self._order)
            claimed, next_due = _claim(conn, queue, asking, worker, lease_s, forced_only, handing)
            if len(claimed) < asking and not forced_only:  # all there was
                self._drained_at[queue] = ran
            return claimed, next_due

        claims, next_due = await self.db.transaction(look, late=True)
        return claims, self._look_again_in(next_due)

    def _look_again_in(self, next_due: float | None) -> float:
        """How long a claim that found nothing more waits, unless woken, before it looks again:
        `poll_s`, or less if the queue's next delayed job or lease falls due sooner."""
        if next_due is None:
            return self.poll_s
        return max(0.0, min(self.poll_s, next_due - time.time()))

    def others_committed(self) -> bool:
        """Another connection committed (`SqliteBackend._hear_others`): wake the claims asleep on
        the queues where it may have left something to claim, found with one read of index
        entries. Not every claim of the file: next to a process that keeps the file busy, an
        engine serving 200 idle workflows looked in each of them 20 times a second. Whether it
        woke any."""
        asleep = sorted({*self._signals, *self._forced_signals})
        if not asleep:
            return False
        params = (json.dumps(asleep), time.time() + self.poll_s)
        rows = self.db.read(
            lambda conn: conn.execute(MAY_HAVE_JOBS, params).fetchall(), snapshot=False
        )
        for (queue,) in rows:
            self.wake(queue)
        return bool(rows)

    # ---- transitions -----------------------------------------------------------------------
    def submit(self, transition: Transition) -> None:
        fence = Fence(transition.job_id, transition.epoch)
        for run in transition.runs:
            self.db.save(run, fence)
        for run_id, line in transition.logs:
            self.db.write(INSERT_LOG, log_row(run_id, line, fence), run_id)
        if transition.update is not None:
            sql, params = update_params(transition.job_id, transition.epoch, transition.update)
            self.db.write(sql, params, transition.job_id, transition.landed)
            if transition.update.state in (JobState.WAITING, JobState.DELAYED):
                self.wake_all()
        elif transition.landed is not None:  # runs only: the fence is the answer
            self.db.write(
                "UPDATE jobs SET epoch = epoch WHERE id = ? AND epoch = ?",
                (transition.job_id, transition.epoch),
                transition.job_id,
                transition.landed,
            )

    async def apply(self, transition: Transition) -> bool:
        def apply(conn: sqlite3.Connection) -> bool:
            if transition.update is not None:
                sql, params = update_params(transition.job_id, transition.epoch, transition.update)
                if conn.execute(sql, params).rowcount != 1:
                    return False
            else:
                row = conn.execute(
                    "SELECT 1 FROM jobs WHERE id = ? AND epoch = ?",
                    (transition.job_id, transition.epoch),
                ).fetchone()
                if row is None:
                    return False
            # The job's update above checked the fence inside this transaction.
            write_runs(conn, [(run, None) for run in transition.runs])
            if transition.logs:
                conn.executemany(
                    INSERT_LOG, [log_row(run_id, line, None) for run_id, line in transition.logs]
                )
            return True

        applied = await self.db.transaction(apply)
        if applied and transition.update is not None:
            self.wake_all()
        return applied

    def record(self, run: Run, fence: Fence) -> None:
        self.db.save(run, fence)

    def record_log(self, run_id: str, line: LogLine, fence: Fence) -> None:
        self.db.write(INSERT_LOG, log_row(run_id, line, fence), run_id)

    async def renew(
        self, worker: str, lease_s: float, leave: Mapping[str, int] = NOTHING_LEFT
    ) -> Renewal:
        def renew(conn: sqlite3.Connection) -> list[Any]:
            # Not a lease that ran out: the job is no longer this worker's, whether or not
            # another took it yet (its holder, frozen meanwhile, stops it and records nothing;
            # renewed, it would hold the job for ever, its outcome dropped).
            now = time.time()
            return conn.execute(
                "UPDATE jobs SET lease_until = ? WHERE worker = ? AND state = 'active'"
                " AND lease_until > ? AND id || ':' || epoch NOT IN"
                " (SELECT value FROM json_each(?)) RETURNING id, epoch, signals",
                (now + lease_s, worker, now, json.dumps([f"{i}:{e}" for i, e in leave.items()])),
            ).fetchall()

        asked = time.monotonic()
        rows = await self.db.transaction(renew)
        held = {row[0]: row[1] for row in rows}
        self._ahead.renewed(held, asked)
        signals = {row[0]: json.loads(row[2]) for row in rows if row[2]}
        return Renewal(held, signals)

    async def signal(self, job_id: str, epoch: int, name: str) -> bool:
        def signal(conn: sqlite3.Connection) -> bool:
            return (
                conn.execute(
                    "UPDATE jobs SET signals = json_set(coalesce(signals, '{}'), '$.' || ?, ?)"
                    " WHERE id = ? AND epoch = ? AND state = 'active'",
                    (name, time.time(), job_id, epoch),
                ).rowcount
                == 1
            )

        return await self.db.transaction(signal)

    async def signals_for(self, worker: str) -> dict[str, dict[str, float]]:
        rows = await self.db.fetchall(
            "SELECT id, signals FROM jobs WHERE worker = ? AND state = 'active'"
            " AND signals IS NOT NULL",
            (worker,),
        )
        return {row[0]: json.loads(row[1]) for row in rows}

    # ---- reads -----------------------------------------------------------------------------
    async def get_job(self, job_id: str) -> Job | None:
        await self.db.flush_for(job_id)
        row = self.db.read_one(f"{SELECT_JOB} WHERE id = ?", (job_id,))
        return job_from_row(row) if row else None

    async def get_jobs(self, job_ids: Sequence[str]) -> list[Job]:
        await self.db.flush()
        found: list[Job] = []
        for start in range(0, len(job_ids), CHUNK):
            chunk = tuple(job_ids[start : start + CHUNK])
            rows = await self.db.fetchall(
                f"{SELECT_JOB} WHERE id IN ({', '.join('?' * len(chunk))})", chunk
            )
            found.extend(job_from_row(row) for row in rows)
        return found

    async def held_by(self, workers: list[str]) -> list[Job]:
        if not workers:
            return []
        await self.db.flush()
        rows = await self.db.fetchall(
            f"{SELECT_JOB} WHERE state = 'active' AND worker IN ({', '.join('?' * len(workers))})",
            tuple(workers),
        )
        return [job_from_row(row) for row in rows]

    async def stats(self, queue: str) -> QueueStats:
        await self.db.flush()
        rows = await self.db.fetchall(STATS, (time.time(), queue))
        return self._stats(queue, rows)

    async def oldest_waiting(self, queue: str) -> datetime | None:
        await self.db.flush()
        row = await self.db.fetchone(OLDEST_WAITING, (time.time(), queue))
        # Jobs claimed ahead are waiting too, as in `stats`.
        return from_epoch(self._ahead.oldest_due(queue, row[0] if row else None))

    async def dead_letters(self, queue: str, limit: int = 1000) -> list[Job]:
        await self.db.flush()
        rows = await self.db.fetchall(
            f"{SELECT_JOB} WHERE queue = ? AND state = 'dead' ORDER BY finished_at DESC LIMIT ?",
            (queue, limit),
        )
        return [job_from_row(row) for row in rows]

    async def gated(self, queue: str, key: str, limit: int) -> list[Job]:
        await self.db.flush()
        rows = await self.db.fetchall(GATED, (queue, key, limit))
        return [job_from_row(row) for row in rows]

    async def purge(self, finished_before: datetime, limit: int = 2000) -> int:
        def purge(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE state IN"
                " ('completed', 'failed', 'cancelled') AND finished_at < ? LIMIT ?)",
                (finished_before.timestamp(), limit),
            ).rowcount

        return await self.db.transaction(purge, weight=INLINE_WEIGHT + 1)  # off the loop
