"""The PostgreSQL schema: versioned DDL and the migration that applies it.

It mirrors the SQLite schema (`backends/sqlite/schema.py`) table for table and column for
column, so that the row codecs of `backends/rows.py` serve both. Where it differs, and why:

- Everything lives in its own schema, `blok` (every connection's search_path): a database that
  already holds an application's own `runs` or `jobs` tables can take blok's beside them.
- Times are `double precision` epoch seconds, as in SQLite: one codec for both backends, and the
  driver decodes a float far cheaper than a `timestamptz` into a `datetime`. Everything that
  decides who holds what (leases, slots, leader leases) is computed from the server's clock
  (`sql.NOW`), so workers whose clocks disagree still agree. `to_timestamp(col)` shows one in psql.
- Flags (`resume`, `forced`, `timed_out`) are integers, as the codecs write them.
- Data the user owns (payloads, inputs, outputs, state, headers) is `json`, not `jsonb`: `json`
  keeps the text as written, so a dict comes back in the order it went in, as from SQLite and
  memory (`jsonb` sorts keys and drops duplicates), and it is cheaper to write. What SQL merges,
  the operator's `signals` on a job and the engine's `meta`, is `jsonb`.
- Ids in order (`jobs.seq`, `logs.id`) are identity columns.
- The change feed cannot use SQLite's `max(rev) + 1`: concurrent transactions would take the same
  number, and a number taken early can commit late, behind a reader that already passed it. A
  run row and a log line record the transaction that last wrote them (`xid`, from
  `pg_current_xact_id()`); a reader takes what lies below the oldest transaction of this
  database still running (see "the change feed" in sql.py), so it reads every change once and
  never skips a late commit.
- A migration runs in one transaction under an advisory lock: workers starting together on an
  empty database do not both apply it.
"""

from __future__ import annotations

import asyncpg

SCHEMA = "blok"
SCHEMA_VERSION = 11

# pg_advisory_xact_lock key that serializes migrations (a constant unique to blok: "blok").
MIGRATION_LOCK = 0x626C6F6B

_XID = "(pg_current_xact_id()::text::bigint)"
_JOB_STATES = "'waiting', 'delayed', 'active', 'completed', 'failed', 'cancelled', 'dead'"

