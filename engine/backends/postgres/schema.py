"""The PostgreSQL schema: versioned DDL and the migration that applies it.

It mirrors the SQLite schema (`engine/sqlite_db.py`) table for table, with what the redesign
adds: the fencing token and the operator's signal on `jobs`, and `leader_leases` for the cluster
chores. Where it differs from SQLite, and why:

- Times are `double precision` epoch seconds, as in SQLite: the row codecs stay one for both
  backends, the drivers decode a float far cheaper than a `timestamptz` into a `datetime`, and a
  lease is a plain comparison. Everything that expires (leases, slots, leader leases) is computed
  from the server's clock (`sql.NOW`), so workers whose clocks disagree still agree on who holds
  what. `to_timestamp(col)` shows a time in psql.
- Data the user owns (payloads, inputs, outputs, state, headers) is `json`, not `jsonb`: `json`
  keeps the text as written, so a dict comes back in the order it went in, as it does from
  SQLite and memory (`jsonb` sorts keys, drops duplicates and refuses "\\u0000"), and it is cheaper
  to write. What SQL inspects or merges, the engine's own `meta` and `signal`, is `jsonb`.
- Ids in order (`jobs.seq`, `logs.id`, `control.id`) are identity columns.
- `runs.rev` is not `max(rev) + 1`: under concurrent transactions that hands two writers the same
  number and commits out of order. A run's row records the transaction that last wrote it
  (`changed_xid`, `pg_current_xact_id()` as a bigint, which every driver reads); an attached
  reader takes the rows whose transaction is below the oldest one still running
  (`sql.CHANGED_RUNS`), so it never skips a late commit.
- Each migration runs in one transaction under an advisory lock: two workers starting on an empty
  database do not both apply it.
"""

from __future__ import annotations

import asyncpg

SCHEMA_VERSION = 1

# pg_advisory_xact_lock key that serializes migrations (any constant unique to blok; "blok").
MIGRATION_LOCK = 0x626C6F6B

_JOB_STATES = "'waiting', 'delayed', 'active', 'completed', 'failed', 'cancelled', 'dead'"
_RUN_STATUSES = (
    "'queued', 'delayed', 'debounced', 'running', 'waiting', 'completed', 'failed',"
    " 'cancelled', 'timed_out', 'crashed', 'throttled', 'expired'"
)

