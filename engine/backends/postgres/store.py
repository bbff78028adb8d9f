"""Runs on PostgreSQL: run, step and attempt rows, log lines, the idempotency cache, the feed.

Writes only queue the run in the writer (`PostgresDatabase.save`): a run that starts and
finishes within one batch costs one row per table, not one per change.

The change feed reads by transaction: a run row and a log line carry the id of the transaction
that last wrote them, and a page holds what was written by transactions between the reader's
last horizon and the current one, the oldest transaction still running on the server (see
`schema.py`). `FeedCursor.rev` and `.log_id` are both that horizon. What a transaction still
running wrote comes with a later page, once it has ended, so nothing is skipped and nothing is
read twice; the price is that a transaction left open for long on the same server (any that
wrote something, in any database) holds the feed back until it ends.

Event mailboxes are changed in the writer's transaction, under the locks `sql.RUN_LOCK` and
`sql.EVENT_LOCK` describe: a send and a wait never miss each other, in any process.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import anyio
import asyncpg

from ...filters import RunFilter
from ...models import LogLine, Run
from ..base import (
    CacheHit,
    Delivery,
    EventMessage,
    EventWaiter,
    FeedCursor,
    FeedLog,
    FeedPage,
    Fence,
    RunStore,
    payload_key,
)
from ..rows import (
    NOT_A_DEAD_LETTER,
    TERMINAL,
    assemble,
    dump,
    load,
    place_lines,
    run_from_row,
    where_clause,
)
from . import sql
from .batch import Conn, clean, fence_of
from .db import PostgresDatabase

PENDING = ["queued", "delayed", "waiting", "throttled"]
OWN_WRITES_WAIT_S = 2.0  # a feed read waits this long at most for this process's own writes

UPSERT_CACHE = (
    "INSERT INTO idempotency (workflow, step, key, output, run_id, expires_at)"
    " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (workflow, step, key) DO UPDATE SET"
    " output = excluded.output, run_id = excluded.run_id, expires_at = excluded.expires_at"
)


def log_params(run_id: str, line: LogLine, fence: Fence | None) -> tuple[Any, ...]:
    return clean(
        (run_id, line.step, line.ts.timestamp(), line.level, line.message, *fence_of(fence))
    )


def where_sql(filter_: RunFilter | None, first: int = 1) -> tuple[str, list[Any]]:
    """The shared RunFilter clause with PostgreSQL's placeholders, text matched without case
    (as SQLite's LIKE does), a JSON column (the input) matched as its text."""
    counter = iter(range(first, first + 10_000))
    return where_clause(
        filter_, lambda: f"${next(counter)}", like="ILIKE", as_text=lambda column: f"{column}::text"
    )


def _message(row: Any) -> EventMessage:
    return EventMessage(row[0], row[1], row[2], load(row[3]), row[4], row[5], row[6])


def _stored_key(key: str | None) -> str | None:
    """A key as the database keeps it: text cannot hold NUL (see `clean`), so a key computed
    from a payload is compared in the form a waiter's key was stored in."""
    return None if key is None else clean((key,))[0]


async def post_event(
    conn: Conn, event: str, payload: Any, run_id: str | None, now: float
) -> list[Delivery] | None:
    """Inside the writer's transaction, `now` on the database's clock: see
    RunStore.post_event."""
    encoded = dump(payload)
    if run_id is not None:
        status = await conn.fetchval(sql.RUN_LOCK, run_id)
        if status is None or status in TERMINAL:
            return None
        [row] = await conn.fetch(sql.POST_EVENTS, [run_id], event, encoded, now)
        # Delivered unless an earlier event is there for the wait already (see SQLite's).
        waiting = await conn.fetchval(
            "SELECT 1 FROM event_waiters WHERE run_id = $1 AND event = $2 AND NOT EXISTS"
            " (SELECT 1 FROM events WHERE run_id = $1 AND event = $2 AND taken_by IS NULL"
            " AND id < $3)",
            run_id,
            event,
            int(row[0]),
        )
        return [Delivery(run_id, int(row[0]), waiting is not None)]
    await conn.execute(sql.EVENT_LOCK, event)
    to = [
        waiter
        for waiter, key, path in await conn.fetch(sql.KEY_WAITERS, event, list(TERMINAL))
        if _stored_key(payload_key(payload, tuple(json.loads(path)))) == key
    ]
    rows = await conn.fetch(sql.POST_EVENTS, to or [None], event, encoded, now)
    return [Delivery(row[1], int(row[0]), True) for row in rows if row[1] is not None]


async def take_event(
    conn: Conn,
    run_id: str,
    step: str,
    event: str,
    key: str | None,
    path: tuple[str, ...],
    register: bool,
    now: float,
) -> EventMessage | None:
    """Inside the writer's transaction, `now` on the database's clock: see
    RunStore.take_event."""
    if path:
        await conn.execute(sql.EVENT_LOCK, event)
    await conn.execute(sql.RUN_LOCK, run_id)
    row: Any = await conn.fetchrow(
        f"SELECT {sql.EVENT_COLUMNS} FROM events WHERE run_id = $1 AND taken_by = $2"
        " ORDER BY id LIMIT 1",
        run_id,
        step,
    )
    if row is None:
        row = await conn.fetchrow(
            f"SELECT {sql.EVENT_COLUMNS} FROM events WHERE run_id = $1 AND event = $2"
            " AND taken_by IS NULL ORDER BY id LIMIT 1",
            run_id,
            event,
        )
        if row is None and path and key is not None:
            for candidate in await conn.fetch(
                f"SELECT {sql.EVENT_COLUMNS} FROM events WHERE run_id IS NULL AND event = $1"
                " ORDER BY id",
                event,
            ):
                if _stored_key(payload_key(load(candidate[3]), path)) == key:
                    row = candidate
                    break
        if row is not None:
            await conn.execute(
                "UPDATE events SET run_id = $1, taken_by = $2, taken_at = $3 WHERE id = $4",
                run_id,
                step,
                now,
                row[0],
            )
            row = (row[0], run_id, row[2], row[3], row[4], step, now)
    if row is not None or not register:
        await conn.execute("DELETE FROM event_waiters WHERE run_id = $1", run_id)
        return _message(row) if row is not None else None
    await conn.execute(
        sql.REGISTER_WAITER, run_id, step, event, key, json.dumps(list(path)) if path else None
    )
    return None


async def with_steps(conn: Conn, runs: list[Run]) -> list[Run]:
    if runs:
        ids = [run.id for run in runs]
        steps = await conn.fetch(
            "SELECT * FROM steps WHERE run_id = ANY($1::text[]) ORDER BY run_id, idx", ids
        )
        attempts = await conn.fetch(
            "SELECT * FROM attempts WHERE run_id = ANY($1::text[])"
            " ORDER BY run_id, step_idx, number",
            ids,
        )
        assemble(runs, steps, attempts)  # type: ignore[arg-type]
    return runs


def whole_run(run_row: asyncpg.Record, row: asyncpg.Record) -> Run:
    """The run of `run_row` with its steps, attempts and log lines from `row`'s arrays
    (`sql._children`)."""
    run = run_from_row(run_row)  # type: ignore[arg-type]
    assemble([run], row["step_rows"], row["attempt_rows"])
    place_lines(run, row["log_rows"])
    return run


class PostgresRunStore(RunStore):
    def __init__(self, db: PostgresDatabase) -> None:
        self.db = db
        self.followed = False  # someone reads the feed: listen to the runs channel
        self.horizon = 0  # the last horizon a feed read reached

    # ---- writes ----------------------------------------------------------------------------
    def save_run(self, run: Run, fence: Fence | None = None) -> None:
        self.db.save(run, fence)

    def add_log(self, run_id: str, line: LogLine, fence: Fence | None = None) -> None:
        self.db.write(sql.INSERT_LOG, log_params(run_id, line, fence), feed=True)

    def cache_put(
        self, workflow: str, step: str, key: str, output: Any, run_id: str, ttl_ms: int
    ) -> None:
        self.db.write(
            UPSERT_CACHE,
            clean(
                (workflow, step, key, dump(output), run_id, self.db.clock.time() + ttl_ms / 1000)
            ),
        )

    async def flush(self) -> None:
        await self.db.flush()

    # ---- reads -----------------------------------------------------------------------------
    async def cache_get(self, workflow: str, step: str, key: str) -> CacheHit | None:
        await self.db.flush()
        row = await self.db.fetchrow(
            "SELECT output::text, run_id FROM idempotency WHERE workflow = $1 AND step = $2"
            " AND key = $3 AND expires_at > $4",
            workflow,
            step,
            key,
            self.db.clock.time(),
        )
        return CacheHit(load(row[0]), row[1]) if row else None

    async def get_run(self, run_id: str) -> Run | None:
        await self.db.flush()
        row = await self.db.fetchrow(sql.SELECT_WHOLE_RUN, run_id)
        return whole_run(row, row) if row is not None else None

    async def list_runs(
        self, where: RunFilter | None = None, limit: int | None = 100, offset: int = 0
    ) -> list[Run]:
        # LIMIT NULL is no limit in PostgreSQL: limit=None passes as is.
        await self.db.flush()
        clause, params = where_sql(where)
        n = len(params)
        rows = await self.db.fetch(
            f"{sql.SELECT_RUN}{clause} ORDER BY created_at DESC LIMIT ${n + 1} OFFSET ${n + 2}",
            *params,
            limit,
            offset,
        )
        return [run_from_row(row) for row in rows]  # type: ignore[arg-type]

    async def count_runs(self, where: RunFilter | None = None) -> int:
        await self.db.flush()
        clause, params = where_sql(where)
        return int(await self.db.fetchval(f"SELECT count(*) FROM runs{clause}", *params))

    async def runs_by_id(self, run_ids: list[str]) -> list[Run]:
        await self.db.flush()
        rows = await self.db.fetch(f"{sql.SELECT_RUN} WHERE id = ANY($1::text[])", run_ids)
        return [run_from_row(row) for row in rows]  # type: ignore[arg-type]

    async def pending_runs(self, queues: list[str]) -> list[Run]:
        if not queues:
            return []
        await self.db.flush()
        rows = await self.db.fetch(
            f"{sql.SELECT_RUN} WHERE status = ANY($1::text[]) AND queue = ANY($2::text[])",
            PENDING,
            queues,
        )
        return [run_from_row(row) for row in rows]  # type: ignore[arg-type]

    async def adopt_runs(self, runs: Sequence[tuple[str, str | None]], worker: str) -> set[str]:
        if not runs:
            return set()
        await self.db.flush()  # this process's writes to the runs first

        async def adopt(conn: Conn) -> set[str]:
            rows = await conn.fetch(
                "UPDATE runs SET worker = $1, xid = DEFAULT"
                " FROM unnest($2::text[], $3::text[]) AS read (id, worker)"
                " WHERE runs.id = read.id AND runs.worker IS NOT DISTINCT FROM read.worker"
                " AND runs.status = ANY($4::text[]) RETURNING runs.id",
                worker,
                [run_id for run_id, _ in runs],
                [was for _, was in runs],
                PENDING,
            )
            return {row[0] for row in rows}

        return await self.db.transaction(adopt)

    # ---- housekeeping ----------------------------------------------------------------------
    async def purge(self, finished_before: datetime, limit: int = 500) -> int:
        cutoff = finished_before.timestamp()

        async def purge(conn: Conn) -> int:
            async with conn.transaction():
                ids = [
                    row[0]
                    for row in await conn.fetch(
                        "SELECT id FROM runs WHERE finished_at < $1 AND status = ANY($2::text[])"
                        f" AND {NOT_A_DEAD_LETTER} LIMIT $3 FOR UPDATE SKIP LOCKED",
                        cutoff,
                        list(TERMINAL),
                        limit,
                    )
                ]
                for table in ("steps", "attempts", "logs", "events", "event_waiters"):
                    await conn.execute(f"DELETE FROM {table} WHERE run_id = ANY($1::text[])", ids)
                await conn.execute("DELETE FROM runs WHERE id = ANY($1::text[])", ids)
                await conn.execute(
                    "DELETE FROM idempotency WHERE expires_at <= $1", self.db.clock.time()
                )
                return len(ids)

        await self.db.flush()
        return await self.db.pooled(purge)

    # ---- event mailboxes -------------------------------------------------------------------
    async def post_event(
        self, event: str, payload: Any, *, run_id: str | None
    ) -> list[Delivery] | None:
        event, run_id = clean((event, run_id))
        return await self.db.transaction(
            lambda conn: post_event(conn, event, payload, run_id, self.db.clock.time())
        )

    async def take_event(
        self,
        run_id: str,
        step: str,
        event: str,
        *,
        key: str | None = None,
        path: tuple[str, ...] = (),
        register: bool = True,
    ) -> EventMessage | None:
        run_id, step, event, key = clean((run_id, step, event, key))
        path = clean(path)
        return await self.db.transaction(
            lambda conn: take_event(
                conn, run_id, step, event, key, path, register, self.db.clock.time()
            )
        )

    async def events_of(self, run_id: str) -> list[EventMessage]:
        await self.db.flush()
        rows = await self.db.fetch(
            f"SELECT {sql.EVENT_COLUMNS} FROM events WHERE run_id = $1 ORDER BY id", run_id
        )
        return [_message(row) for row in rows]

    async def event_waiters(self, run_ids: list[str] | None = None) -> list[EventWaiter]:
        await self.db.flush()
        sql_text = "SELECT run_id, step, event, key, path::text FROM event_waiters"
        if run_ids is None:
            rows = await self.db.fetch(f"{sql_text} ORDER BY run_id")
        else:
            rows = await self.db.fetch(
                f"{sql_text} WHERE run_id = ANY($1::text[]) ORDER BY run_id", run_ids
            )
        return [
            EventWaiter(r[0], r[1], r[2], r[3], tuple(json.loads(r[4])) if r[4] else ())
            for r in rows
        ]

    async def purge_events(self, sent_before: float) -> int:
        async def purge(conn: Conn) -> int:
            status = await conn.execute(
                "DELETE FROM events AS e WHERE (e.run_id IS NULL AND e.sent_at < $1)"
                " OR (e.run_id IS NOT NULL"
                " AND NOT EXISTS (SELECT 1 FROM runs AS r WHERE r.id = e.run_id))",
                sent_before,
            )
            await conn.execute(
                "DELETE FROM event_waiters AS w WHERE NOT EXISTS (SELECT 1 FROM runs AS r"
                " WHERE r.id = w.run_id AND r.status <> ALL($1::text[]))",
                list(TERMINAL),
            )
            return int(status.rsplit(" ", 1)[-1])

        return await self.db.transaction(purge)

    # ---- the change feed -------------------------------------------------------------------
    async def _horizon(self, conn: Conn) -> int:
        """The current horizon; if this process committed something the horizon has not passed
        yet (another transaction older than it still runs), wait a little for it: a reader
        sees its own process's writes."""
        horizon = await _horizon_now(conn)
        deadline = time.monotonic() + OWN_WRITES_WAIT_S
        while self.db.last_xid >= horizon and time.monotonic() < deadline:
            await anyio.sleep(0.005)
            horizon = await _horizon_now(conn)
        return horizon

    async def feed(self, cursor: FeedCursor, limit: int = 1000) -> FeedPage:
        self.followed = True

        async def read(conn: Conn) -> tuple[FeedPage, int]:
            horizon = await self._horizon(conn)
            rows, runs_lagged, rev = await _feed_part(
                conn, sql.FEED_RUNS, sql.FEED_RUNS_COUNT, cursor.rev, horizon, limit
            )
            runs = await with_steps(conn, [run_from_row(row) for row in rows])
            lines, logs_lagged, log_id = await _feed_part(
                conn, sql.FEED_LOGS, sql.FEED_LOGS_COUNT, cursor.log_id, horizon, limit
            )
            logs = [
                FeedLog(r["id"], r["run_id"], r["step_idx"], r["level"], r["message"])
                for r in lines
            ]
            page = FeedPage(runs, logs, FeedCursor(rev, log_id), runs_lagged + logs_lagged)
            return page, horizon

        page, horizon = await self.db.pooled(read)
        self.horizon = max(self.horizon, horizon)
        return page

    async def feed_cursor(self) -> FeedCursor:
        self.followed = True
        await self.db.flush()

        async def read(conn: Conn) -> tuple[FeedCursor, int]:
            horizon = await self._horizon(conn)
            # After the horizon's reads: a transaction below it that ended meanwhile shows here.
            tops = await conn.fetchrow(sql.FEED_TOPS, horizon)
            assert tops is not None  # one row, always
            rev, log_id = (0 if top is None else int(top) + 1 for top in tops)
            return FeedCursor(rev, log_id), horizon

        cursor, horizon = await self.db.pooled(read)
        self.horizon = max(self.horizon, horizon)
        return cursor


async def _feed_part(
    conn: Conn, rows_sql: str, count_sql: str, start: int, horizon: int, limit: int
) -> tuple[list[Any], int, int]:
    """One part of a feed page (runs, or log lines): its rows from `start` below `horizon`,
    in xid order; how many it skipped (more than `limit`: none given); and the part's next
    cursor: past the newest row read, or the horizon when it skipped ahead (FEED_TOPS: why
    not always there)."""
    rows = await conn.fetch(rows_sql, start, horizon, limit + 1)
    if len(rows) > limit:
        return [], int(await conn.fetchval(count_sql, start, horizon)), horizon
    return rows, 0, max(start, int(rows[-1]["xid"]) + 1) if rows else start


async def _horizon_now(conn: Conn) -> int:
    """Below this transaction id every transaction of this database has ended (sql.py, "the
    change feed": another database's transactions do not count)."""
    snapshot = await conn.fetchrow(sql.FEED_SNAPSHOT)
    assert snapshot is not None  # one row, always
    here = {int(row[0]) for row in await conn.fetch(sql.RUNNING_HERE)}
    # xids in pg_stat_activity are 32 bits; the snapshot's are 64 (epoch and xid).
    running = [xid for xid in snapshot["running"] if xid % 2**32 in here]
    return min(running, default=int(snapshot["xmax"]))
