"""The PostgreSQL backend's statements, with `$n` placeholders (the server's own).

Nothing here runs anything: these are the statements the backend sends, kept in one place so
that tests can run each against a real server. Rows are the tuples of `backends/rows.py`, in its
column order. Every time that decides who holds what is the server's (`NOW`), never a worker's.

Fencing: a claim gives its worker the job's `epoch`; every later write of that job or of its run,
steps, attempts and log lines names it and lands only while it is still the job's epoch. A claim,
a settle or any other change of the job's state adds one, so a worker that lost its lease (frozen
past it, cut off from the server) writes nothing once it wakes up.
"""

from __future__ import annotations

from .. import rows
from ..held_for import HELD_FOR
from ..rows import ATTEMPT_COLUMNS, JOB_COLUMNS, RUN_COLUMNS, STEP_COLUMNS

# The server's time in epoch seconds. `now()` is the transaction's start: stable within a
# statement, so the planner can use it against an index.
NOW = "extract(epoch FROM now())::double precision"
# The server's time as the statement runs, not as its transaction began: for a moment read
# after a lock was waited for (a rate or debounce window's).
CLOCK = "extract(epoch FROM clock_timestamp())::double precision"

# ---- NOTIFY channels -----------------------------------------------------------------------
# A notification is a wake-up; the listener then queries. PostgreSQL folds identical
# notifications of one transaction into one: a batch of 5,000 enqueues to one queue wakes each
# listener once.
JOBS_CHANNEL = "blok_jobs"  # payload: a queue that has jobs due (or newly delayed)
SIGNALS_CHANNEL = "blok_signals"  # payload: the worker holding a job an operator signalled
RUNS_CHANNEL = "blok_runs"  # payload: the writing transaction's xid (the change feed moved)
SHARED_CHANNEL = "blok_changes"  # payload: what moved (a batch of other writes, a claim)
CHANNELS = (JOBS_CHANNEL, SIGNALS_CHANNEL, RUNS_CHANNEL, SHARED_CHANNEL)


def _announced(channel: str) -> str:
    """The FROM of a statement whose `x` is its transaction's id, announced on `channel`."""
    return (
        " FROM (SELECT pg_current_xact_id()::text::bigint AS x) AS t,"
        f" LATERAL (SELECT pg_notify({channel}, x::text)) AS n"
    )


# The writer's last statement before COMMIT: the transaction's id (if the connection drops
# during the COMMIT, `pg_xact_status` on a new one says whether it happened) and the batch's
# announcement on $1 (the xid as payload: the feed's readers learn which transaction to wait
# for).
ANNOUNCE = "SELECT x" + _announced("$1")
_ANNOUNCED_RUNS = _announced(f"'{RUNS_CHANNEL}'")  # a batch with runs: the feed's channel

# ---- column types ----------------------------------------------------------------------------
# The types cast the placeholders of the fenced upserts (UPSERT_RUN, UPSERT_STEP, UPSERT_ATTEMPT):
# in `INSERT … SELECT` the server cannot type a parameter from its target column. By column of
# runs, steps and attempts (the bulk statements take rows of the schema's types instead).
_TYPES: dict[str, str] = {
    **dict.fromkeys(
        (
            "id",
            "workflow_name",
            "workflow_version",
            "queue",
            "job_id",
            "status",
            "error",
            "error_step",
            "replay_of",
            "replay_from_step",
            "parent_run_id",
            "worker",
            "run_id",
            "name",
            "kind",
            "cached_from",
            "child_run_id",
            "error_type",
            "traceback",
        ),
        "text",
    ),
    # A run's `state` is the workflow's data.
    **dict.fromkeys(("input", "headers", "output", "cursor", "state", "tags"), "json"),
    **dict.fromkeys(
        (
            "priority",
            "job_attempt",
            "depth",
            "attempts",
            "failed_attempts",
            "idx",
            "max_attempts",
            "timed_out",
            "parent",
            "step_idx",
            "number",
        ),
        "integer",
    ),
    **dict.fromkeys(
        ("created_at", "started_at", "finished_at", "run_at", "wait_until"),
        "double precision",
    ),
    "backoff_ms": "bigint",
}


def _fenced_upsert(table: str, columns: tuple[str, ...], key: tuple[str, ...]) -> str:
    """`INSERT … SELECT <row> WHERE <fence> ON CONFLICT (key) DO UPDATE` for `table`: the two
    parameters after the row are the job id and the epoch its writer holds, NULL for none.

    The epoch is read FOR SHARE: a claim taking the job over at this moment (its UPDATE holds
    the row) makes the write wait for it and then see the new epoch, so a stale write cannot
    slip in before the takeover commits; and a takeover waits for a write in flight."""
    n = len(columns)
    values = ", ".join(f"${i}::{_TYPES[c]}" for i, c in enumerate(columns, start=1))
    updates = [f"{c} = excluded.{c}" for c in columns if c not in key]
    if table == "runs":
        updates.append("xid = excluded.xid")
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) SELECT {values}"
        f" WHERE ${n + 1}::text IS NULL"
        f" OR (SELECT epoch FROM jobs WHERE id = ${n + 1} FOR SHARE) = ${n + 2}::bigint"
        f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {', '.join(updates)}"
    )


