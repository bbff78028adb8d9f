"""The PostgreSQL backend's key statements, with `$n` placeholders (the server's own).

Nothing here runs anything: these are the statements the backend sends, kept in one place so
that tests can run each against a real server. Every time that decides who holds what is the
server's (`NOW`), never a worker's clock.

Fencing: a claim gives its worker the job's `epoch`; every later write of that job or of its
run, steps and attempts names it and lands only while it is still the job's epoch. A claim, a
settle or any other change of the job's state adds one, so a worker that lost its lease (frozen
past it, cut off from the server) writes nothing once it wakes up.
"""

from __future__ import annotations

# The server's time in epoch seconds. `now()` is the transaction's start: stable within a
# statement, so the planner can use it against an index (`clock_timestamp()` is volatile,
# evaluated per row, and keeps `lease_until < …` off the index).
NOW = "extract(epoch FROM now())::double precision"

# ---- NOTIFY channels -----------------------------------------------------------------------
# Payloads are short: a notification is a wake-up, the reader then queries. PostgreSQL folds
# identical notifications of one transaction into one, so a batch of 500 enqueues to one queue
# wakes the listeners once.
JOBS_CHANNEL = "blok_jobs"  # payload: the queue that has new due jobs
SIGNALS_CHANNEL = "blok_signals"  # payload: the worker holding a job that was signalled
RUNS_CHANNEL = "blok_runs"  # payload: empty; the change feed has news (attached consoles)
NOTIFY = "SELECT pg_notify($1, $2)"

# ---- columns -------------------------------------------------------------------------------
# (name, type) in the order of the row tuples; the types cast the placeholders of statements
# whose parameters the server cannot type from a target column (`INSERT … SELECT`).
JOB_FIELDS: tuple[tuple[str, str], ...] = (
    ("id", "text"),
    ("queue", "text"),
    ("workflow_name", "text"),
    ("payload", "json"),
    ("headers", "json"),
    ("priority", "integer"),
    ("state", "text"),
    ("run_at", "double precision"),
    ("attempts", "integer"),
    ("max_retries", "integer"),
    ("run_id", "text"),
    ("created_at", "double precision"),
    ("finished_at", "double precision"),
    ("error", "text"),
    ("worker", "text"),
    ("lease_until", "double precision"),
    ("resume", "boolean"),
    ("meta", "jsonb"),
)
# What a claim and a read return: the stored fields, then the fencing columns.
JOB_COLUMNS = ", ".join(name for name, _ in JOB_FIELDS) + ", epoch, signal, taken_from, force, seq"

RUN_FIELDS: tuple[tuple[str, str], ...] = (
    ("id", "text"),
    ("workflow_name", "text"),
    ("workflow_version", "text"),
    ("queue", "text"),
    ("job_id", "text"),
    ("status", "text"),
    ("input", "json"),
    ("headers", "json"),
    ("output", "json"),
    ("error", "text"),
    ("error_step", "text"),
    ("priority", "integer"),
    ("job_attempt", "integer"),
    ("created_at", "double precision"),
    ("started_at", "double precision"),
    ("finished_at", "double precision"),
    ("run_at", "double precision"),
    ("wait_until", "double precision"),
    ("replay_of", "text"),
    ("replay_from_step", "text"),
    ("parent_run_id", "text"),
    ("depth", "integer"),
    ("worker", "text"),
    ("cursor", "json"),
    ("state", "json"),
    ("attempts", "integer"),
    ("failed_attempts", "integer"),
)
STEP_FIELDS: tuple[tuple[str, str], ...] = (
    ("run_id", "text"),
    ("idx", "integer"),
    ("name", "text"),
    ("kind", "text"),
    ("status", "text"),
    ("started_at", "double precision"),
    ("finished_at", "double precision"),
    ("input", "json"),
    ("output", "json"),
    ("error", "text"),
    ("max_attempts", "integer"),
    ("cached_from", "text"),
    ("wait_until", "double precision"),
    ("timed_out", "boolean"),
    ("tags", "json"),
    ("parent", "integer"),
    ("child_run_id", "text"),
)
ATTEMPT_FIELDS: tuple[tuple[str, str], ...] = (
    ("run_id", "text"),
    ("step_idx", "integer"),
    ("number", "integer"),
    ("status", "text"),
    ("started_at", "double precision"),
    ("finished_at", "double precision"),
    ("error", "text"),
    ("error_type", "text"),
    ("traceback", "text"),
    ("backoff_ms", "bigint"),
)

