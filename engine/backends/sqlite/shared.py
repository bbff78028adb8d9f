"""What the processes on one SQLite file share: workers, catalogs, pauses, concurrency slots,
debounce windows, schedules, rate-limit windows and leader leases."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from typing import TypeVar

from ...models import WorkerInfo
from ..base import (
    ScheduleSpec,
    ScheduleState,
    SharedState,
    Window,
    WorkerCatalog,
)
from ..places import RateDecision, decide_start, place_for
from ..rows import (
    SCHEDULE_COLUMNS,
    catalog_from_row,
    catalog_row,
    schedule_from_row,
    spec_text,
    stopping_at,
    worker_from_row,
)
from .db import SqliteDatabase

T = TypeVar("T")

# ? the workflow names, ? the queue names (JSON arrays) a running worker declares: the catalogs
# of stopped workers that declared one of them are superseded (a rolling restart, a renamed
# queue); those of other pools stay, for producers to enqueue to queues whose workers are down.
FORGET_CATALOGS = """
DELETE FROM worker_catalog WHERE worker NOT IN (SELECT id FROM workers)
AND (EXISTS (SELECT 1 FROM json_each(worker_catalog.workflows) w
             WHERE json_extract(w.value, '$.name') IN (SELECT value FROM json_each(?)))
  OR EXISTS (SELECT 1 FROM json_each(worker_catalog.queues) q
             WHERE json_extract(q.value, '$.name') IN (SELECT value FROM json_each(?))))
