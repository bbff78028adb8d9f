"""Runs on SQLite: run, step and attempt rows, log lines, the idempotency cache, the feed.

Writes only queue the run in the writer (`SqliteDatabase.save`): a run that starts and finishes
within one batch costs one row per table, not one per change.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from datetime import datetime
from functools import partial
from typing import Any

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
    RUN_COLUMNS,
    TERMINAL,
    assemble,
    dump,
    load,
    place_lines,
    run_from_row,
    where_clause,
)
from .db import INLINE_WEIGHT, INSERT_LOG, SqliteDatabase

SELECT_RUN = f"SELECT {', '.join(RUN_COLUMNS)} FROM runs"
PENDING = ("queued", "delayed", "waiting", "throttled")


def _marks(values: list[Any] | tuple[Any, ...]) -> str:
    return ", ".join("?" * len(values))


def log_row(run_id: str, line: LogLine, fence: Fence | None) -> tuple[Any, ...]:
    head = (fence.job_id, fence.epoch) if fence is not None else (None, None)
    return (*head, run_id, line.step, line.ts.timestamp(), line.level, line.message)


EVENT_COLUMNS = "id, run_id, event, payload, sent_at, taken_by, taken_at"


def _message(row: Any) -> EventMessage:
    return EventMessage(row[0], row[1], row[2], load(row[3]), row[4], row[5], row[6])


def _ended(conn: sqlite3.Connection, run_id: str) -> bool:
    """The run does not exist or has ended, as this transaction sees it."""
    row = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
    return row is None or row[0] in TERMINAL


def post_event(
    conn: sqlite3.Connection, event: str, payload: Any, run_id: str | None
) -> list[Delivery] | None:
    """Inside the writer's transaction (shared with PostgreSQL's port of it): see
    RunStore.post_event."""
    encoded = dump(payload)
    now = time.time()
    insert = "INSERT INTO events (run_id, event, payload, sent_at) VALUES (?, ?, ?, ?)"
    if run_id is not None:
        if _ended(conn, run_id):
            return None
        message_id = conn.execute(insert, (run_id, event, encoded, now)).lastrowid
        # Delivered: a wait takes it when it resumes, unless an earlier one is there for it
        # already (that one it takes; this is kept).
        waiting = conn.execute(
            "SELECT 1 FROM event_waiters WHERE run_id = ?1 AND event = ?2 AND NOT EXISTS"
            " (SELECT 1 FROM events WHERE run_id = ?1 AND event = ?2 AND taken_by IS NULL"
            " AND id < ?3)",
            (run_id, event, message_id),
        ).fetchone()
        return [Delivery(run_id, int(message_id or 0), waiting is not None)]
    deliveries = []
    for waiter, key, path in conn.execute(
        "SELECT run_id, key, path FROM event_waiters WHERE event = ? AND path IS NOT NULL"
        " AND key IS NOT NULL ORDER BY run_id",
        (event,),
    ).fetchall():
        if payload_key(payload, tuple(json.loads(path))) != key or _ended(conn, waiter):
            continue
        message_id = conn.execute(insert, (waiter, event, encoded, now)).lastrowid
        deliveries.append(Delivery(waiter, int(message_id or 0), True))
    if not deliveries:
        conn.execute(insert, (None, event, encoded, now))
    return deliveries


def take_event(
    conn: sqlite3.Connection,
    run_id: str,
    step: str,
    event: str,
    key: str | None,
    path: tuple[str, ...],
    register: bool,
) -> EventMessage | None:
    """Inside the writer's transaction: see RunStore.take_event."""
    row = conn.execute(
        f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id = ? AND taken_by = ?", (run_id, step)
    ).fetchone()
    if row is None:
        row = conn.execute(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id = ? AND event = ?"
            " AND taken_by IS NULL ORDER BY id LIMIT 1",
            (run_id, event),
        ).fetchone()
        if row is None and path and key is not None:
            for candidate in conn.execute(
                f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id IS NULL AND event = ?"
                " ORDER BY id",
                (event,),
            ).fetchall():
                if payload_key(load(candidate[3]), path) == key:
                    row = candidate
                    break
        if row is not None:
            now = time.time()
            conn.execute(
                "UPDATE events SET run_id = ?, taken_by = ?, taken_at = ? WHERE id = ?",
                (run_id, step, now, row[0]),
            )
            row = (row[0], run_id, row[2], row[3], row[4], step, now)
    if row is not None or not register:
        conn.execute("DELETE FROM event_waiters WHERE run_id = ?", (run_id,))
        return _message(row) if row is not None else None
    conn.execute(
        "INSERT OR REPLACE INTO event_waiters (run_id, step, event, key, path)"
        " VALUES (?, ?, ?, ?, ?)",
        (run_id, step, event, key, json.dumps(list(path)) if path else None),
    )
    return None


def _cache_key(workflow: str, step: str, key: str) -> str:
    return f"cache\x00{workflow}\x00{step}\x00{key}"


