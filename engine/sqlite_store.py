"""The run store on SQLite: runs, steps, attempts, logs and the idempotency cache.

The runner mutates Run objects in memory and calls `save_run`; the store only remembers that
the run is dirty. At each writer batch the latest state of every dirty run is written once, so a
run that starts and finishes within one batch costs one row per table, not one per change.
"""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import datetime
from typing import Any

from .models import (
    PENDING_RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
    Attempt,
    AttemptStatus,
    LogLine,
    Run,
    RunStatus,
    StepRun,
    StepStatus,
    WorkerInfo,
    from_epoch,
    to_epoch,
)
from .sqlite_db import SqliteDatabase
from .store import CacheHit, ControlRequest, RunFilter, RunStore

_dumps = json.dumps

RUN_COLUMNS = (
    "id, workflow_name, workflow_version, queue, job_id, status, input, headers, output, error,"
    " error_step, priority, job_attempt, created_at, started_at, finished_at, run_at,"
    " wait_until, replay_of, replay_from_step, parent_run_id, depth, worker, cursor, state,"
    " attempts, failed_attempts"
)
_RUN_NAMES = [c.strip() for c in RUN_COLUMNS.split(",")]
# `rev`: every write of a run row takes the next number, inside the writer's transaction, so
# an attached process reads the changed runs in commit order (`WHERE rev > ?`).
NEXT_REV = "(SELECT coalesce(max(rev), 0) + 1 FROM runs)"
UPSERT_RUN = (
    f"INSERT INTO runs ({RUN_COLUMNS}, rev) VALUES ({', '.join('?' * len(_RUN_NAMES))},"
    f" {NEXT_REV}) ON CONFLICT(id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _RUN_NAMES if c != "id")
    + ", rev = excluded.rev"
    # A run marked crashed stays crashed: a worker that stalled past its lease and wakes up
    # must not turn it back into running or completed while another worker has its job.
    + " WHERE runs.status <> 'crashed'"
)
STEP_COLUMNS = (
    "run_id, idx, name, kind, status, started_at, finished_at, input, output, error,"
    " max_attempts, cached_from, wait_until, timed_out, tags, parent, child_run_id"
)
UPSERT_STEP = f"INSERT OR REPLACE INTO steps ({STEP_COLUMNS}) VALUES ({', '.join('?' * 17)})"
ATTEMPT_COLUMNS = (
    "run_id, step_idx, number, status, started_at, finished_at, error, error_type,"
    " traceback, backoff_ms"
)
UPSERT_ATTEMPT = (
    f"INSERT OR REPLACE INTO attempts ({ATTEMPT_COLUMNS}) VALUES ({', '.join('?' * 10)})"
)
INSERT_LOG = "INSERT INTO logs (run_id, step_idx, ts, level, message) VALUES (?, ?, ?, ?, ?)"


def _json(value: Any) -> str | None:
    return None if value is None else _dumps(value, default=str)


def _load(value: str | None) -> Any:
    return None if value is None else json.loads(value)


def run_row(run: Run) -> tuple[Any, ...]:
    return (
        run.id,
        run.workflow_name,
        run.workflow_version,
        run.queue,
        run.job_id,
        str(run.status),
        _json(run.input),
        _json(run.headers) if run.headers else None,
        _json(run.output),
        run.error,
        run.error_step,
        run.priority,
        run.job_attempt,
        run.created_at.timestamp(),
        to_epoch(run.started_at),
        to_epoch(run.finished_at),
        to_epoch(run.run_at),
        to_epoch(run.wait_until),
        run.replay_of,
        run.replay_from_step,
        run.parent_run_id,
        run.depth,
        run.worker,
        _json(run.cursor) if run.cursor else None,
        _json(run.state) if run.state else None,
        run.attempts,
        run.failed_attempts,
    )


def step_row(run_id: str, step: StepRun) -> tuple[Any, ...]:
    return (
        run_id,
        step.index,
        step.name,
        step.kind,
        str(step.status),
        to_epoch(step.started_at),
        to_epoch(step.finished_at),
        _json(step.input),
        _json(step.output),
        step.error,
        step.max_attempts,
        step.cached_from,
        to_epoch(step.wait_until),
        int(step.timed_out),
        _json(step.tags) if step.tags else None,
        step.parent,
        step.child_run_id,
    )


def attempt_row(run_id: str, step_index: int, attempt: Attempt) -> tuple[Any, ...]:
    return (
        run_id,
        step_index,
        attempt.number,
        str(attempt.status),
        attempt.started_at.timestamp(),
        to_epoch(attempt.finished_at),
        attempt.error,
        attempt.error_type,
        attempt.traceback,
        attempt.backoff_ms,
    )