# ---- enqueue -------------------------------------------------------------------------------
INSERT_JOB = (
    f"INSERT INTO jobs ({', '.join(name for name, _ in JOB_FIELDS)})"
    f" VALUES ({', '.join(f'${i}' for i in range(1, len(JOB_FIELDS) + 1))})"
    " ON CONFLICT (id) DO NOTHING"
)

# ---- claim ---------------------------------------------------------------------------------
_QUEUE_OPEN = "(force OR NOT EXISTS (SELECT 1 FROM paused_queues WHERE queue = $1))"

# $1 queue, $2 how many, $3 the claiming worker, $4 lease seconds.
# One statement takes jobs whose lease expired (their worker stopped renewing: it died or froze)
# first, then due jobs in priority order, so there is no separate reaper to get wrong.
# SKIP LOCKED: concurrent claimers pass over each other's rows instead of queueing behind them.
# `due` is read only as far as the batch still has room (a CTE is evaluated on demand), so it
# locks no row it does not take; its LIMIT is there for the planner, which otherwise costs it
# for the whole backlog and sorts the table instead of walking `jobs_ready`. A paused queue gives nothing, expired leases included, except
# jobs forced due (`force`). Each claimed job's epoch moves on, and `taken_from` names the
# worker whose lease was taken over (NULL for a fresh claim): its run is to be marked crashed.
# RETURNING has no order: sort by (taken_from IS NULL, priority DESC, seq).
CLAIM = f"""
WITH expired AS (
    SELECT seq, worker AS holder FROM jobs
    WHERE queue = $1 AND state = 'active' AND lease_until < {NOW} AND {_QUEUE_OPEN}
    ORDER BY lease_until
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), due AS (
    SELECT seq, NULL::text AS holder FROM jobs
    WHERE queue = $1 AND state IN ('waiting', 'delayed') AND (run_at IS NULL OR run_at <= {NOW})
        AND {_QUEUE_OPEN}
    ORDER BY priority DESC, seq
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT seq, holder FROM expired
    UNION ALL
    (SELECT seq, holder FROM due LIMIT greatest($2 - (SELECT count(*) FROM expired), 0))
)
UPDATE jobs SET state = 'active', worker = $3, lease_until = {NOW} + $4,
    attempts = jobs.attempts + 1, epoch = jobs.epoch + 1, taken_from = picked.holder,
    force = false
FROM picked WHERE jobs.seq = picked.seq
RETURNING {", ".join(f"jobs.{c.strip()}" for c in JOB_COLUMNS.split(","))}
"""

# $1 queue: when the next delayed job of a queue falls due (the idle claim loop's sleep).
NEXT_DUE = "SELECT min(run_at) - " + NOW + " FROM jobs WHERE queue = $1 AND state = 'delayed'"

# ---- leases --------------------------------------------------------------------------------
# $1 worker, $2 lease seconds. Returns what the worker still holds, with each job's epoch and
# any operator signal: a job missing from the answer, or with another epoch, is no longer its.
RENEW = (
    f"UPDATE jobs SET lease_until = {NOW} + $2 WHERE worker = $1 AND state = 'active'"
    " RETURNING id, epoch, signal"
)
RENEW_SLOTS = f"UPDATE concurrency_slots SET lease_until = {NOW} + $2 WHERE worker = $1"

# ---- fenced writes of a held job's records ---------------------------------------------------
# The epoch is read FOR SHARE: a claim that is taking the job over at this moment (its UPDATE
# holds the row) makes this write wait for it and then see the new epoch, so the stale write
# does not slip in before the takeover commits; and a takeover waits for a write in flight.
_FENCE_JOB = "(SELECT epoch FROM jobs WHERE id = ${job} FOR SHARE) = ${epoch}"


def fenced_upsert(
    table: str, fields: tuple[tuple[str, str], ...], key: tuple[str, ...], where: str = ""
) -> str:
    """`INSERT … SELECT $1..$k WHERE <fence> ON CONFLICT (key) DO UPDATE` for `table`; the two
    parameters after the row are the job id and the epoch its writer holds."""
    n = len(fields)
    values = ", ".join(f"${i}::{kind}" for i, (_, kind) in enumerate(fields, start=1))
    updates = [f"{name} = excluded.{name}" for name, _ in fields if name not in key]
    if table == "runs":
        updates.append("changed_xid = excluded.changed_xid")
    return (
        f"INSERT INTO {table} ({', '.join(name for name, _ in fields)})"
        f" SELECT {values} WHERE {_FENCE_JOB.format(job=n + 1, epoch=n + 2)}"
        f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {', '.join(updates)}{where}"
    )