def _read_run(conn: sqlite3.Connection, run_id: str) -> Run | None:
    """A run with its steps, attempts and logs, in one read transaction (a point read)."""
    row = conn.execute(f"{SELECT_RUN} WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        return None
    run = run_from_row(row)
    steps = conn.execute("SELECT * FROM steps WHERE run_id = ? ORDER BY idx", (run_id,)).fetchall()
    attempts = conn.execute(
        "SELECT * FROM attempts WHERE run_id = ? ORDER BY step_idx, number", (run_id,)
    ).fetchall()
    assemble([run], steps, attempts)
    place_lines(
        run,
        conn.execute(
            "SELECT step_idx, ts, level, message FROM logs WHERE run_id = ? ORDER BY id", (run_id,)
        ),
    )
    return run


class SqliteRunStore(RunStore):
    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db

    # ---- writes ----------------------------------------------------------------------------
    def save_run(self, run: Run, fence: Fence | None = None) -> None:
        self.db.save(run, fence)

    def add_log(self, run_id: str, line: LogLine, fence: Fence | None = None) -> None:
        self.db.write(INSERT_LOG, log_row(run_id, line, fence), run_id)

    def cache_put(
        self, workflow: str, step: str, key: str, output: Any, run_id: str, ttl_ms: int
    ) -> None:
        self.db.write(
            "INSERT OR REPLACE INTO idempotency (workflow, step, key, output, run_id, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (workflow, step, key, dump(output), run_id, time.time() + ttl_ms / 1000),
            _cache_key(workflow, step, key),
        )

    async def flush(self) -> None:
        await self.db.flush()

    # ---- reads -----------------------------------------------------------------------------
    async def cache_get(self, workflow: str, step: str, key: str) -> CacheHit | None:
        await self.db.flush_for(_cache_key(workflow, step, key))
        row = self.db.read_one(
            "SELECT output, run_id FROM idempotency WHERE workflow = ? AND step = ? AND key = ?"
            " AND expires_at > ?",
            (workflow, step, key, time.time()),
        )
        return CacheHit(load(row["output"]), row["run_id"]) if row else None

    async def _with_steps(self, runs: list[Run]) -> list[Run]:
        if not runs:
            return runs
        for start in range(0, len(runs), 500):
            chunk = [run.id for run in runs[start : start + 500]]
            steps = await self.db.fetchall(
                f"SELECT * FROM steps WHERE run_id IN ({_marks(chunk)}) ORDER BY run_id, idx",
                tuple(chunk),
            )
            attempts = await self.db.fetchall(
                f"SELECT * FROM attempts WHERE run_id IN ({_marks(chunk)})"
                " ORDER BY run_id, step_idx, number",
                tuple(chunk),
            )
            assemble(runs[start : start + 500], steps, attempts)  # type: ignore[arg-type]
        return runs

    async def get_run(self, run_id: str) -> Run | None:
        await self.db.flush_for(run_id)
        return self.db.read(partial(_read_run, run_id=run_id))

    async def list_runs(
        self, where: RunFilter | None = None, limit: int | None = 100, offset: int = 0
    ) -> list[Run]:
        await self.db.flush()
        clause, params = where_clause(where, lambda: "?")
        rows = await self.db.fetchall(
            f"{SELECT_RUN}{clause} ORDER BY created_at DESC LIMIT ? OFFSET ?",
            (*params, -1 if limit is None else limit, offset),  # SQLite: LIMIT -1 is none
        )
        return [run_from_row(row) for row in rows]  # type: ignore[arg-type]

    async def count_runs(self, where: RunFilter | None = None) -> int:
        await self.db.flush()
        clause, params = where_clause(where, lambda: "?")
        row = await self.db.fetchone(f"SELECT count(*) FROM runs{clause}", tuple(params))
        return int(row[0]) if row else 0

    async def runs_by_id(self, run_ids: list[str]) -> list[Run]:
        await self.db.flush()
        found: list[Run] = []
        for start in range(0, len(run_ids), 500):
            chunk = run_ids[start : start + 500]
            rows = await self.db.fetchall(
                f"{SELECT_RUN} WHERE id IN ({_marks(chunk)})", tuple(chunk)
            )
            found.extend(run_from_row(row) for row in rows)  # type: ignore[arg-type]
        return found

    async def pending_runs(self, queues: list[str]) -> list[Run]:
        if not queues:
            return []
        await self.db.flush()
        rows = await self.db.fetchall(
            f"{SELECT_RUN} WHERE status IN ({_marks(PENDING)}) AND queue IN ({_marks(queues)})",
            (*PENDING, *queues),
        )
        return [run_from_row(row) for row in rows]  # type: ignore[arg-type]

    async def adopt_runs(self, runs: Sequence[tuple[str, str | None]], worker: str) -> set[str]:
        if not runs:
            return set()
        await self.db.flush()  # this process's writes to the runs first
        statement = (
            "UPDATE runs SET worker = ?, rev = (SELECT coalesce(max(rev), 0) + 1 FROM runs)"
            f" WHERE id = ? AND worker IS ? AND status IN ({_marks(PENDING)})"
        )

        def adopt(conn: sqlite3.Connection) -> set[str]:
            # One statement a run (a row count each), in the one transaction.
            return {
                run_id
                for run_id, was in runs
                if conn.execute(statement, (worker, run_id, was, *PENDING)).rowcount == 1
            }

        return await self.db.transaction(adopt, weight=len(runs))  # many: off the loop

    # ---- housekeeping ----------------------------------------------------------------------
    async def purge(self, finished_before: datetime, limit: int = 500) -> int:
        cutoff = finished_before.timestamp()

        def purge(conn: Any) -> int:
            ids = [
                (row[0],)
                for row in conn.execute(
                    f"SELECT id FROM runs WHERE finished_at < ? AND status IN ({_marks(TERMINAL)})"
                    f" AND {NOT_A_DEAD_LETTER} LIMIT ?",
                    (cutoff, *TERMINAL, limit),
                )
            ]
            for table in ("steps", "attempts", "logs", "events", "event_waiters"):
                conn.executemany(f"DELETE FROM {table} WHERE run_id = ?", ids)
            conn.executemany("DELETE FROM runs WHERE id = ?", ids)
            conn.execute("DELETE FROM idempotency WHERE expires_at <= ?", (time.time(),))
            return len(ids)

        return await self.db.transaction(purge, weight=INLINE_WEIGHT + 1)  # off the loop

    # ---- event mailboxes -------------------------------------------------------------------
    async def post_event(
        self, event: str, payload: Any, *, run_id: str | None
    ) -> list[Delivery] | None:
        return await self.db.transaction(lambda conn: post_event(conn, event, payload, run_id))

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
        return await self.db.transaction(
            lambda conn: take_event(conn, run_id, step, event, key, path, register)
        )

    async def events_of(self, run_id: str) -> list[EventMessage]:
        await self.db.flush()
        rows = await self.db.fetchall(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id = ? ORDER BY id", (run_id,)
        )
        return [_message(row) for row in rows]

    async def event_waiters(self, run_ids: list[str] | None = None) -> list[EventWaiter]:
        await self.db.flush()
        sql = "SELECT run_id, step, event, key, path FROM event_waiters"
        params: tuple[Any, ...] = ()
        if run_ids is not None:
            if not run_ids:
                return []
            sql += f" WHERE run_id IN ({_marks(run_ids)})"
            params = tuple(run_ids)
        rows = await self.db.fetchall(sql, params)
        return [
            EventWaiter(r[0], r[1], r[2], r[3], tuple(json.loads(r[4])) if r[4] else ())
            for r in rows
        ]

    async def purge_events(self, sent_before: float) -> int:
        def purge(conn: sqlite3.Connection) -> int:
            deleted = conn.execute(
                "DELETE FROM events WHERE (run_id IS NULL AND sent_at < ?)"
                " OR (run_id IS NOT NULL AND run_id NOT IN (SELECT id FROM runs))",
                (sent_before,),
            ).rowcount
            conn.execute(
                "DELETE FROM event_waiters WHERE run_id NOT IN (SELECT id FROM runs WHERE"
                f" status NOT IN ({_marks(TERMINAL)}))",
                TERMINAL,
            )
            return int(deleted)

        return await self.db.transaction(purge)

    # ---- the change feed -------------------------------------------------------------------
    async def feed(self, cursor: FeedCursor, limit: int = 1000) -> FeedPage:
        rows = await self.db.fetchall(
            f"SELECT {', '.join(RUN_COLUMNS)}, rev FROM runs WHERE rev > ? ORDER BY rev LIMIT ?",
            (cursor.rev, limit + 1),
        )
        lagged = 0
        rev = cursor.rev
        if len(rows) > limit:
            top = await self.db.fetchone("SELECT coalesce(max(rev), 0) FROM runs")
            rev = int(top[0]) if top else rev
            lagged = rev - cursor.rev
            rows = []
        elif rows:
            rev = rows[-1]["rev"]
        runs = await self._with_steps([run_from_row(row) for row in rows])  # type: ignore[arg-type]
        lines = await self.db.fetchall(
            "SELECT id, run_id, step_idx, level, message FROM logs WHERE id > ?"
            " ORDER BY id LIMIT ?",
            (cursor.log_id, limit + 1),
        )
        log_id = cursor.log_id
        if len(lines) > limit:
            top = await self.db.fetchone("SELECT coalesce(max(id), 0) FROM logs")
            log_id = int(top[0]) if top else log_id
            lagged += log_id - cursor.log_id
            lines = []
        elif lines:
            log_id = lines[-1]["id"]
        logs = [
            FeedLog(r["id"], r["run_id"], r["step_idx"], r["level"], r["message"]) for r in lines
        ]
        return FeedPage(runs, logs, FeedCursor(rev, log_id), lagged)

    async def feed_cursor(self) -> FeedCursor:
        await self.db.flush()
        row = await self.db.fetchone(
            "SELECT (SELECT coalesce(max(rev), 0) FROM runs), (SELECT coalesce(max(id), 0) FROM logs)"
        )
        return FeedCursor(int(row[0]), int(row[1])) if row else FeedCursor()