def run_from_row(row: sqlite3.Row) -> Run:
    return Run.model_construct(
        id=row["id"],
        workflow_name=row["workflow_name"],
        workflow_version=row["workflow_version"],
        queue=row["queue"],
        job_id=row["job_id"],
        status=RunStatus(row["status"]),
        input=_load(row["input"]),
        headers=_load(row["headers"]) or {},
        output=_load(row["output"]),
        error=row["error"],
        error_step=row["error_step"],
        priority=row["priority"],
        job_attempt=row["job_attempt"],
        created_at=from_epoch(row["created_at"]),
        started_at=from_epoch(row["started_at"]),
        finished_at=from_epoch(row["finished_at"]),
        run_at=from_epoch(row["run_at"]),
        wait_until=from_epoch(row["wait_until"]),
        replay_of=row["replay_of"],
        replay_from_step=row["replay_from_step"],
        parent_run_id=row["parent_run_id"],
        depth=row["depth"],
        worker=row["worker"],
        attempts=row["attempts"],
        failed_attempts=row["failed_attempts"],
        cursor=_load(row["cursor"]) or [],
        state=_load(row["state"]) or {},
        steps=[],
        logs=[],
    )


def _where(where: RunFilter | None) -> tuple[str, list[Any]]:
    if where is None:
        return "", []
    clauses: list[str] = []
    params: list[Any] = []
    if where.status:
        clauses.append(f"status IN ({', '.join('?' * len(where.status))})")
        params.extend(where.status)
    if where.workflow:
        clauses.append("workflow_name = ?")
        params.append(where.workflow)
    if where.queue:
        clauses.append("queue = ?")
        params.append(where.queue)
    if where.job_id:
        clauses.append("job_id = ?")
        params.append(where.job_id)
    if where.retrying:
        live = ", ".join(f"'{s}'" for s in ("queued", "delayed", "running", "waiting"))
        clauses.append(f"status IN ({live}) AND (failed_attempts > 0 OR job_attempt > 1)")
    cutoffs = where.stuck_before()
    if cutoffs is not None:
        per_workflow = " OR ".join(["(workflow_name = ? AND started_at < ?)"] * len(cutoffs))
        clauses.append(f"status = 'running' AND ({per_workflow or '0'})")
        for workflow, cutoff in cutoffs.items():
            params.extend([workflow, cutoff])
    if where.text:
        like = f"%{where.text}%"
        clauses.append(
            "(id LIKE ? OR workflow_name LIKE ? OR queue LIKE ? OR status LIKE ? OR error LIKE ?)"
        )
        params.extend([like] * 5)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