# $1..$27 the run row, $28 its job's id, $29 the epoch its writer holds.
UPSERT_RUN = fenced_upsert("runs", RUN_FIELDS, ("id",))
# $1..$17 the step row, $18 job id, $19 epoch.
UPSERT_STEP = fenced_upsert("steps", STEP_FIELDS, ("run_id", "idx"))
# $1..$10 the attempt row, $11 job id, $12 epoch.
UPSERT_ATTEMPT = fenced_upsert("attempts", ATTEMPT_FIELDS, ("run_id", "step_idx", "number"))
# $1 run, $2 step index, $3 time, $4 level, $5 message, $6 job id, $7 epoch.
INSERT_LOG = (
    "INSERT INTO logs (run_id, step_idx, ts, level, message)"
    " SELECT $1::text, $2::integer, $3::double precision, $4::text, $5::text"
    f" WHERE {_FENCE_JOB.format(job=6, epoch=7)}"
)

# ---- fenced transitions of a job -------------------------------------------------------------
# Each takes the job from the epoch its caller holds to the next; no row back means the caller
# no longer holds the job (taken over, cancelled, settled by someone else) and must drop it.

# $1 job id, $2 epoch, $3 terminal state, $4 error, $5 run id, $6 meta (jsonb),
# $7 headers to keep (redacted) or NULL to leave them.
SETTLE_DONE = f"""
UPDATE jobs SET state = $3, finished_at = {NOW}, error = $4, run_id = $5, meta = $6::jsonb,
    headers = coalesce($7::json, headers), worker = NULL, lease_until = NULL, signal = NULL,
    force = false, epoch = epoch + 1
WHERE id = $1 AND epoch = $2
RETURNING epoch
"""
# $1 job id, $2 epoch, $3 'waiting' or 'delayed', $4 run_at, $5 run id, $6 resume, $7 error,
# $8 meta (jsonb). A job that waits (a retry's backoff, a run's wait) or is handed back.
SETTLE_AGAIN = """
UPDATE jobs SET state = $3, run_at = $4, run_id = $5, resume = $6, error = $7, meta = $8::jsonb,
    worker = NULL, lease_until = NULL, signal = NULL, epoch = epoch + 1
WHERE id = $1 AND epoch = $2
RETURNING epoch
"""

# ---- operator actions (no lease held) --------------------------------------------------------
# $1 job id. A job nobody runs yet is cancelled outright.
CANCEL_PENDING = f"""
UPDATE jobs SET state = 'cancelled', finished_at = {NOW}, epoch = epoch + 1
WHERE id = $1 AND state IN ('waiting', 'delayed')
RETURNING epoch
"""
# $1 job id, $2 the request ('cancel' or 'retry_now'). A held job is asked, not taken: the
# holder sees the signal with its next renewal (sooner on SIGNALS_CHANNEL) and carries it out
# with its own fenced writes. Returns the holder to notify.
SIGNAL = f"""
UPDATE jobs SET signal = coalesce(signal, '{{}}'::jsonb) || jsonb_build_object($2::text, {NOW})
WHERE id = $1 AND state = 'active'
RETURNING worker
"""
# $1 job id. Due now, even past a pause of its queue.
FORCE_DUE = f"""
UPDATE jobs SET state = 'waiting', run_at = {NOW}, force = true, epoch = epoch + 1
WHERE id = $1 AND state IN ('waiting', 'delayed')
RETURNING queue
"""

# ---- cluster chores ------------------------------------------------------------------------
# $1 chore name, $2 worker, $3 seconds. Takes the chore if it is free or its holder's lease ran
# out, renews it if this worker holds it; a row back means this worker is the leader until then.
ACQUIRE_LEADER = f"""
INSERT INTO leader_leases AS l (name, holder, until) VALUES ($1, $2, {NOW} + $3)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, until = excluded.until
WHERE l.holder = excluded.holder OR l.until < {NOW}
RETURNING until
"""
RELEASE_LEADER = "DELETE FROM leader_leases WHERE name = $1 AND holder = $2"

# ---- change feed -----------------------------------------------------------------------------
# $1 the horizon the reader got last time (0 at first). Every transaction below the returned
# horizon has ended, so a run row it wrote is visible now and no later commit can land below
# it: the reader misses nothing and reads each change once (a row rewritten since shows again).
CHANGED_RUNS = """
WITH horizon AS (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin)
SELECT horizon.xmin, runs.id, runs.status
FROM horizon LEFT JOIN runs
    ON runs.changed_xid >= $1 AND runs.changed_xid < horizon.xmin
ORDER BY runs.changed_xid
"""