# ---- run records (fenced) ------------------------------------------------------------------
UPSERT_RUN = _fenced_upsert("runs", RUN_COLUMNS, ("id",))
UPSERT_STEP = _fenced_upsert("steps", STEP_COLUMNS, ("run_id", "idx"))
UPSERT_ATTEMPT = _fenced_upsert("attempts", ATTEMPT_COLUMNS, ("run_id", "step_idx", "number"))


def _fenced_bulk(
    table: str, columns: tuple[str, ...], key: tuple[str, ...], param: int, rows: str
) -> tuple[str, int]:
    """The rows of `table` as parameter `param`, an array of type `rows` (its columns, then the
    fence's job id and epoch: schema 5); a row lands only while its fence holds (see
    WRITE_RUNS). (The statement and the next free placeholder.)"""
    updates = [f"{c} = excluded.{c}" for c in columns if c not in key]
    if table == "runs":
        updates.append("xid = excluded.xid")
    statement = (
        f"INSERT INTO {table} ({', '.join(columns)})"
        f" SELECT {', '.join(f'u.{c}' for c in columns)} FROM unnest(${param}::{rows}[]) AS u"
        " WHERE u.fence_job IS NULL OR EXISTS (SELECT 1 FROM fences AS f"
        " WHERE f.id = u.fence_job AND f.epoch = u.fence_epoch)"
        f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {', '.join(updates)}"
    )
    return statement, param + 1


def _fenced_runs() -> tuple[str, int]:
    """The `WITH` of WRITE_RUNS and WRITE_BATCH: the fenced jobs' epochs ($1, see WRITE_RUNS),
    then the runs, steps and attempts ($2, $3, $4); and the next free placeholder."""
    runs, n = _fenced_bulk("runs", RUN_COLUMNS, ("id",), 2, "fenced_run")
    steps, n = _fenced_bulk("steps", STEP_COLUMNS, ("run_id", "idx"), n, "fenced_step")
    attempts, n = _fenced_bulk(
        "attempts", ATTEMPT_COLUMNS, ("run_id", "step_idx", "number"), n, "fenced_attempt"
    )
    return (
        "WITH fences AS (SELECT id, epoch FROM jobs WHERE id = ANY($1::text[])"
        " ORDER BY id FOR SHARE),"
        f" r AS ({runs}), s AS ({steps}), a AS ({attempts})"
    ), n


def _write_runs_and_announce() -> str:
    ctes, _ = _fenced_runs()
    return f"{ctes} SELECT x{_ANNOUNCED_RUNS}"


# A batch's runs, steps and attempts in one statement (one round trip, whatever their number),
# each row fenced, and the batch's announcement (see ANNOUNCE); the transaction's id comes back.
# $1 the fenced jobs' ids; then the runs, the steps and the attempts, each an array of rows of
# the schema's types (`fenced_run`, `fenced_step`, `fenced_attempt`: a row's columns, then its
# fence's job id and epoch). The fenced jobs' epochs are read once, FOR SHARE and in id order (two
# writers lock rows in the same order): a claim taking a job over at this moment makes the
# write wait for it and then see the new epoch, so a stale write cannot slip in before the
# takeover commits; and a takeover waits for a write in flight.
WRITE_RUNS = _write_runs_and_announce()


def _mark(first: int) -> str:
    """The CTE `mark`: the writer (parameter `first`) marks its batch with the batch's number
    (`first + 1`), in the batch's own transaction (schema 6: `writer_marks`)."""
    return (
        f"mark AS (INSERT INTO writer_marks (writer, mark, at) VALUES (${first}::text,"
        f" ${first + 1}::bigint, {NOW}) ON CONFLICT (writer) DO UPDATE"
        " SET mark = excluded.mark, at = excluded.at)"
    )


def _write_batch(enqueue: bool = False) -> str:
    ctes, n = _fenced_runs()
    logs = (
        "INSERT INTO logs (run_id, step_idx, ts, level, message)"
        " SELECT g.run_id, g.step_idx, g.ts, g.level, g.message"
        f" FROM unnest(${n}::fenced_log[])"
        " WITH ORDINALITY AS g(run_id, step_idx, ts, level, message, fence_job, fence_epoch, o)"
        " WHERE g.fence_job IS NULL OR EXISTS (SELECT 1 FROM fences AS f"
        " WHERE f.id = g.fence_job AND f.epoch = g.fence_epoch)"
        " ORDER BY g.o"
    )
    jobs = _update_jobs(n + 1, gate=" AND (SELECT count(*) FROM fences) >= 0")
    added = f", {_enqueue_ctes(n + 2)}" if enqueue else ""
    mark = _mark(n + 4 if enqueue else n + 2)
    return (
        f"{ctes}, l AS ({logs}), {jobs}{added}, {mark}"
        f" SELECT x, settled.ids, settled.epochs{_ADDED if enqueue else ''}"
        f"{_ANNOUNCED_RUNS},"
        f" LATERAL ({SETTLED}) AS settled"
    )