class SqliteRunStore(RunStore):
    kind = "sqlite"

    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db
        self._dirty: dict[str, Run] = {}
        db.add_row_source(self._rows)

    def pending(self) -> bool:
        return bool(self._dirty)

    def _rows(self) -> list[tuple[str, list[tuple[Any, ...]]]]:
        if not self._dirty:
            return []
        dirty, self._dirty = self._dirty, {}
        runs, steps, attempts = [], [], []
        for run in dirty.values():
            runs.append(run_row(run))
            for step in run.steps:
                steps.append(step_row(run.id, step))
                for attempt in step.attempts:
                    attempts.append(attempt_row(run.id, step.index, attempt))
        return [(UPSERT_RUN, runs), (UPSERT_STEP, steps), (UPSERT_ATTEMPT, attempts)]

    # ---- writes ----------------------------------------------------------------------------
    def save_run(self, run: Run) -> None:
        self._dirty[run.id] = run
        self.db.mark_dirty()

    def add_log(self, run: Run, line: LogLine) -> None:
        self.db.write(
            INSERT_LOG, (run.id, line.step, line.ts.timestamp(), line.level, line.message)
        )

    def cache_put(
        self, workflow: str, step: str, key: str, output: Any, run_id: str, ttl_ms: int
    ) -> None:
        self.db.write(
            "INSERT OR REPLACE INTO idempotency (workflow, step, key, output, run_id, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (workflow, step, key, _json(output), run_id, time.time() + ttl_ms / 1000),
        )

    async def flush(self) -> None:
        await self.db.flush()

    # ---- reads -----------------------------------------------------------------------------
    async def cache_get(self, workflow: str, step: str, key: str) -> CacheHit | None:
        await self.db.flush()
        row = await self.db.fetchone(
            "SELECT output, run_id FROM idempotency WHERE workflow = ? AND step = ? AND key = ?"
            " AND expires_at > ?",
            (workflow, step, key, time.time()),
        )
        return CacheHit(_load(row["output"]), row["run_id"]) if row else None

    async def get_run(self, run_id: str) -> Run | None:
        await self.db.flush()
        row = await self.db.fetchone(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
        if row is None:
            return None
        run = run_from_row(row)
        steps = {}
        for srow in await self.db.fetchall(
            "SELECT * FROM steps WHERE run_id = ? ORDER BY idx", (run_id,)
        ):
            steps[srow["idx"]] = StepRun.model_construct(
                index=srow["idx"],
                name=srow["name"],
                kind=srow["kind"],
                status=StepStatus(srow["status"]),
                started_at=from_epoch(srow["started_at"]),
                finished_at=from_epoch(srow["finished_at"]),
                input=_load(srow["input"]),
                output=_load(srow["output"]),
                error=srow["error"],
                max_attempts=srow["max_attempts"],
                attempts=[],
                logs=[],
                cached_from=srow["cached_from"],
                wait_until=from_epoch(srow["wait_until"]),
                timed_out=bool(srow["timed_out"]),
                tags=_load(srow["tags"]) or [],
                parent=srow["parent"],
                child_run_id=srow["child_run_id"],
            )
        for arow in await self.db.fetchall(
            "SELECT * FROM attempts WHERE run_id = ? ORDER BY step_idx, number", (run_id,)
        ):
            step = steps.get(arow["step_idx"])
            if step is not None:
                step.attempts.append(
                    Attempt.model_construct(
                        number=arow["number"],
                        status=AttemptStatus(arow["status"]),
                        started_at=from_epoch(arow["started_at"]),
                        finished_at=from_epoch(arow["finished_at"]),
                        error=arow["error"],
                        error_type=arow["error_type"],
                        traceback=arow["traceback"],
                        backoff_ms=arow["backoff_ms"],
                    )
                )
        for lrow in await self.db.fetchall(
            "SELECT step_idx, ts, level, message FROM logs WHERE run_id = ? ORDER BY id",
            (run_id,),
        ):
            line = LogLine.model_construct(
                ts=from_epoch(lrow["ts"]),
                level=lrow["level"],
                message=lrow["message"],
                step=lrow["step_idx"],
            )
            step = steps.get(line.step) if line.step is not None else None
            (step.logs if step is not None else run.logs).append(line)
        run.steps = [steps[i] for i in sorted(steps)]
        return run

    async def list_runs(
        self, where: RunFilter | None = None, limit: int = 100, offset: int = 0
    ) -> list[Run]:
        await self.db.flush()
        clause, params = _where(where)
        rows = await self.db.fetchall(
            f"SELECT {RUN_COLUMNS} FROM runs{clause} ORDER BY created_at DESC LIMIT ? OFFSET ?",
            (*params, limit, offset),
        )
        return [run_from_row(row) for row in rows]

    async def count_runs(self, where: RunFilter | None = None) -> int:
        await self.db.flush()
        clause, params = _where(where)
        row = await self.db.fetchone(f"SELECT count(*) FROM runs{clause}", tuple(params))
        return int(row[0]) if row else 0

    async def pending_runs(self) -> list[Run]:
        statuses = ", ".join(f"'{s}'" for s in PENDING_RUN_STATUSES)
        rows = await self.db.fetchall(
            f"SELECT {RUN_COLUMNS} FROM runs WHERE status IN ({statuses})"
        )
        return [run_from_row(row) for row in rows]

    # ---- recovery and housekeeping ---------------------------------------------------------
    async def mark_crashed(self, reason: str, *, workers: list[str] | None = None) -> list[str]:
        def flip(conn: sqlite3.Connection) -> list[str]:
            return crash_runs(conn, reason, workers)

        return await self.db.run_claim(flip)

    async def purge(self, finished_before: datetime, limit: int = 500) -> int:
        cutoff = finished_before.timestamp()
        terminal = ", ".join(f"'{s}'" for s in TERMINAL_RUN_STATUSES)

        def purge(conn: sqlite3.Connection) -> int:
            ids = [
                row[0]
                for row in conn.execute(
                    f"SELECT id FROM runs WHERE finished_at < ? AND status IN ({terminal}) LIMIT ?",
                    (cutoff, limit),
                )
            ]
            for table, column in (("steps", "run_id"), ("attempts", "run_id"), ("logs", "run_id")):
                conn.executemany(f"DELETE FROM {table} WHERE {column} = ?", [(i,) for i in ids])
            conn.executemany("DELETE FROM runs WHERE id = ?", [(i,) for i in ids])
            conn.execute(
                "DELETE FROM jobs WHERE state IN ('completed', 'failed', 'cancelled')"
                " AND finished_at < ?",
                (cutoff,),
            )
            conn.execute("DELETE FROM idempotency WHERE expires_at <= ?", (time.time(),))
            conn.execute(
                "DELETE FROM control WHERE result IS NOT NULL AND created_at < ?", (cutoff,)
            )
            return len(ids)

        return await self.db.run_claim(purge)

    def heartbeat(self, worker: WorkerInfo) -> None:
        self.db.write(
            "INSERT OR REPLACE INTO workers (id, host, pid, started_at, heartbeat_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (
                worker.id,
                worker.host,
                worker.pid,
                worker.started_at.timestamp(),
                worker.heartbeat_at.timestamp(),
            ),
        )

    async def workers(self) -> list[WorkerInfo]:
        await self.db.flush()
        rows = await self.db.fetchall("SELECT * FROM workers ORDER BY started_at")
        return [
            WorkerInfo(
                id=row["id"],
                host=row["host"],
                pid=row["pid"],
                started_at=from_epoch(row["started_at"]),
                heartbeat_at=from_epoch(row["heartbeat_at"]),
            )
            for row in rows
        ]

    async def forget_worker(self, worker_id: str) -> None:
        self.db.write("DELETE FROM workers WHERE id = ?", (worker_id,))
        await self.db.flush()

    # ---- control requests ------------------------------------------------------------------
    async def post_control(
        self, action: str, run_id: str | None, payload: dict[str, Any], target: str | None = None
    ) -> int:
        def post(conn: sqlite3.Connection) -> int:
            cursor = conn.execute(
                "INSERT INTO control (action, run_id, target, payload, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (action, run_id, target, _json(payload), time.time()),
            )
            return int(cursor.lastrowid or 0)

        return await self.db.run_claim(post)

    async def take_control(self, worker: str) -> list[ControlRequest]:
        # A cheap read first: the write transaction only happens when there is something.
        row = await self.db.fetchone(
            "SELECT 1 FROM control WHERE taken_by IS NULL AND (target IS NULL OR target = ?)"
            " LIMIT 1",
            (worker,),
        )
        if row is None:
            return []

        def take(conn: sqlite3.Connection) -> list[ControlRequest]:
            rows = conn.execute(
                "UPDATE control SET taken_by = ? WHERE taken_by IS NULL"
                " AND (target IS NULL OR target = ?) RETURNING id, action, run_id, payload",
                (worker, worker),
            ).fetchall()
            return [
                ControlRequest(id=r[0], action=r[1], run_id=r[2], payload=_load(r[3]) or {})
                for r in sorted(rows)
            ]

        return await self.db.run_claim(take)

    async def finish_control(self, request_id: int, result: dict[str, Any]) -> None:
        self.db.write("UPDATE control SET result = ? WHERE id = ?", (_json(result), request_id))
        await self.db.flush()

    async def control_result(self, request_id: int) -> dict[str, Any] | None:
        row = await self.db.fetchone("SELECT result FROM control WHERE id = ?", (request_id,))
        return _load(row["result"]) if row and row["result"] else None

    async def paused_queues(self) -> set[str]:
        await self.db.flush()
        return {row[0] for row in await self.db.fetchall("SELECT queue FROM paused_queues")}

    async def set_paused(self, queue: str, paused: bool) -> None:
        if paused:
            self.db.write("INSERT OR IGNORE INTO paused_queues (queue) VALUES (?)", (queue,))
        else:
            self.db.write("DELETE FROM paused_queues WHERE queue = ?", (queue,))
        await self.db.flush()

    async def change_token(self) -> int:
        return await self.db.data_version()