MIGRATIONS: dict[int, str] = {
    1: f"""
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        workflow_name TEXT NOT NULL,
        workflow_version TEXT NOT NULL,
        queue TEXT NOT NULL,
        job_id TEXT NOT NULL,
        status TEXT NOT NULL CONSTRAINT runs_status_known CHECK (status IN ({_RUN_STATUSES})),
        input JSON,
        headers JSON,
        output JSON,
        error TEXT,
        error_step TEXT,
        priority INTEGER NOT NULL DEFAULT 0,
        job_attempt INTEGER NOT NULL DEFAULT 1,
        created_at DOUBLE PRECISION NOT NULL,
        started_at DOUBLE PRECISION,
        finished_at DOUBLE PRECISION,
        run_at DOUBLE PRECISION,
        wait_until DOUBLE PRECISION,
        replay_of TEXT,
        replay_from_step TEXT,
        parent_run_id TEXT,
        depth INTEGER NOT NULL DEFAULT 0,
        worker TEXT,
        cursor JSON,
        state JSON,
        attempts INTEGER NOT NULL DEFAULT 0,
        failed_attempts INTEGER NOT NULL DEFAULT 0,
        changed_xid BIGINT NOT NULL DEFAULT (pg_current_xact_id()::text::bigint)
    );
    CREATE INDEX runs_created ON runs (created_at DESC);
    CREATE INDEX runs_status ON runs (status, created_at DESC);
    CREATE INDEX runs_workflow ON runs (workflow_name, created_at DESC);
    CREATE INDEX runs_queue ON runs (queue, created_at DESC);
    CREATE INDEX runs_job ON runs (job_id);
    CREATE INDEX runs_finished ON runs (finished_at) WHERE finished_at IS NOT NULL;
    CREATE INDEX runs_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
    CREATE INDEX runs_changed ON runs (changed_xid);

    CREATE TABLE steps (
        run_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        name TEXT NOT NULL,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        started_at DOUBLE PRECISION,
        finished_at DOUBLE PRECISION,
        input JSON,
        output JSON,
        error TEXT,
        max_attempts INTEGER NOT NULL,
        cached_from TEXT,
        wait_until DOUBLE PRECISION,
        timed_out BOOLEAN NOT NULL DEFAULT false,
        tags JSON,
        parent INTEGER,
        child_run_id TEXT,
        PRIMARY KEY (run_id, idx)
    );

    CREATE TABLE attempts (
        run_id TEXT NOT NULL,
        step_idx INTEGER NOT NULL,
        number INTEGER NOT NULL,
        status TEXT NOT NULL,
        started_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        error TEXT,
        error_type TEXT,
        traceback TEXT,
        backoff_ms BIGINT,
        PRIMARY KEY (run_id, step_idx, number)
    );

    CREATE TABLE logs (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        run_id TEXT NOT NULL,
        step_idx INTEGER,
        ts DOUBLE PRECISION NOT NULL,
        level TEXT NOT NULL,
        message TEXT NOT NULL
    );
    CREATE INDEX logs_run ON logs (run_id, id);

    CREATE TABLE idempotency (
        workflow TEXT NOT NULL,
        step TEXT NOT NULL,
        key TEXT NOT NULL,
        output JSON,
        run_id TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (workflow, step, key)
    );
    CREATE INDEX idempotency_expires ON idempotency (expires_at);

    -- epoch: the fencing token. Every claim and every change of state adds one; a write of the
    --   job or its run carries the epoch its writer was given and lands only if it still holds.
    -- signal: what an operator asks of the job's holder ({{"cancel": ts, "retry_now": ts}});
    --   the holder reads it with its lease renewal. Writing it does not move the epoch.
    -- taken_from: the worker whose expired lease the last claim took over (NULL: a fresh claim).
    -- force: due now even though its queue is paused (retry-now of a job on a paused queue).
    CREATE TABLE jobs (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        queue TEXT NOT NULL,
        workflow_name TEXT NOT NULL,
        payload JSON,
        headers JSON,
        priority INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL CONSTRAINT jobs_state_known CHECK (state IN ({_JOB_STATES})),
        run_at DOUBLE PRECISION,
        attempts INTEGER NOT NULL DEFAULT 0,
        max_retries INTEGER NOT NULL DEFAULT 0,
        run_id TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        error TEXT,
        worker TEXT,
        lease_until DOUBLE PRECISION,
        resume BOOLEAN NOT NULL DEFAULT false,
        meta JSONB,
        epoch BIGINT NOT NULL DEFAULT 0,
        signal JSONB,
        taken_from TEXT,
        force BOOLEAN NOT NULL DEFAULT false,
        CONSTRAINT jobs_active_leased CHECK (
            state <> 'active' OR (worker IS NOT NULL AND lease_until IS NOT NULL))
    );
    -- The claim walks this index in claim order and stops after the batch.
    CREATE INDEX jobs_ready ON jobs (queue, priority DESC, seq)
        WHERE state IN ('waiting', 'delayed');
    -- Expired leases, and a worker's renewal, read only the active jobs.
    CREATE INDEX jobs_leases ON jobs (lease_until) WHERE state = 'active';
    CREATE INDEX jobs_held ON jobs (worker) WHERE state = 'active';
    CREATE INDEX jobs_state ON jobs (queue, state);
    CREATE INDEX jobs_run ON jobs (run_id);
    CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;

    CREATE TABLE control (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        action TEXT NOT NULL,
        run_id TEXT,
        target TEXT,
        payload JSONB,
        created_at DOUBLE PRECISION NOT NULL,
        taken_by TEXT,
        result JSONB
    );
    CREATE INDEX control_open ON control (id) WHERE taken_by IS NULL;

    CREATE TABLE workers (
        id TEXT PRIMARY KEY,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        started_at DOUBLE PRECISION NOT NULL,
        heartbeat_at DOUBLE PRECISION NOT NULL
    );

    CREATE TABLE worker_catalog (
        worker TEXT PRIMARY KEY,
        queues JSONB NOT NULL,
        workflows JSONB NOT NULL,
        reload_errors JSONB NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    );

    CREATE TABLE paused_queues (queue TEXT PRIMARY KEY);

    CREATE TABLE concurrency_slots (
        workflow TEXT NOT NULL,
        key TEXT NOT NULL,
        run_id TEXT NOT NULL,
        worker TEXT NOT NULL,
        lease_until DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (workflow, key, run_id)
    );
    CREATE INDEX concurrency_slots_run ON concurrency_slots (run_id);
    CREATE INDEX concurrency_slots_worker ON concurrency_slots (worker);

    CREATE TABLE debounce_windows (
        workflow TEXT NOT NULL,
        key TEXT NOT NULL,
        mode TEXT NOT NULL,
        run_id TEXT NOT NULL,
        job_id TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        opened_at DOUBLE PRECISION NOT NULL,
        until DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (workflow, key)
    );

    -- One row per cluster chore (janitor, recovery of dead workers): whoever holds an unexpired
    -- row does the chore; the others try again when it expires.
    CREATE TABLE leader_leases (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        until DOUBLE PRECISION NOT NULL
    );
    """,
}


class SchemaError(RuntimeError):
    """The database cannot be used as it is: written by a newer blok-tui."""


async def migrate(conn: asyncpg.Connection) -> int:
    """Bring the database to SCHEMA_VERSION and return it. Safe to call from every process at
    start: the advisory lock makes the others wait, and they then find nothing left to do."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY,"
            " applied_at DOUBLE PRECISION NOT NULL DEFAULT extract(epoch FROM now()))"
        )
        current: int = await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_version")
        if current > SCHEMA_VERSION:
            database = await conn.fetchval("SELECT current_database()")
            raise SchemaError(
                f"database {database!r}: written by a newer blok-tui (schema {current}, this "
                f"one knows {SCHEMA_VERSION}); upgrade blok-tui"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            await conn.execute(MIGRATIONS[version])
            await conn.execute("INSERT INTO schema_version (version) VALUES ($1)", version)
    return SCHEMA_VERSION