# $1 run, $2 step index, $3 time, $4 level, $5 message, $6 job id or NULL, $7 epoch.
INSERT_LOG = (
    "INSERT INTO logs (run_id, step_idx, ts, level, message)"
    " SELECT $1::text, $2::integer, $3::double precision, $4::text, $5::text"
    " WHERE $6::text IS NULL OR (SELECT epoch FROM jobs WHERE id = $6 FOR SHARE) = $7::bigint"
)
SELECT_RUN = f"SELECT {', '.join(RUN_COLUMNS)} FROM runs"


def _children(run_id: str, when: str = "TRUE") -> str:
    """The steps, their attempts and the log lines of the run `run_id` (an SQL expression),
    each as an array of rows (`step_rows`, `attempt_rows`, `log_rows`); empty unless `when`."""
    return (
        f" ARRAY(SELECT s FROM steps s WHERE s.run_id = {run_id} AND {when} ORDER BY s.idx)"
        " AS step_rows,"
        f" ARRAY(SELECT a FROM attempts a WHERE a.run_id = {run_id} AND {when}"
        " ORDER BY a.step_idx, a.number) AS attempt_rows,"
        f" ARRAY(SELECT (l.step_idx, l.ts, l.level, l.message) FROM logs l"
        f" WHERE l.run_id = {run_id} AND {when} ORDER BY l.id) AS log_rows"
    )


# $1 run id: the run with its steps, their attempts and its log lines, in one statement (one
# round trip, and one snapshot, where a statement each took four).
SELECT_WHOLE_RUN = f"SELECT {', '.join(RUN_COLUMNS)},{_children('runs.id')} FROM runs WHERE id = $1"
# $1 job id, $2 the ended job states: the job and, if it is in one of them, its run as a row
# (`run_row`) with the rest of it: what a `wait_for_job` reads, in one statement.
_ENDED = "jobs.state = ANY($2::text[])"
SELECT_JOB_AND_RUN = (
    f"SELECT {', '.join(JOB_COLUMNS)},"
    f" (SELECT r FROM runs r WHERE r.id = jobs.run_id AND {_ENDED}) AS run_row,"
    f"{_children('jobs.run_id', _ENDED)} FROM jobs WHERE id = $1"
)

# ---- jobs ------------------------------------------------------------------------------------
SELECT_JOB = f"SELECT {', '.join(JOB_COLUMNS)} FROM jobs"


def _enqueue_ctes(first: int) -> str:
    """The CTEs `added` (the new jobs, parameter `first`, an array of `new_job`) and
    `runs_added` (then their runs', parameter `first + 1`, of `new_run`: those of the jobs
    added)."""
    return (
        f"added AS (INSERT INTO jobs ({', '.join(JOB_COLUMNS)})"
        f" SELECT * FROM unnest(${first}::new_job[])"
        " ON CONFLICT (id) DO NOTHING RETURNING id, queue),"
        f" runs_added AS (INSERT INTO runs ({', '.join(RUN_COLUMNS)})"
        f" SELECT * FROM unnest(${first + 1}::new_run[]) AS u"
        " WHERE u.job_id IN (SELECT id FROM added) ON CONFLICT (id) DO NOTHING)"
    )


# New jobs and their first runs in bulk, one statement (one round trip, whatever
# their number): the jobs in order (their `seq` follows it), then the runs of those added (a job
# whose id is known already is not added again, nor its run). The ids of the jobs added come
# back, and their queues are notified (once per queue: identical notifications fold).
# $1 the jobs (an array of `new_job`), $2 their runs (of `new_run`).
ENQUEUE = f"WITH {_enqueue_ctes(1)} SELECT id, pg_notify('{JOBS_CHANNEL}', queue)::text FROM added"
# What an ENQUEUE folded into a batch's statement returns besides: the ids of the jobs added,
# and how many were notified on their queues' channel (`_enqueue_ctes`' `added`).
_ADDED = (
    ", ARRAY(SELECT id FROM added) AS added,"
    f" (SELECT count(pg_notify('{JOBS_CHANNEL}', queue)) FROM added) AS told"
)

# $1 queue: seconds until something of the queue may become claimable without anyone saying so
# (a delayed job falls due, a lease runs out); NULL if nothing will. A claim returns it with
# its rows too (the statement's snapshot: not the jobs it claims), for when it took all there
# was (see PostgresQueue.claim).
NEXT_DUE = f"""
SELECT least(
    (SELECT min(run_at) FROM jobs WHERE queue = $1 AND state = 'delayed' AND run_at > {NOW}),
    (SELECT min(lease_until) FROM jobs WHERE queue = $1 AND state = 'active')
) - {NOW}"""