MIGRATIONS: dict[int, str] = {
    1: f"""
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        workflow_name TEXT NOT NULL,
        workflow_version TEXT NOT NULL,
        queue TEXT NOT NULL,
        job_id TEXT NOT NULL,
        status TEXT NOT NULL,
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
        -- the transaction that last wrote the row: the change feed's order
        xid BIGINT NOT NULL DEFAULT {_XID}
    );
    CREATE INDEX runs_created ON runs (created_at DESC);
    CREATE INDEX runs_status ON runs (status, created_at DESC);
    CREATE INDEX runs_workflow ON runs (workflow_name, created_at DESC);
    CREATE INDEX runs_queue ON runs (queue, created_at DESC);
    CREATE INDEX runs_job ON runs (job_id);
    CREATE INDEX runs_finished ON runs (finished_at) WHERE finished_at IS NOT NULL;
    CREATE INDEX runs_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
    CREATE INDEX runs_xid ON runs (xid);

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
        timed_out INTEGER NOT NULL DEFAULT 0,
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
        message TEXT NOT NULL,
        xid BIGINT NOT NULL DEFAULT {_XID}
    );
    CREATE INDEX logs_run ON logs (run_id, id);
    CREATE INDEX logs_xid ON logs (xid);

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
    --   job or its run names the epoch its writer was given and lands only while it holds.
    -- signals: what an operator asks of the job's holder ({{"cancel": ts, "retry_now": ts}}).
    -- taken_from: the worker whose expired lease the last claim took over (NULL: a fresh claim).
    -- forced: due now even though its queue is paused (an operator's "run it now").
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
        resume INTEGER NOT NULL DEFAULT 0,
        meta JSONB,
        epoch BIGINT NOT NULL DEFAULT 0,
        signals JSONB,
        forced INTEGER NOT NULL DEFAULT 0,
        taken_from TEXT,
        CONSTRAINT jobs_active_leased CHECK (
            state <> 'active' OR (worker IS NOT NULL AND lease_until IS NOT NULL))
    );
    -- The claim walks this index in claim order and stops after the batch.
    CREATE INDEX jobs_ready ON jobs (queue, priority DESC, seq)
        WHERE state IN ('waiting', 'delayed');
    -- Expired leases (the claim takes them over) and a worker's renewal read only active jobs.
    CREATE INDEX jobs_active ON jobs (queue, lease_until) WHERE state = 'active';
    CREATE INDEX jobs_holder ON jobs (worker) WHERE state = 'active';
    CREATE INDEX jobs_state ON jobs (queue, state);
    CREATE INDEX jobs_run ON jobs (run_id);
    CREATE INDEX jobs_finished ON jobs (finished_at)
        WHERE state IN ('completed', 'failed', 'cancelled');
    CREATE INDEX jobs_dead ON jobs (queue, finished_at DESC) WHERE state = 'dead';

    CREATE TABLE workers (
        id TEXT PRIMARY KEY,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        started_at DOUBLE PRECISION NOT NULL,
        heartbeat_at DOUBLE PRECISION NOT NULL
    );

    CREATE TABLE worker_catalog (
        worker TEXT PRIMARY KEY,
        queues JSON NOT NULL,
        workflows JSON NOT NULL,
        reload_errors JSON NOT NULL,
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
        PRIMARY KEY (workflow, key, mode)
    );

    -- One row per cluster chore (janitor, recovery of dead workers): whoever holds an unexpired
    -- row does the chore; the others try again when it expires.
    CREATE TABLE leader_leases (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        until DOUBLE PRECISION NOT NULL
    );
    """,
    # Events, schedules, rate limits (SQLite's migration 5): each run's mailbox and the waiter
    # parked on it; schedules with their last claimed tick (one row per schedule: a tick is
    # claimed by moving last_tick forward, once); the starts each rate-limit window counts.
    # What a run's mailbox and waiter hold is changed only with the run's row locked, and what
    # is sent or taken by key only under an advisory lock on the event's name (store.py).
    2: """
    CREATE TABLE events (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        run_id TEXT,  -- NULL: sent by key, kept for the first run that waits on its key
        event TEXT NOT NULL,
        payload JSON,
        sent_at DOUBLE PRECISION NOT NULL,
        taken_by TEXT,  -- the wait step that took it ("3:approval")
        taken_at DOUBLE PRECISION
    );
    CREATE INDEX events_run ON events (run_id, event);
    CREATE INDEX events_unaddressed ON events (event, id) WHERE run_id IS NULL;

    -- path: the payload's path to the key (a JSON list), NULL for a wait on the run's mailbox.
    CREATE TABLE event_waiters (
        run_id TEXT PRIMARY KEY,
        step TEXT NOT NULL,
        event TEXT NOT NULL,
        key TEXT,
        path JSON
    );
    CREATE INDEX event_waiters_event ON event_waiters (event);

    CREATE TABLE schedules (
        workflow TEXT NOT NULL,
        schedule TEXT NOT NULL,
        spec JSON NOT NULL,
        last_tick DOUBLE PRECISION NOT NULL,
        paused INTEGER NOT NULL DEFAULT 0,
        last_fired_at DOUBLE PRECISION,
        last_job_id TEXT,
        last_run_id TEXT,
        PRIMARY KEY (workflow, schedule)
    );

    CREATE TABLE rate_starts (
        scope TEXT NOT NULL,
        key TEXT NOT NULL,
        run_id TEXT NOT NULL,
        started_at DOUBLE PRECISION NOT NULL,
        until DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (scope, key, run_id)
    );
    CREATE INDEX rate_starts_until ON rate_starts (until);
    """,
    # `handed`: the claim that holds the job gave it straight to a worker slot, whose code may
    # run before the run's start is committed (that commit is not awaited). A worker that takes
    # the job over from an expired lease then records the run crashed even though its record
    # still says queued. A job a claim keeps ahead of its free slots is not handed (its start
    # is committed first), except a worker's top-up of short jobs (`claim_ahead`).
    3: """
    ALTER TABLE jobs ADD COLUMN handed INTEGER NOT NULL DEFAULT 0;
    """,
    # No query reads jobs by run id (a job's run is read through runs.job_id, `runs_job`), yet
    # every enqueue wrote an entry to `jobs_run` and every purge deleted it.
    4: """
    DROP INDEX IF EXISTS jobs_run;
    """,
    # The rows of the writer's bulk statements, one parameter a table: an array of one of
    # these types (a row's columns, a fenced row's fence after them) instead of an array a
    # column. asyncpg encodes some 100 one-column arrays a batch at ~2 µs each (checks
    # against collections.abc for every array and element), and the server parses as many
    # parameters; an array of rows costs neither (sql.py: `_fenced_bulk`, `_enqueue_ctes`,
    # `_update_jobs`). Each type lists its table's columns in the order of the row codecs
    # (rows.py), which a test holds them to.
    5: """
    CREATE TYPE fenced_run AS (id TEXT, workflow_name TEXT, workflow_version TEXT, queue TEXT,
        job_id TEXT, status TEXT, input JSON, headers JSON, output JSON, error TEXT,
        error_step TEXT, priority INTEGER, job_attempt INTEGER, created_at DOUBLE PRECISION,
        started_at DOUBLE PRECISION, finished_at DOUBLE PRECISION, run_at DOUBLE PRECISION,
        wait_until DOUBLE PRECISION, replay_of TEXT, replay_from_step TEXT,
        parent_run_id TEXT, depth INTEGER, worker TEXT, cursor JSON, state JSON,
        attempts INTEGER, failed_attempts INTEGER, fence_job TEXT, fence_epoch BIGINT);
    CREATE TYPE fenced_step AS (run_id TEXT, idx INTEGER, name TEXT, kind TEXT, status TEXT,
        started_at DOUBLE PRECISION, finished_at DOUBLE PRECISION, input JSON, output JSON,
        error TEXT, max_attempts INTEGER, cached_from TEXT, wait_until DOUBLE PRECISION,
        timed_out INTEGER, tags JSON, parent INTEGER, child_run_id TEXT, fence_job TEXT,
        fence_epoch BIGINT);
    CREATE TYPE fenced_attempt AS (run_id TEXT, step_idx INTEGER, number INTEGER,
        status TEXT, started_at DOUBLE PRECISION, finished_at DOUBLE PRECISION, error TEXT,
        error_type TEXT, traceback TEXT, backoff_ms BIGINT, fence_job TEXT,
        fence_epoch BIGINT);
    CREATE TYPE fenced_log AS (run_id TEXT, step_idx INTEGER, ts DOUBLE PRECISION,
        level TEXT, message TEXT, fence_job TEXT, fence_epoch BIGINT);
    CREATE TYPE job_settle AS (state TEXT, run_id TEXT, run_at DOUBLE PRECISION,
        resume INTEGER, error TEXT, meta JSONB, fresh BOOLEAN, forced INTEGER, headers JSON,
        id TEXT, epoch BIGINT);
    CREATE TYPE new_job AS (id TEXT, queue TEXT, workflow_name TEXT, payload JSON,
        headers JSON, priority INTEGER, state TEXT, run_at DOUBLE PRECISION, attempts INTEGER,
        max_retries INTEGER, run_id TEXT, created_at DOUBLE PRECISION,
        finished_at DOUBLE PRECISION, error TEXT, worker TEXT, lease_until DOUBLE PRECISION,
        resume INTEGER, meta JSONB, epoch BIGINT, signals JSONB, forced INTEGER,
        handed INTEGER);
    CREATE TYPE new_run AS (id TEXT, workflow_name TEXT, workflow_version TEXT, queue TEXT,
        job_id TEXT, status TEXT, input JSON, headers JSON, output JSON, error TEXT,
        error_step TEXT, priority INTEGER, job_attempt INTEGER, created_at DOUBLE PRECISION,
        started_at DOUBLE PRECISION, finished_at DOUBLE PRECISION, run_at DOUBLE PRECISION,
        wait_until DOUBLE PRECISION, replay_of TEXT, replay_from_step TEXT,
        parent_run_id TEXT, depth INTEGER, worker TEXT, cursor JSON, state JSON,
        attempts INTEGER, failed_attempts INTEGER);
    """,
    # The writer's mark: a batch that is one statement runs without BEGIN and COMMIT (two round
    # trips fewer), and writes its number here as it goes. A connection lost before the answer
    # leaves no transaction id to look up; the writer then ends the old session on the server
    # and reads its mark: the batch committed if and only if the mark is its number (db.py,
    # `_committed_before`). One row a writer (a process's database), its `at` for clearing rows
    # of processes long gone.
    6: """
    CREATE TABLE writer_marks (writer TEXT PRIMARY KEY, mark BIGINT NOT NULL,
        at DOUBLE PRECISION NOT NULL);
    """,
    # A worker's process as the kernel knows it (liveness.py): where its pid names it (a host
    # name is not enough: machines and containers share them, and a live worker elsewhere was
    # found dead by a pid that meant nothing here) and when it began (a pid is given again).
    # Rows written before: '' (judged by their host name and pid).
    7: """
    ALTER TABLE workers ADD COLUMN process TEXT NOT NULL DEFAULT '';
    """,
    # The replays of a run, read by a requeue (a dead letter a replay completed is not run
    # again): without it, each requeue read every run (999 requeues took 80 s at 90,000 runs).
    # Few runs are replays: only theirs are in it.
    8: """
    CREATE INDEX runs_replay_of ON runs (replay_of) WHERE replay_of IS NOT NULL;
    """,
    # A worker that drains (SIGTERM) says so from its first moment (see the SQLite schema).
    9: """
    ALTER TABLE workers ADD COLUMN stopping_at DOUBLE PRECISION;
    """,
    # The jobs a concurrency key holds back, in claim order (see the SQLite schema).
    10: """
    CREATE INDEX jobs_gated ON jobs (queue, (meta->'gate'->>'key'), priority DESC, seq)
        WHERE state = 'delayed' AND meta->'gate'->>'gate' = 'concurrency';
    """,
    # A claim's search: the waiting jobs in claim order, the delayed ones by their time (see
    # the SQLite schema).
    11: """
    DROP INDEX jobs_ready;
    CREATE INDEX jobs_ready ON jobs (queue, priority DESC, seq) WHERE state = 'waiting';
    CREATE INDEX jobs_due_at ON jobs (queue, run_at) WHERE state = 'delayed';
    """,
}