def crash_runs(
    conn: sqlite3.Connection,
    reason: str,
    workers: list[str] | None = None,
    run_ids: list[str] | None = None,
) -> list[str]:
    """Flip `running` runs (of these workers, or these ids) to crashed, with their running
    steps and attempts."""
    if (workers is not None and not workers) or (run_ids is not None and not run_ids):
        return []
    sql = "SELECT id FROM runs WHERE status = 'running'"
    params: list[Any] = []
    if workers is not None:
        sql += f" AND worker IN ({', '.join('?' * len(workers))})"
        params.extend(workers)
    if run_ids is not None:
        sql += f" AND id IN ({', '.join('?' * len(run_ids))})"
        params.extend(run_ids)
    ids = [row[0] for row in conn.execute(sql, params)]
    now = time.time()
    for run_id in ids:
        conn.execute(
            f"UPDATE runs SET status = 'crashed', error = ?, finished_at = ?, rev = {NEXT_REV}"
            " WHERE id = ?",
            (reason, now, run_id),
        )
        conn.execute(
            "UPDATE steps SET status = 'failed', error = ?, finished_at = ?"
            " WHERE run_id = ? AND status = 'running'",
            (reason, now, run_id),
        )
        conn.execute(
            "UPDATE attempts SET status = 'failed', error = ?, finished_at = ?"
            " WHERE run_id = ? AND status = 'running'",
            (reason, now, run_id),
        )
    return ids