# $1 queue, $2 how many, $3 the claiming worker, $4 lease seconds, $5 how many of them go
# straight to worker slots (`handed`, in that order; the rest are kept ahead).
# The waiting jobs are searched in claim order (`jobs_ready`), the delayed ones by their time,
# up to now (`jobs_due_at`): searched together in claim order, a claim walked every delayed
# job of the queue (130 ms a claim with 100,000 scheduled a month ahead). The due delayed ones
# are taken earliest first, in the index's order: so the planner takes that index even on a
# table it has no statistics of yet (ordered by priority, it read the queue's jobs by state).
# All the candidates are then taken by priority.
# One statement takes due jobs and jobs whose lease expired (their worker stopped renewing: it
# died or froze) in one order, highest priority then oldest, so there is no separate reaper to
# get wrong. SKIP LOCKED: claimers pass over each other's rows instead of queueing behind them.
# Each claimed job's epoch moves on and its signals are cleared; `taken_from` names the worker
# whose lease was taken over (NULL for a fresh claim): its run is to be recorded crashed, and
# `taken_handed` whether that worker had been handed the job (its run may have begun unrecorded).
# RETURNING has no order: the caller sorts by (priority DESC, seq). A job this worker held
# back for another it passes over a while (`held_for.py`).
_CLAIM = f"""
WITH due AS (
    SELECT seq, priority, 0 AS handed FROM jobs
    WHERE queue = $1 AND state = 'waiting' AND (run_at IS NULL OR run_at <= {NOW})
        {{forced}}
    ORDER BY priority DESC, seq
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), due_delayed AS (
    SELECT seq, priority, 0 AS handed FROM jobs
    WHERE queue = $1 AND state = 'delayed' AND run_at <= {NOW}
        AND NOT coalesce((meta->'{HELD_FOR}'->>'until')::double precision > {NOW}
            AND meta->'{HELD_FOR}'->'not' ? $3, false)
        {{forced}}
    ORDER BY run_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), expired AS (
    SELECT seq, priority, handed FROM jobs
    WHERE queue = $1 AND state = 'active' AND lease_until < {NOW}
    ORDER BY priority DESC, seq
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT seq, handed AS was_handed,
        (row_number() OVER (ORDER BY priority DESC, seq) <= $5)::int AS handing
    FROM (
        SELECT * FROM due UNION ALL SELECT * FROM due_delayed UNION ALL SELECT * FROM expired
    ) AS candidates
    ORDER BY priority DESC, seq
    LIMIT $2
), claimed AS (
    UPDATE jobs SET taken_from = CASE WHEN jobs.state = 'active' THEN jobs.worker END,
        state = 'active', worker = $3, lease_until = {NOW} + $4, attempts = jobs.attempts + 1,
        epoch = jobs.epoch + 1, signals = NULL, handed = picked.handing
    FROM picked WHERE jobs.seq = picked.seq
    RETURNING {", ".join(f"jobs.{c}" for c in JOB_COLUMNS)}, jobs.seq, jobs.taken_from,
        jobs.taken_from IS NOT NULL AND picked.was_handed = 1 AS taken_handed
)
SELECT claimed.*, pg_notify('{SHARED_CHANNEL}', 'claim')::text AS notified,
    ({{next_due}}) AS next_due
FROM claimed
"""
# A queue paused by another process gives only forced jobs even before this worker hears of
# the pause: the pause is a row the claim reads, so a job enqueued after `pause` returned waits.
CLAIM = _CLAIM.format(
    forced="AND (forced = 1 OR NOT EXISTS (SELECT 1 FROM paused_queues WHERE queue = $1))",
    next_due=NEXT_DUE,
)
CLAIM_FORCED = _CLAIM.format(forced="AND forced = 1", next_due=NEXT_DUE)

# A job's next state (a JobUpdate other than the holder's own): $1 state, $2 run id or NULL
# (unchanged), $3 run_at, $4 resume, $5 error, $6 meta or NULL (unchanged), $7 fresh budget,
# $8 forced, $9 headers or NULL (unchanged), $10 job id, $11 the epoch it must be at. A waiting
# job whose run_at is ahead of the server's clock is delayed. The queue comes back (a row: it
# was applied), and a queue with a job due now or later is notified.
UPDATE_JOB = f"""
WITH updated AS (
    UPDATE jobs SET
        state = CASE WHEN $1::text IN ('waiting', 'delayed')
            THEN CASE WHEN $3::double precision > {NOW} THEN 'delayed' ELSE 'waiting' END
            ELSE $1::text END,
        run_id = coalesce($2::text, run_id), run_at = $3::double precision,
        resume = $4::integer, error = $5::text, meta = coalesce($6::jsonb, meta),
        attempts = CASE WHEN $7::boolean THEN 0 ELSE attempts END, forced = $8::integer,
        headers = coalesce($9::json, headers),
        finished_at = CASE WHEN $1::text IN ('waiting', 'delayed') THEN NULL ELSE {NOW} END,
        worker = NULL, lease_until = NULL, signals = NULL, taken_from = NULL, handed = 0,
        epoch = epoch + 1
    WHERE id = $10::text AND epoch = $11::bigint
    RETURNING queue, state
)
SELECT queue, CASE WHEN state IN ('waiting', 'delayed')
    THEN pg_notify('{JOBS_CHANNEL}', queue)::text END AS notified
FROM updated
"""