"""


class SqliteShared(SharedState):
    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db

    # ---- workers ---------------------------------------------------------------------------
    def heartbeat(self, worker: WorkerInfo) -> None:
        self.db.write(
            "INSERT OR REPLACE INTO workers (id, host, pid, started_at, heartbeat_at, process,"
            " stopping_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                worker.id,
                worker.host,
                worker.pid,
                worker.started_at.timestamp(),
                worker.heartbeat_at.timestamp(),
                worker.process,
                stopping_at(worker),
            ),
        )

    async def workers(self, *, own_writes: bool = True) -> list[WorkerInfo]:
        if own_writes:
            await self.db.flush()
        rows = await self.db.fetchall("SELECT * FROM workers ORDER BY started_at")
        return [worker_from_row(row) for row in rows]

    async def forget_worker(self, worker_id: str, *, listed: bool = False) -> list[tuple[str, str]]:
        await self.db.flush()
        held = await self.db.fetchall(
            "SELECT run_id, key FROM concurrency_slots WHERE worker = ?", (worker_id,)
        )
        self.db.write("DELETE FROM concurrency_slots WHERE worker = ?", (worker_id,))
        if not listed:
            self.db.write("DELETE FROM workers WHERE id = ?", (worker_id,))
        await self.db.flush()
        return [(run_id, key) for run_id, key in held]

    def publish_catalog(self, catalog: WorkerCatalog) -> None:
        self.db.write(
            "INSERT OR REPLACE INTO worker_catalog (worker, queues, workflows, reload_errors,"
            " updated_at) VALUES (?, ?, ?, ?, ?)",
            catalog_row(catalog),
        )
        # What stopped workers declared stays known (a producer can still enqueue to their
        # queues) until a worker that runs now declares one of their workflows or queues: the
        # catalogs of another pool of workers, down for now, stay.
        workflows, queues = catalog.names()
        self.db.write(FORGET_CATALOGS, (json.dumps(workflows), json.dumps(queues)))

    async def catalogs(self) -> list[WorkerCatalog]:
        await self.db.flush()
        rows = await self.db.fetchall(
            "SELECT worker, queues, workflows, reload_errors, updated_at FROM worker_catalog"
            " ORDER BY updated_at"
        )
        return [catalog_from_row(row) for row in rows]

    # ---- pauses ----------------------------------------------------------------------------
    async def paused_queues(self) -> set[str]:
        await self.db.flush()
        return {row[0] for row in await self.db.fetchall("SELECT queue FROM paused_queues")}

    async def set_paused(self, queue: str, paused: bool) -> None:
        if paused:
            self.db.write("INSERT OR IGNORE INTO paused_queues (queue) VALUES (?)", (queue,))
        else:
            self.db.write("DELETE FROM paused_queues WHERE queue = ?", (queue,))
        await self.db.flush()

    # ---- concurrency slots -----------------------------------------------------------------
    async def acquire_slot(
        self, workflow: str, key: str, limit: int, run_id: str, worker: str, lease_s: float
    ) -> tuple[bool, int]:
        now = time.time()

        def acquire(conn: sqlite3.Connection) -> tuple[bool, int]:
            # Slots of workers whose lease ran out, or that recovery found dead and forgot,
            # are free again: a crash never keeps a key blocked.
            conn.execute(
                "DELETE FROM concurrency_slots WHERE workflow = ? AND key = ? AND"
                " (lease_until < ? OR worker NOT IN (SELECT id FROM workers))",
                (workflow, key, now),
            )
            holders = {
                row[0]
                for row in conn.execute(
                    "SELECT run_id FROM concurrency_slots WHERE workflow = ? AND key = ?",
                    (workflow, key),
                )
            }
            verdict = place_for(holders, run_id, limit)
            if verdict is not None:
                return verdict, len(holders)
            conn.execute(
                "INSERT INTO concurrency_slots (workflow, key, run_id, worker, lease_until)"
                " VALUES (?, ?, ?, ?, ?)",
                (workflow, key, run_id, worker, now + lease_s),
            )
            return True, len(holders) + 1

        return await self.db.transaction(acquire)

    def release_slot(self, run_id: str) -> None:
        self.db.write("DELETE FROM concurrency_slots WHERE run_id = ?", (run_id,))

    def renew_slots(self, worker: str, lease_s: float) -> None:
        self.db.write(
            "UPDATE concurrency_slots SET lease_until = ? WHERE worker = ?",
            (time.time() + lease_s, worker),
        )

    async def slot_holders(self, workflow: str, key: str) -> list[str]:
        await self.db.flush()
        rows = await self.db.fetchall(
            "SELECT run_id FROM concurrency_slots WHERE workflow = ? AND key = ?"
            " AND lease_until >= ?",
            (workflow, key, time.time()),
        )
        return [row[0] for row in rows]

    # ---- debounce windows ------------------------------------------------------------------
    async def update_window(
        self,
        workflow: str,
        key: str,
        mode: str,
        decide: Callable[[Window | None, float], tuple[T, Window | None, bool]],
    ) -> T:
        def update(conn: sqlite3.Connection) -> T:
            row = conn.execute(
                "SELECT run_id, job_id, created_at, opened_at, until FROM debounce_windows"
                " WHERE workflow = ? AND key = ? AND mode = ?",
                (workflow, key, mode),
            ).fetchone()
            result, window, write = decide(Window(*row) if row else None, time.time())
            if write and window is None:
                conn.execute(
                    "DELETE FROM debounce_windows WHERE workflow = ? AND key = ? AND mode = ?",
                    (workflow, key, mode),
                )
            elif write and window is not None:
                conn.execute(
                    "INSERT OR REPLACE INTO debounce_windows (workflow, key, mode, run_id,"
                    " job_id, created_at, opened_at, until) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        workflow,
                        key,
                        mode,
                        window.run_id,
                        window.job_id,
                        window.created_at,
                        window.opened_at,
                        window.until,
                    ),
                )
            return result

        return await self.db.transaction(update)

    async def close_windows(self, before: float) -> None:
        # Closed leading windows are only history; one row per key would pile up.
        self.db.write(
            "DELETE FROM debounce_windows WHERE mode = 'leading' AND until < ?", (before,)
        )

    # ---- cluster chores --------------------------------------------------------------------
    async def try_lead(self, chore: str, worker: str, ttl_s: float) -> bool:
        now = time.time()

        def lead(conn: sqlite3.Connection) -> bool:
            return (
                conn.execute(
                    "INSERT INTO leader_leases (name, holder, until) VALUES (?, ?, ?)"
                    " ON CONFLICT(name) DO UPDATE SET holder = excluded.holder,"
                    " until = excluded.until"
                    " WHERE leader_leases.holder = excluded.holder OR leader_leases.until < ?",
                    (chore, worker, now + ttl_s, now),
                ).rowcount
                == 1
            )

        return await self.db.transaction(lead)

    async def resign(self, chore: str, worker: str) -> None:
        self.db.write("DELETE FROM leader_leases WHERE name = ? AND holder = ?", (chore, worker))

    # ---- schedules -------------------------------------------------------------------------
    async def declare_schedules(
        self, workflow: str, specs: list[tuple[ScheduleSpec, float]]
    ) -> None:
        def declare(conn: sqlite3.Connection) -> None:
            names = [spec.schedule for spec, _ in specs]
            conn.execute(
                "DELETE FROM schedules WHERE workflow = ?"
                f" AND schedule NOT IN ({', '.join('?' * len(names))})",
                (workflow, *names),
            )
            conn.executemany(
                "INSERT INTO schedules (workflow, schedule, spec, last_tick) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(workflow, schedule) DO UPDATE SET spec = excluded.spec",
                [(workflow, spec.schedule, spec_text(spec), first) for spec, first in specs],
            )

        await self.db.transaction(declare)

    async def schedules(self) -> list[ScheduleState]:
        await self.db.flush()
        rows = await self.db.fetchall(
            f"SELECT {SCHEDULE_COLUMNS} FROM schedules ORDER BY workflow, schedule"
        )
        return [schedule_from_row(row) for row in rows]

    async def claim_tick(
        self,
        workflow: str,
        schedule: str,
        tick: float,
        job_id: str | None = None,
        run_id: str | None = None,
    ) -> bool:
        now = time.time()

        def claim(conn: sqlite3.Connection) -> bool:
            # The unique key of a tick: last_tick moves forward past it once, in one statement.
            return (
                conn.execute(
                    "UPDATE schedules SET last_tick = ?,"
                    " last_job_id = CASE WHEN ? IS NULL THEN last_job_id ELSE ? END,"
                    " last_run_id = CASE WHEN ? IS NULL THEN last_run_id ELSE ? END,"
                    " last_fired_at = CASE WHEN ? IS NULL THEN last_fired_at ELSE ? END"
                    " WHERE workflow = ? AND schedule = ? AND paused = 0 AND last_tick < ?",
                    (tick, job_id, job_id, job_id, run_id, job_id, now, workflow, schedule, tick),
                ).rowcount
                == 1
            )

        return await self.db.transaction(claim)

    async def note_fired(
        self, workflow: str, schedule: str, job_id: str, run_id: str, at: float
    ) -> bool:
        def note(conn: sqlite3.Connection) -> bool:
            return (
                conn.execute(
                    "UPDATE schedules SET last_job_id = ?, last_run_id = ?, last_fired_at = ?"
                    " WHERE workflow = ? AND schedule = ?",
                    (job_id, run_id, at, workflow, schedule),
                ).rowcount
                == 1
            )

        return await self.db.transaction(note)

    async def set_schedule_paused(
        self, workflow: str, schedule: str, paused: bool, resume_from: float | None = None
    ) -> bool:
        start = None if paused else resume_from

        def pause(conn: sqlite3.Connection) -> bool:
            return (
                conn.execute(
                    "UPDATE schedules SET paused = ?,"
                    " last_tick = CASE WHEN ? IS NOT NULL AND ? > last_tick THEN ?"
                    " ELSE last_tick END WHERE workflow = ? AND schedule = ?",
                    (int(paused), start, start, start, workflow, schedule),
                ).rowcount
                == 1
            )

        return await self.db.transaction(pause)

    # ---- rate limits -----------------------------------------------------------------------
    async def acquire_start(
        self,
        scope: str,
        key: str,
        limit: int,
        period_s: float,
        run_id: str,
        now: float | None = None,
    ) -> RateDecision:
        def acquire(conn: sqlite3.Connection) -> RateDecision:
            at = time.time() if now is None else now  # the writer's, now: see `SharedState`
            conn.execute(
                "DELETE FROM rate_starts WHERE scope = ? AND key = ? AND until <= ?",
                (scope, key, at),
            )
            held = dict(
                conn.execute(
                    "SELECT run_id, until FROM rate_starts WHERE scope = ? AND key = ?",
                    (scope, key),
                ).fetchall()
            )
            decided = decide_start(held, run_id, limit, at)
            if decided is not None:
                return decided
            conn.execute(
                "INSERT INTO rate_starts (scope, key, run_id, started_at, until)"
                " VALUES (?, ?, ?, ?, ?)",
                (scope, key, run_id, at, at + period_s),
            )
            return RateDecision(True, len(held) + 1, decided_at=at)

        return await self.db.transaction(acquire)

    async def recent_starts(self, scope: str, key: str, since: float) -> list[tuple[str, float]]:
        await self.db.flush()
        rows = await self.db.fetchall(
            "SELECT run_id, started_at FROM rate_starts WHERE scope = ? AND key = ?"
            " AND started_at > ? ORDER BY started_at",
            (scope, key, since),
        )
        return [(row[0], row[1]) for row in rows]

    async def forget_starts(self, before: float) -> None:
        self.db.write("DELETE FROM rate_starts WHERE until < ?", (before,))
