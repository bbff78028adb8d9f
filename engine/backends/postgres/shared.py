"""What the processes on one PostgreSQL database share: workers, catalogs, pauses, concurrency
slots, debounce windows, schedules, rate-limit windows and leader leases.

Slots, windows and rate-limit windows are read-decide-write: each runs in the writer's
transaction behind an advisory lock on its key, so two processes never decide on the same ones
at once. A schedule's tick is claimed by one conditional UPDATE (`sql.CLAIM_TICK`). Leases of
slots and leaders are on the server's clock; rate-limit windows on the caller's `now`, as the
contract has it.
"""

from __future__ import annotations

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
    catalog_from_row,
    catalog_row,
    schedule_from_row,
    spec_text,
    stopping_at,
    worker_from_row,
)
from . import sql
from .batch import Conn, clean
from .db import PostgresDatabase

T = TypeVar("T")


class PostgresShared(SharedState):
    def __init__(self, db: PostgresDatabase) -> None:
        self.db = db

    # ---- workers ---------------------------------------------------------------------------
    def heartbeat(self, worker: WorkerInfo) -> None:
        self.db.write(
            sql.HEARTBEAT,
            clean(
                (
                    worker.id,
                    worker.host,
                    worker.pid,
                    worker.started_at.timestamp(),
                    worker.process,
                    stopping_at(worker),
                )
            ),
        )

    async def workers(self, *, own_writes: bool = True) -> list[WorkerInfo]:
        if own_writes:
            await self.db.flush()
        rows = await self.db.fetch(sql.WORKERS)
        # Each heartbeat as long ago as it is by the server's clock, read here on it.
        here = self.db.clock.time()
        return [worker_from_row(row, here - row["heartbeat_age"]) for row in rows]

    async def forget_worker(self, worker_id: str, *, listed: bool = False) -> list[tuple[str, str]]:
        if not listed:
            self.db.write("DELETE FROM workers WHERE id = $1", (worker_id,))
        await self.db.flush()
        rows = await self.db.fetch(
            "DELETE FROM concurrency_slots WHERE worker = $1 RETURNING run_id, key", worker_id
        )
        return [(row[0], row[1]) for row in rows]

    def publish_catalog(self, catalog: WorkerCatalog) -> None:
        self.db.write(sql.PUBLISH_CATALOG, clean(catalog_row(catalog)))
        # What stopped workers declared stays known (a producer can still enqueue to their
        # queues) until a worker that runs now declares one of their workflows or queues.
        self.db.write(sql.FORGET_CATALOGS, catalog.names())

    async def catalogs(self) -> list[WorkerCatalog]:
        await self.db.flush()
        rows = await self.db.fetch(
            "SELECT worker, queues::text, workflows::text, reload_errors::text, updated_at"
            " FROM worker_catalog ORDER BY updated_at"
        )
        return [catalog_from_row(row) for row in rows]

    # ---- pauses ----------------------------------------------------------------------------
    async def paused_queues(self) -> set[str]:
        await self.db.flush()
        return {row[0] for row in await self.db.fetch("SELECT queue FROM paused_queues")}

    async def set_paused(self, queue: str, paused: bool) -> None:
        if paused:
            self.db.write(
                "INSERT INTO paused_queues (queue) VALUES ($1) ON CONFLICT DO NOTHING", (queue,)
            )
        else:
            self.db.write("DELETE FROM paused_queues WHERE queue = $1", (queue,))
        await self.db.flush()

    # ---- concurrency slots -----------------------------------------------------------------
    async def acquire_slot(
        self, workflow: str, key: str, limit: int, run_id: str, worker: str, lease_s: float
    ) -> tuple[bool, int]:
        async def acquire(conn: Conn) -> tuple[bool, int]:
            await conn.execute(sql.SLOTS_LOCK, workflow, key)
            # Slots of workers whose lease ran out, or that recovery found dead and forgot,
            # are free again: a crash never keeps a key blocked.
            await conn.execute(
                "DELETE FROM concurrency_slots WHERE workflow = $1 AND key = $2 AND"
                f" (lease_until < {sql.NOW} OR worker NOT IN (SELECT id FROM workers))",
                workflow,
                key,
            )
            holders = {
                row[0]
                for row in await conn.fetch(
                    "SELECT run_id FROM concurrency_slots WHERE workflow = $1 AND key = $2",
                    workflow,
                    key,
                )
            }
            verdict = place_for(holders, run_id, limit)
            if verdict is not None:
                return verdict, len(holders)
            await conn.execute(
                "INSERT INTO concurrency_slots (workflow, key, run_id, worker, lease_until)"
                f" VALUES ($1, $2, $3, $4, {sql.NOW} + $5)",
                workflow,
                key,
                run_id,
                worker,
                lease_s,
            )
            return True, len(holders) + 1

        return await self.db.transaction(acquire)

    def release_slot(self, run_id: str) -> None:
        self.db.write("DELETE FROM concurrency_slots WHERE run_id = $1", (run_id,))

    def renew_slots(self, worker: str, lease_s: float) -> None:
        self.db.write(
            f"UPDATE concurrency_slots SET lease_until = {sql.NOW} + $2 WHERE worker = $1",
            (worker, lease_s),
        )

    async def slot_holders(self, workflow: str, key: str) -> list[str]:
        await self.db.flush()
        rows = await self.db.fetch(
            "SELECT run_id FROM concurrency_slots WHERE workflow = $1 AND key = $2"
            f" AND lease_until >= {sql.NOW}",
            workflow,
            key,
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
        async def update(conn: Conn) -> T:
            await conn.execute(sql.WINDOW_LOCK, workflow, key, mode)
            # With the server's clock: see `SharedState.update_window`.
            row = await conn.fetchrow(sql.READ_WINDOW, workflow, key, mode)
            assert row is not None  # the clock's row, with or without a window
            found = Window(*row[1:]) if row["run_id"] is not None else None
            result, window, write = decide(found, row["now"])
            if write and window is None:
                await conn.execute(
                    "DELETE FROM debounce_windows WHERE workflow = $1 AND key = $2 AND mode = $3",
                    workflow,
                    key,
                    mode,
                )
            elif write and window is not None:
                await conn.execute(
                    "INSERT INTO debounce_windows (workflow, key, mode, run_id, job_id,"
                    " created_at, opened_at, until) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
                    " ON CONFLICT (workflow, key, mode) DO UPDATE SET run_id = excluded.run_id,"
                    " job_id = excluded.job_id, created_at = excluded.created_at,"
                    " opened_at = excluded.opened_at, until = excluded.until",
                    workflow,
                    key,
                    mode,
                    window.run_id,
                    window.job_id,
                    window.created_at,
                    window.opened_at,
                    window.until,
                )
            return result

        return await self.db.transaction(update)

    async def close_windows(self, before: float) -> None:
        # Closed leading windows are only history; one row per key would pile up.
        # Not one the server's clock still has open: the caller's clock may run ahead.
        self.db.write(sql.CLOSE_LEADING_WINDOWS, (before,))

    # ---- cluster chores --------------------------------------------------------------------
    async def try_lead(self, chore: str, worker: str, ttl_s: float) -> bool:
        return await self.db.fetchval(sql.ACQUIRE_LEADER, chore, worker, ttl_s) is not None

    async def resign(self, chore: str, worker: str) -> None:
        await self.db.pooled(lambda c: c.execute(sql.RELEASE_LEADER, chore, worker))

    # ---- schedules -------------------------------------------------------------------------
    async def declare_schedules(
        self, workflow: str, specs: list[tuple[ScheduleSpec, float]]
    ) -> None:
        [workflow] = clean((workflow,))
        # In name order: two workers declaring the same workflow lock its rows in one order.
        rows = sorted(
            clean((workflow, spec.schedule, spec_text(spec), first)) for spec, first in specs
        )

        async def declare(conn: Conn) -> None:
            await conn.execute(
                "DELETE FROM schedules WHERE workflow = $1 AND NOT schedule = ANY($2::text[])",
                workflow,
                [row[1] for row in rows],
            )
            if rows:
                await conn.executemany(sql.DECLARE_SCHEDULE, rows)

        await self.db.transaction(declare)

    async def schedules(self) -> list[ScheduleState]:
        await self.db.flush()
        return [schedule_from_row(row) for row in await self.db.fetch(sql.SELECT_SCHEDULES)]

    async def claim_tick(
        self,
        workflow: str,
        schedule: str,
        tick: float,
        job_id: str | None = None,
        run_id: str | None = None,
    ) -> bool:
        params = (*clean((workflow, schedule)), tick, job_id, run_id, self.db.clock.time())
        return (
            await self.db.transaction(lambda conn: conn.fetchval(sql.CLAIM_TICK, *params))
            is not None
        )

    async def note_fired(
        self, workflow: str, schedule: str, job_id: str, run_id: str, at: float
    ) -> bool:
        params = (*clean((workflow, schedule)), job_id, run_id, at)
        return (
            await self.db.transaction(
                lambda conn: conn.fetchval(
                    "UPDATE schedules SET last_job_id = $3, last_run_id = $4, last_fired_at = $5"
                    " WHERE workflow = $1 AND schedule = $2 RETURNING 1",
                    *params,
                )
            )
            is not None
        )

    async def set_schedule_paused(
        self, workflow: str, schedule: str, paused: bool, resume_from: float | None = None
    ) -> bool:
        params = (*clean((workflow, schedule)), int(paused), None if paused else resume_from)
        return (
            await self.db.transaction(lambda conn: conn.fetchval(sql.PAUSE_SCHEDULE, *params))
            is not None
        )

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
        scope, key = clean((scope, key))

        async def acquire(conn: Conn) -> RateDecision:
            await conn.execute(sql.RATE_LOCK, scope, key)
            # Held now: see `SharedState`. The server's clock, the one every machine sharing
            # the window reads: counted by their own, a machine whose clock ran a minute ahead
            # dropped the starts of the last minute and let as many more in.
            at = float(await conn.fetchval(sql.RATE_OPEN, scope, key, now))
            rows = await conn.fetch(
                "SELECT run_id, until FROM rate_starts WHERE scope = $1 AND key = $2", scope, key
            )
            held = {row[0]: row[1] for row in rows}
            decided = decide_start(held, run_id, limit, at)
            if decided is not None:
                return decided
            await conn.execute(
                "INSERT INTO rate_starts (scope, key, run_id, started_at, until)"
                " VALUES ($1, $2, $3, $4, $5)",
                scope,
                key,
                run_id,
                at,
                at + period_s,
            )
            return RateDecision(True, len(held) + 1, decided_at=at)

        return await self.db.transaction(acquire)

    async def recent_starts(self, scope: str, key: str, since: float) -> list[tuple[str, float]]:
        await self.db.flush()
        rows = await self.db.fetch(
            "SELECT run_id, started_at FROM rate_starts WHERE scope = $1 AND key = $2"
            " AND started_at > $3 ORDER BY started_at",
            *clean((scope, key)),
            since,
        )
        return [(row[0], row[1]) for row in rows]

    async def forget_starts(self, before: float) -> None:
        # Not a start the server's clock still counts: the caller's clock may run ahead.
        self.db.write(sql.FORGET_STARTS, (before,))