class SchemaError(RuntimeError):
    """The database cannot be used as it is (written by a newer blok-tui, not a blok
    database); the message is one line for the user."""


async def installed_version(conn: asyncpg.Connection) -> int | None:
    """The schema version of the database, None if blok was never installed there."""
    known = await conn.fetchval("SELECT to_regclass($1)", f"{SCHEMA}.schema_version")
    if known is None:
        return None
    return int(
        await conn.fetchval(f"SELECT coalesce(max(version), 0) FROM {SCHEMA}.schema_version")
    )


async def migrate(conn: asyncpg.Connection, *, create: bool = True) -> int:
    """Bring the database to SCHEMA_VERSION and return it. Safe to call from every process at
    start: the advisory lock makes the others wait, and they then find nothing left to do.
    `create=False`: refuse a database where blok was never installed."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        current = await installed_version(conn)
        if current is None:
            if not create:
                raise SchemaError(
                    f"not a blok database (no {SCHEMA!r} schema in it; "
                    "start a worker on it first: blok-tui worker --db URL)"
                )
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
            await conn.execute(
                f"CREATE TABLE {SCHEMA}.schema_version (version INTEGER PRIMARY KEY,"
                " applied_at DOUBLE PRECISION NOT NULL DEFAULT extract(epoch FROM now()))"
            )
            current = 0
        if current > SCHEMA_VERSION:
            raise SchemaError(
                f"written by a newer blok-tui (schema {current}, this "
                f"one knows {SCHEMA_VERSION}); upgrade blok-tui"
            )
        if current < SCHEMA_VERSION:
            await conn.execute(f"SET LOCAL search_path = {SCHEMA}")
            for version in range(current + 1, SCHEMA_VERSION + 1):
                await conn.execute(MIGRATIONS[version])
                await conn.execute("INSERT INTO schema_version (version) VALUES ($1)", version)
    return SCHEMA_VERSION