def _update_jobs(first: int, gate: str = "") -> str:
    """The CTEs `u` (UPDATE_JOB's parameters, a row of `job_settle` each, parameter `first`),
    `updated` (the jobs moved on, each with the epoch it was fenced at; `gate`: a
    further condition) and `notified` (the queues with a job due now or later, notified once
    each)."""
    return (
        f"u AS (SELECT * FROM unnest(${first}::job_settle[])),"
        " updated AS (UPDATE jobs SET"
        " state = CASE WHEN u.state IN ('waiting', 'delayed')"
        f" THEN CASE WHEN u.run_at > {NOW} THEN 'delayed' ELSE 'waiting' END ELSE u.state END,"
        " run_id = coalesce(u.run_id, jobs.run_id), run_at = u.run_at, resume = u.resume,"
        " error = u.error, meta = coalesce(u.meta, jobs.meta),"
        " attempts = CASE WHEN u.fresh THEN 0 ELSE jobs.attempts END, forced = u.forced,"
        " headers = coalesce(u.headers, jobs.headers),"
        f" finished_at = CASE WHEN u.state IN ('waiting', 'delayed') THEN NULL ELSE {NOW} END,"
        " worker = NULL, lease_until = NULL, signals = NULL, taken_from = NULL, handed = 0,"
        " epoch = jobs.epoch + 1"
        f" FROM u WHERE jobs.id = u.id AND jobs.epoch = u.epoch{gate}"
        " RETURNING jobs.queue, jobs.state, jobs.id, u.epoch AS fenced),"
        f" notified AS (SELECT DISTINCT queue, pg_notify('{JOBS_CHANNEL}', queue)::text"
        " FROM updated WHERE state IN ('waiting', 'delayed'))"
    )


# The jobs a bulk update moved on, as (ids, the epochs they were fenced at): whoever waits on
# one of the settles is told whether it landed (PostgresDatabase.write's `landed`). The
# notifications are counted so that they are sent (a CTE nobody reads is not run).
SETTLED = (
    "SELECT array_agg(id) AS ids, array_agg(fenced) AS epochs,"
    " (SELECT count(*) FROM notified) AS notified FROM updated"
)
# UPDATE_JOB for many jobs in one statement, its parameters as $1, an array of `job_settle`
# rows (each job once); the queues with a job due now or later are notified. SETTLED comes back.
UPDATE_JOBS = f"WITH {_update_jobs(1)} {SETTLED}"
# The holder's own update while it keeps the job (a new run after a takeover, or the record of
# a run it stopped): $1 run id or NULL, $2 meta or NULL, $3 job id, $4 epoch. Epoch, worker and
# lease stay. The run's record is the holder's own from then on: no longer `handed`.
UPDATE_HELD = (
    "UPDATE jobs SET run_id = coalesce($1::text, run_id), meta = coalesce($2::jsonb, meta),"
    " handed = 0 WHERE id = $3::text AND epoch = $4::bigint RETURNING queue"
)
# $1 job id, $2 epoch: a transition that only writes runs still needs the job at its epoch.
HOLDS = "SELECT 1 FROM jobs WHERE id = $1 AND epoch = $2 FOR SHARE"

