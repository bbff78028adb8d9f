"""The SQLite schema: versioned migrations, applied in one transaction when a file is opened."""

from __future__ import annotations

SCHEMA_VERSION = 13

MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        workflow_name TEXT NOT NULL,
        workflow_version TEXT NOT NULL,
        queue TEXT NOT NULL,
        job_id TEXT NOT NULL,
        status TEXT NOT NULL,
        input TEXT,
        headers TEXT,
        output TEXT,
        error TEXT,
        error_step TEXT,
        priority INTEGER NOT NULL DEFAULT 0,
        job_attempt INTEGER NOT NULL DEFAULT 1,
        created_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        run_at REAL,
        wait_until REAL,
        replay_of TEXT,
        replay_from_step TEXT,
        parent_run_id TEXT,
        depth INTEGER NOT NULL DEFAULT 0,
        worker TEXT,
        cursor TEXT,
        state TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        failed_attempts INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX runs_created ON runs(created_at DESC);
    CREATE INDEX runs_status ON runs(status, created_at DESC);
    CREATE INDEX runs_workflow ON runs(workflow_name, created_at DESC);
    CREATE INDEX runs_queue ON runs(queue, created_at DESC);
    CREATE INDEX runs_job ON runs(job_id);
    CREATE INDEX runs_finished ON runs(finished_at) WHERE finished_at IS NOT NULL;
    CREATE INDEX runs_parent ON runs(parent_run_id) WHERE parent_run_id IS NOT NULL;

    CREATE TABLE steps (
        run_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        name TEXT NOT NULL,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        started_at REAL,
        finished_at REAL,
        input TEXT,
        output TEXT,
        error TEXT,
        max_attempts INTEGER NOT NULL,
        cached_from TEXT,
        wait_until REAL,
        timed_out INTEGER NOT NULL DEFAULT 0,
        tags TEXT,
        parent INTEGER,
        child_run_id TEXT,
        PRIMARY KEY (run_id, idx)
    ) WITHOUT ROWID;

    CREATE TABLE attempts (
        run_id TEXT NOT NULL,
        step_idx INTEGER NOT NULL,
        number INTEGER NOT NULL,
        status TEXT NOT NULL,
        started_at REAL NOT NULL,
        finished_at REAL,
        error TEXT,
        error_type TEXT,
        traceback TEXT,
        backoff_ms INTEGER,
        PRIMARY KEY (run_id, step_idx, number)
    ) WITHOUT ROWID;

    CREATE TABLE logs (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        step_idx INTEGER,
        ts REAL NOT NULL,
        level TEXT NOT NULL,
        message TEXT NOT NULL
    );
    CREATE INDEX logs_run ON logs(run_id, id);

    CREATE TABLE idempotency (
        workflow TEXT NOT NULL,
        step TEXT NOT NULL,
        key TEXT NOT NULL,
        output TEXT,
        run_id TEXT NOT NULL,
        expires_at REAL NOT NULL,
        PRIMARY KEY (workflow, step, key)
    ) WITHOUT ROWID;

    CREATE TABLE jobs (
        seq INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        queue TEXT NOT NULL,
        workflow_name TEXT NOT NULL,
        payload TEXT,
        headers TEXT,
        priority INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL,
        run_at REAL,
        attempts INTEGER NOT NULL DEFAULT 0,
        max_retries INTEGER NOT NULL DEFAULT 0,
        run_id TEXT NOT NULL,
        created_at REAL NOT NULL,
        finished_at REAL,
        error TEXT,
        worker TEXT,
        lease_until REAL,
        resume INTEGER NOT NULL DEFAULT 0,
        meta TEXT
    );
    CREATE INDEX jobs_ready ON jobs(queue, priority DESC, seq)
        WHERE state IN ('waiting', 'delayed');
    CREATE INDEX jobs_leases ON jobs(lease_until) WHERE state = 'active';
    CREATE INDEX jobs_state ON jobs(queue, state);
    CREATE INDEX jobs_run ON jobs(run_id);

    CREATE TABLE control (
        id INTEGER PRIMARY KEY,
        action TEXT NOT NULL,
        run_id TEXT,
        target TEXT,
        payload TEXT,
        created_at REAL NOT NULL,
        taken_by TEXT,
        result TEXT
    );

    CREATE INDEX control_open ON control(id) WHERE taken_by IS NULL;

    CREATE TABLE workers (
        id TEXT PRIMARY KEY,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        started_at REAL NOT NULL,
        heartbeat_at REAL NOT NULL
    );

    CREATE TABLE paused_queues (queue TEXT PRIMARY KEY);
    """,
    # Attach mode: `rev` orders run changes across processes (every write of a run row takes
    # max(rev) + 1 inside its transaction), so an attached console reads only what changed;
    # `worker_catalog` holds what each worker serves (queues, workflows, reload errors).
    2: """
    ALTER TABLE runs ADD COLUMN rev INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX runs_rev ON runs(rev);

    CREATE TABLE worker_catalog (
        worker TEXT PRIMARY KEY,
        queues TEXT NOT NULL,
        workflows TEXT NOT NULL,
        reload_errors TEXT NOT NULL,
        updated_at REAL NOT NULL
    );
    """,
    # Scheduling gates (engine/gates.py): concurrency-key slots, each under its worker's lease,
    # and the open debounce windows, so that both survive a restart and are shared between
    # processes on one file.
    3: """
    CREATE TABLE concurrency_slots (
        workflow TEXT NOT NULL,
        key TEXT NOT NULL,
        run_id TEXT NOT NULL,
        worker TEXT NOT NULL,
        lease_until REAL NOT NULL,
        PRIMARY KEY (workflow, key, run_id)
    ) WITHOUT ROWID;
    CREATE INDEX concurrency_slots_run ON concurrency_slots(run_id);
    CREATE INDEX concurrency_slots_worker ON concurrency_slots(worker);

    CREATE TABLE debounce_windows (
        workflow TEXT NOT NULL,
        key TEXT NOT NULL,
        mode TEXT NOT NULL,
        run_id TEXT NOT NULL,
        job_id TEXT NOT NULL,
        created_at REAL NOT NULL,
        opened_at REAL NOT NULL,
        until REAL NOT NULL,
        PRIMARY KEY (workflow, key)
    ) WITHOUT ROWID;
    """,
    # The backend seam (engine/backends): fencing tokens and operator signals on jobs, a
    # claim that takes over expired leases by queue, leader leases for cluster chores.
    # Operator actions are state writes now, so the control table goes.
    4: """
    ALTER TABLE jobs ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN signals TEXT;
    ALTER TABLE jobs ADD COLUMN forced INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN taken_from TEXT;
    DROP INDEX jobs_leases;
    CREATE INDEX jobs_active ON jobs(queue, lease_until) WHERE state = 'active';
    CREATE INDEX jobs_holder ON jobs(worker) WHERE state = 'active';
    CREATE INDEX jobs_finished ON jobs(finished_at)
        WHERE state IN ('completed', 'failed', 'cancelled');

    CREATE TABLE leader_leases (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        until REAL NOT NULL
    );

    DROP TABLE control;
    """,
    # Events, schedules, rate limits (issue 17): each run's mailbox and the waiters parked on
    # it; schedules with their last claimed tick (one row per schedule: a tick is claimed by
    # moving last_tick forward, once); the starts each rate-limit window counts.
    5: """
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT,
        event TEXT NOT NULL,
        payload TEXT,
        sent_at REAL NOT NULL,
        taken_by TEXT,
        taken_at REAL
    );
    CREATE INDEX events_run ON events(run_id, event);
    CREATE INDEX events_unaddressed ON events(event, id) WHERE run_id IS NULL;

    CREATE TABLE event_waiters (
        run_id TEXT PRIMARY KEY,
        step TEXT NOT NULL,
        event TEXT NOT NULL,
        key TEXT,
        path TEXT
    );
    CREATE INDEX event_waiters_event ON event_waiters(event);

    CREATE TABLE schedules (
        workflow TEXT NOT NULL,
        schedule TEXT NOT NULL,
        spec TEXT NOT NULL,
        last_tick REAL NOT NULL,
        paused INTEGER NOT NULL DEFAULT 0,
        last_fired_at REAL,
        last_job_id TEXT,
        last_run_id TEXT,
        PRIMARY KEY (workflow, schedule)
    ) WITHOUT ROWID;

    CREATE TABLE rate_starts (
        scope TEXT NOT NULL,
        key TEXT NOT NULL,
        run_id TEXT NOT NULL,
        started_at REAL NOT NULL,
        until REAL NOT NULL,
        PRIMARY KEY (scope, key, run_id)
    ) WITHOUT ROWID;
    CREATE INDEX rate_starts_until ON rate_starts(until);
    """,
    # A debounce window is one per (workflow, key, mode), as SharedState.update_window reads
    # it: keyed by (workflow, key) alone, writing one mode's window replaced the other's.
    6: """
    CREATE TABLE debounce_windows_by_mode (
        workflow TEXT NOT NULL,
        key TEXT NOT NULL,
        mode TEXT NOT NULL,
        run_id TEXT NOT NULL,
        job_id TEXT NOT NULL,
        created_at REAL NOT NULL,
        opened_at REAL NOT NULL,
        until REAL NOT NULL,
        PRIMARY KEY (workflow, key, mode)
    ) WITHOUT ROWID;
    INSERT INTO debounce_windows_by_mode
        SELECT workflow, key, mode, run_id, job_id, created_at, opened_at, until
        FROM debounce_windows;
    DROP TABLE debounce_windows;
    ALTER TABLE debounce_windows_by_mode RENAME TO debounce_windows;
    """,
    # `handed`: the claim that holds the job gave it straight to a worker slot, whose code may
    # run before the run's start is committed (that commit is not awaited). A worker that takes
    # the job over from an expired lease then records the run crashed even though its record
    # still says queued. A job a claim keeps ahead of its free slots is not handed (its start
    # is committed first), except a worker's top-up of short jobs (`claim_ahead`).
    7: """
    ALTER TABLE jobs ADD COLUMN handed INTEGER NOT NULL DEFAULT 0;
    """,
    # No query reads jobs by run id (a job's run is read through runs.job_id, `runs_job`), yet
    # every enqueue wrote an entry to `jobs_run` and every purge deleted it: one more b-tree
    # page in an enqueue's commit, for nothing.
    8: """
    DROP INDEX IF EXISTS jobs_run;
    """,
    # A worker's process as the kernel knows it (liveness.py): where its pid names it (a host
    # name is not enough: machines and containers share them, and a live worker elsewhere was
    # found dead by a pid that meant nothing here) and when it began (a pid is given again).
    # Rows written before: '' (judged by their host name and pid).
    9: """
    ALTER TABLE workers ADD COLUMN process TEXT NOT NULL DEFAULT '';
    """,
    # The replays of a run, read by a requeue (a dead letter a replay completed is not run
    # again): without it, each requeue read every run (999 requeues took 80 s at 90,000 runs).
    # Few runs are replays: only theirs are in it.
    10: """
    CREATE INDEX runs_replay_of ON runs (replay_of) WHERE replay_of IS NOT NULL;
    """,
    # A worker that drains (SIGTERM) says so from its first moment: it claims nothing more,
    # and an operator (health, the workers view) took it for one that served.
    11: """
    ALTER TABLE workers ADD COLUMN stopping_at REAL;
    """,
    # The jobs a concurrency key holds back, in the order a claim takes them (queue.py's
    # GATED, read at each end of a keyed run): without it, that read went through every
    # delayed job of the queue (30 ms a run's end with 100,000 scheduled for later). Only the
    # held jobs are in it; its expressions are GATED's, as SQLite needs to use it.
    12: """
    CREATE INDEX jobs_gated ON jobs
        (queue, json_extract(meta, '$.gate.key'), priority DESC, seq)
        WHERE state = 'delayed' AND json_extract(meta, '$.gate.gate') = 'concurrency';
    """,
    # A claim's search: the waiting jobs in claim order (`jobs_ready`, which held the delayed
    # ones too, so that a claim walked every job scheduled for later), and the delayed ones by
    # their time, up to now (`jobs_due_at`; also the queue's next due time).
    13: """
    DROP INDEX jobs_ready;
    CREATE INDEX jobs_ready ON jobs(queue, priority DESC, seq) WHERE state = 'waiting';
    CREATE INDEX jobs_due_at ON jobs(queue, run_at) WHERE state = 'delayed';
    """,
}