# $1 worker, $2 lease seconds. What the worker still holds, each job's epoch and signals: a job
# missing from the answer, or at another epoch, is no longer its.
# Not a lease that ran out: the job is no longer this worker's, whether or not another took it
# yet (see the SQLite queue's renew).
RENEW = (
    f"UPDATE jobs SET lease_until = {NOW} + $2 WHERE worker = $1 AND state = 'active'"
    f" AND lease_until > {NOW} AND (id, epoch) NOT IN (SELECT * FROM"
    " unnest($3::text[], $4::bigint[])) RETURNING id, epoch, signals"
)
# $1 signal name, $2 job id, $3 epoch. A held job is asked, not taken: its holder is notified
# and carries the request out with its own fenced writes. The epoch stays.
SIGNAL = f"""
WITH signalled AS (
    UPDATE jobs SET signals = coalesce(signals, '{{}}'::jsonb) || jsonb_build_object($1::text, {NOW})
    WHERE id = $2 AND epoch = $3 AND state = 'active'
    RETURNING worker
)
SELECT pg_notify('{SIGNALS_CHANNEL}', worker)::text FROM signalled
"""
SIGNALS_FOR = (
    "SELECT id, signals FROM jobs WHERE worker = $1 AND state = 'active' AND signals IS NOT NULL"
)
HELD_BY = f"{SELECT_JOB} WHERE state = 'active' AND worker = ANY($1::text[])"
OLDEST_WAITING = rows.OLDEST_WAITING.format(greatest="greatest", now=NOW, queue="$1")
STATS = rows.STATS.format(unstarted=rows.UNSTARTED_RUN, now=NOW, queue="$1")
DEAD_LETTERS = (
    f"{SELECT_JOB} WHERE queue = $1 AND state = 'dead' ORDER BY finished_at DESC LIMIT $2"
)
# The concurrency gate's held jobs of a key, read from their own index (`jobs_gated`).
GATED = (
    f"{SELECT_JOB} WHERE queue = $1 AND state = 'delayed'"
    " AND meta->'gate'->>'gate' = 'concurrency' AND meta->'gate'->>'key' = $2"
    " ORDER BY priority DESC, seq LIMIT $3"
)
PURGE_JOBS = (
    "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE state IN ('completed', 'failed',"
    " 'cancelled') AND finished_at < $1 LIMIT $2)"
)

# ---- shared state ----------------------------------------------------------------------------
# A heartbeat is the server's moment, and its age is read on the server's clock (WORKERS): by
# the worker's own, a machine whose clock ran behind looked long dead to the others, and
# recovery took the jobs it was running.
HEARTBEAT = (
    "INSERT INTO workers (id, host, pid, started_at, heartbeat_at, process, stopping_at)"
    f" VALUES ($1, $2, $3, $4, {NOW}, $5, $6)"
    " ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid,"
    " started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at,"
    " process = excluded.process, stopping_at = excluded.stopping_at"
)
WORKERS = f"SELECT *, {NOW} - heartbeat_at AS heartbeat_age FROM workers ORDER BY started_at"
PUBLISH_CATALOG = (
    "INSERT INTO worker_catalog (worker, queues, workflows, reload_errors, updated_at)"
    " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (worker) DO UPDATE SET queues = excluded.queues,"
    " workflows = excluded.workflows, reload_errors = excluded.reload_errors,"
    " updated_at = excluded.updated_at"
)
# $1 the workflow names, $2 the queue names a running worker declares: the catalogs of stopped
# workers that declared one of them are superseded (a rolling restart, a renamed queue); those
# of other pools stay, for producers to enqueue to queues whose workers are down for now.
FORGET_CATALOGS = """
DELETE FROM worker_catalog c WHERE c.worker NOT IN (SELECT id FROM workers)
AND (EXISTS (SELECT 1 FROM json_array_elements(c.workflows) w WHERE w->>'name' = ANY($1::text[]))
  OR EXISTS (SELECT 1 FROM json_array_elements(c.queues) q WHERE q->>'name' = ANY($2::text[])))
"""

# $1 chore, $2 worker, $3 seconds. Takes the chore if it is free or its holder's lease ran
# out, renews it if this worker holds it; a row back means this worker leads until then.
ACQUIRE_LEADER = f"""
INSERT INTO leader_leases AS l (name, holder, until) VALUES ($1, $2, {NOW} + $3)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, until = excluded.until
WHERE l.holder = excluded.holder OR l.until < {NOW}
RETURNING until
"""
RELEASE_LEADER = "DELETE FROM leader_leases WHERE name = $1 AND holder = $2"

# Concurrency slots and debounce windows are read-decide-write: the transaction first takes an
# advisory lock on the (workflow, key) it decides for, held until it commits, so two processes
# never decide on the same slots or window at once. The lock's second key keeps slots and
# windows apart.
SLOTS_LOCK = "SELECT pg_advisory_xact_lock(hashtext($1 || chr(31) || $2), 1)"
WINDOW_LOCK = "SELECT pg_advisory_xact_lock(hashtext($1 || chr(31) || $2 || chr(31) || $3), 2)"
# A rate-limit window (scope, key) is read-decide-write the same way: $1 scope, $2 key.
RATE_LOCK = "SELECT pg_advisory_xact_lock(hashtext($1 || chr(31) || $2), 4)"
# A debounce window (NULLs: none) and the server's clock, read after the window's lock: a
# machine whose clock runs ahead found an open window closed and ran a burst's job again.
READ_WINDOW = (
    f"SELECT {CLOCK} AS now, w.run_id, w.job_id, w.created_at, w.opened_at, w.until"
    " FROM (SELECT 1) AS one"
    " LEFT JOIN debounce_windows w ON w.workflow = $1 AND w.key = $2 AND w.mode = $3"
)
# What the caller's clock ($1) says is over, and the server's too.
CLOSE_LEADING_WINDOWS = (
    f"DELETE FROM debounce_windows WHERE mode = 'leading' AND until < least($1, {NOW})"
)
FORGET_STARTS = f"DELETE FROM rate_starts WHERE until < least($1, {NOW})"
# A rate window's moment (the server's clock as the statement runs, $3 if given), with the
# window's starts that have left it by then dropped; one round trip.
RATE_OPEN = (
    f"WITH at AS MATERIALIZED (SELECT coalesce($3::double precision, {CLOCK}) AS t),"
    " gone AS (DELETE FROM rate_starts WHERE scope = $1 AND key = $2"
    " AND until <= (SELECT t FROM at))"
    " SELECT t FROM at"
)

# ---- event mailboxes -------------------------------------------------------------------------
# What a run's mailbox holds and whether the run waits are read and written with the run's row
# locked (RUN_LOCK): a sender and the run's wait step go one after the other, so the sender
# either sees the waiter or the wait finds the message (under READ COMMITTED each statement
# after the lock reads what the other committed). Delivery by key has no run to lock until it
# has read the waiters: a send by key and a wait on a key both take EVENT_LOCK, on the event's
# name, first (then the run's row: always in that order), or each could miss the other.
RUN_LOCK = "SELECT status FROM runs WHERE id = $1 FOR UPDATE"
EVENT_LOCK = "SELECT pg_advisory_xact_lock(hashtext($1), 3)"
EVENT_COLUMNS = "id, run_id, event, payload::text, sent_at, taken_by, taken_at"
# $1 run ids (NULL: none), $2 event, $3 payload, $4 sent at: one message per run id, in order.
POST_EVENTS = """
INSERT INTO events (run_id, event, payload, sent_at)
SELECT u.run_id, $2::text, $3::json, $4::double precision
FROM unnest($1::text[]) WITH ORDINALITY AS u(run_id, o) ORDER BY u.o
RETURNING id, run_id
"""
# $1 event: the runs waiting on a key for it, that have not ended ($2 the terminal statuses).
KEY_WAITERS = """
SELECT w.run_id, w.key, w.path::text FROM event_waiters AS w JOIN runs AS r ON r.id = w.run_id
WHERE w.event = $1 AND w.path IS NOT NULL AND w.key IS NOT NULL AND r.status <> ALL($2::text[])
ORDER BY w.run_id
"""
# $1 run, $2 step, $3 event, $4 key, $5 path: the run's waiter, replacing the one it had.
REGISTER_WAITER = """
INSERT INTO event_waiters (run_id, step, event, key, path) VALUES ($1, $2, $3, $4, $5::json)
ON CONFLICT (run_id) DO UPDATE SET step = excluded.step, event = excluded.event,
    key = excluded.key, path = excluded.path
"""

# ---- schedules -------------------------------------------------------------------------------
# In the order memory and SQLite give them: by code point, whatever the database's collation.
SELECT_SCHEDULES = """
SELECT workflow, schedule, spec::text, last_tick, paused, last_fired_at, last_job_id,
    last_run_id
FROM schedules ORDER BY workflow COLLATE "C", schedule COLLATE "C"
"""
# $1 workflow, $2 schedule, $3 spec, $4 first tick: a new schedule starts at its first tick; a
# known one takes the new spec and keeps its state.
DECLARE_SCHEDULE = """
INSERT INTO schedules (workflow, schedule, spec, last_tick) VALUES ($1, $2, $3::json, $4)
ON CONFLICT (workflow, schedule) DO UPDATE SET spec = excluded.spec
"""
# $1 workflow, $2 schedule, $3 tick, $4 job id (NULL: the tick is skipped), $5 run id, $6 now.
# The claim of a tick is this one conditional UPDATE: of claimers racing for the same tick, the
# first moves last_tick to it and the others, who waited on its row lock, find the condition
# no longer holds (READ COMMITTED reads the row again after the wait). A row back: claimed.
CLAIM_TICK = """
UPDATE schedules SET last_tick = $3,
    last_job_id = coalesce($4::text, last_job_id),
    last_run_id = CASE WHEN $4::text IS NULL THEN last_run_id ELSE $5::text END,
    last_fired_at = CASE WHEN $4::text IS NULL THEN last_fired_at ELSE $6 END
WHERE workflow = $1 AND schedule = $2 AND paused = 0 AND last_tick < $3
RETURNING 1
"""
# $1 workflow, $2 schedule, $3 paused, $4 the tick to resume from or NULL (greatest() skips it).
PAUSE_SCHEDULE = """
UPDATE schedules SET paused = $3, last_tick = greatest(last_tick, $4::double precision)
WHERE workflow = $1 AND schedule = $2
RETURNING 1
"""

# ---- the change feed -------------------------------------------------------------------------
# Every transaction of this database below the horizon has ended: a row it wrote is visible
# now, and no later commit can land below it. A reader that takes the rows between its last
# horizon and this one misses nothing and reads each change once (a row rewritten since shows
# again, once).
#
# Transaction ids are the server's: a snapshot lists as running every transaction that has
# written anywhere on the server, so its xmin (the horizon until 2026-12-04) stood still for as
# long as a write stayed open in another database, and the feed with it. The horizon is the
# oldest running transaction of this database (its sessions' `backend_xid`, its prepared
# transactions), else the snapshot's xmax. The snapshot is read first, the sessions after, in
# statements of their own (each its own transaction: pg_stat_activity is read afresh): a
# transaction running at the snapshot is then either still running at the second read, and
# found there, or over, and its rows visible to the feed's reads after.
FEED_SNAPSHOT = (
    "SELECT pg_snapshot_xmax(s)::text::bigint AS xmax,"
    " ARRAY(SELECT pg_snapshot_xip(s)::text::bigint) AS running"
    " FROM pg_current_snapshot() AS s"
)
RUNNING_HERE = """
SELECT backend_xid::text::bigint FROM pg_stat_activity
WHERE datname = current_database() AND backend_xid IS NOT NULL
UNION ALL
SELECT transaction::text::bigint FROM pg_prepared_xacts WHERE database = current_database()
"""
XACT_STATUS = "SELECT pg_xact_status($1::bigint::text::xid8)"
# A session of the server, by pid and start (a pid alone may be another's by now).
SESSION = "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
# Ends that session if it is still there (it goes a moment later); whether it is gone, and
# its transaction with it (each statement reads the activity anew: autocommit).
END_SESSION = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2"
)
SESSION_GONE = (
    "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2)"
)
WRITER_MARK = "SELECT mark FROM writer_marks WHERE writer = $1"
FORGET_MARK = "DELETE FROM writer_marks WHERE writer = $1"
# Marks of writers gone a day (a writer looks its mark up within seconds of losing a session).
FORGET_OLD_MARKS = f"DELETE FROM writer_marks WHERE at < {NOW} - 86400"
FEED_RUNS = f"""
SELECT {", ".join(RUN_COLUMNS)}, xid FROM runs
WHERE xid >= $1 AND xid < $2 ORDER BY xid, created_at LIMIT $3
"""
FEED_RUNS_COUNT = "SELECT count(*) FROM runs WHERE xid >= $1 AND xid < $2"
FEED_LOGS = """
SELECT id, run_id, step_idx, level, message, xid FROM logs
WHERE xid >= $1 AND xid < $2 ORDER BY xid, id LIMIT $3
"""
FEED_LOGS_COUNT = "SELECT count(*) FROM logs WHERE xid >= $1 AND xid < $2"
# A new reader's cursor: past the newest run and log line below the horizon ($1). A cursor is
# the newest change read, not the horizon, so it moves only when this database changes: the
# horizon's xmax moves with every transaction on the server.
FEED_TOPS = (
    "SELECT (SELECT max(xid) FROM runs WHERE xid < $1) AS runs,"
    " (SELECT max(xid) FROM logs WHERE xid < $1) AS logs"
)

# The usual batch of a busy worker (runs, their log lines, the settles of their jobs) in one
# statement: WRITE_RUNS's parameters, then INSERT_LOG's (an array of `fenced_log`), then
# UPDATE_JOBS' (of `job_settle`), then the writer's mark (`_mark`: the writer, the batch's
# number); the transaction's id comes back, and SETTLED's ids and epochs.
# Serially, a run's rows and lines fenced at its job's epoch land before the job's settle moves
# the epoch on; here every part reads the epochs of `fences`, which are locked FOR SHARE before
# any job is updated (the settle's condition counts them first: a one-time filter), so the same
# holds in one statement. Only for batches of nothing else (the writer checks): another
# statement would have to come in its own order.
WRITE_BATCH = _write_batch()
# WRITE_BATCH and a batch's enqueues in one statement (the contract path's usual batch: the
# `enqueue` calls and the writes of the jobs that ran meanwhile): WRITE_BATCH's parameters but
# the mark's, ENQUEUE's (the enqueues' rows, in order), then the mark's; the ids of the jobs
# added come back too (`added`), and their queues are notified. Every part reads the
# statement's one snapshot, so the writer folds enqueues in only when no job is in two of them,
# no run of theirs is among the batch's runs and none of their jobs among the batch's jobs
# (`folds`).
WRITE_BATCH_ENQUEUE = _write_batch(enqueue=True)
# A batch of enqueues and nothing else: ENQUEUE that also announces the batch (ANNOUNCE on the
# runs' channel: its runs are new rows) and returns what WRITE_BATCH_ENQUEUE does; ENQUEUE's
# parameters, then the mark's.
ENQUEUE_ANNOUNCED = (
    f"WITH {_enqueue_ctes(1)}, {_mark(3)}"
    f" SELECT x, NULL::text[] AS ids, NULL::bigint[] AS epochs{_ADDED}"
    f"{_ANNOUNCED_RUNS}"
)
