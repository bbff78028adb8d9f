"""Records as table rows and back (runs, jobs, worker catalogs, schedules), and a RunFilter as a
WHERE clause: shared by the SQL backends (SQLite and PostgreSQL), whose dialect files differ
only in placeholders and types.

Times are epoch seconds (floats); JSON values are text; booleans are integers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from ..filters import RunFilter
from ..models import (
    LIVE_RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
    Attempt,
    AttemptStatus,
    Job,
    JobState,
    LogLine,
    Run,
    RunStatus,
    StepRun,
    StepStatus,
    WorkerInfo,
    WorkflowInfo,
    from_epoch,
)
from ..records import construct
from .base import ScheduleSpec, ScheduleState, ServedQueue, WorkerCatalog

RUN_COLUMNS = (
    "id",
    "workflow_name",
    "workflow_version",
    "queue",
    "job_id",
    "status",
    "input",
    "headers",
    "output",
    "error",
    "error_step",
    "priority",
    "job_attempt",
    "created_at",
    "started_at",
    "finished_at",
    "run_at",
    "wait_until",
    "replay_of",
    "replay_from_step",
    "parent_run_id",
    "depth",
    "worker",
    "cursor",
    "state",
    "attempts",
    "failed_attempts",
)
STEP_COLUMNS = (
    "run_id",
    "idx",
    "name",
    "kind",
    "status",
    "started_at",
    "finished_at",
    "input",
    "output",
    "error",
    "max_attempts",
    "cached_from",
    "wait_until",
    "timed_out",
    "tags",
    "parent",
    "child_run_id",
)
ATTEMPT_COLUMNS = (
    "run_id",
    "step_idx",
    "number",
    "status",
    "started_at",
    "finished_at",
    "error",
    "error_type",
    "traceback",
    "backoff_ms",
)
# The statuses of a run that has not begun: a job claimed with its run in one of them is not
# run by any slot yet (`stats` counts it waiting).
UNSTARTED_RUN = "({})".format(
    ", ".join(
        f"'{status}'"
        for status in (
            RunStatus.QUEUED,
            RunStatus.DELAYED,
            RunStatus.DEBOUNCED,
            RunStatus.THROTTLED,
        )
    )
)
# A queue's jobs counted by (state, due later, count), a job claimed ahead (not handed to a
# slot) whose run has not begun as waiting: no slot runs it yet, whichever process asks. (The
# claiming process also counts its top-ups, handed but kept ahead, as waiting: ahead.py.)
# `{now}`, `{queue}`: the dialect's placeholders.
# A queue's jobs counted as (state, due later, count), each state by its index: a backlog of
# delayed jobs is counted from index entries alone, those due found by their time
# (`jobs_due_at`, a range up to now) and taken from the total, where reading each one's time
# from its row took 156 ms on SQLite and 88 ms on PostgreSQL with 100,000 a month ahead (for
# every refresh of the console's queues, every health check and metrics sample). The due ones
# are read in the index's order: PostgreSQL's planner, with no statistics yet (a new table, a
# generic plan), otherwise reads them through the queue's jobs by state, as the claim's search.
_DUE_DELAYED = """
SELECT created_at, run_at FROM jobs
WHERE queue = {queue} AND state = 'delayed' AND run_at <= {now} ORDER BY run_at
"""
STATS = """
WITH due AS (SELECT count(*) AS n FROM (_DUE_DELAYED) AS d)
SELECT state, state = 'delayed' AS later, count(*) AS n FROM jobs
WHERE queue = {queue} AND state NOT IN ('active', 'waiting') GROUP BY state
UNION ALL
SELECT 'delayed', false, n FROM due
UNION ALL
SELECT 'delayed', true, -n FROM due
UNION ALL
SELECT 'waiting', coalesce(run_at > {now}, false), count(*) FROM jobs
WHERE queue = {queue} AND state = 'waiting' GROUP BY 2
UNION ALL
SELECT CASE WHEN r.status IN {unstarted} THEN 'waiting' ELSE 'active' END, false, count(*)
FROM jobs j LEFT JOIN runs r ON j.handed = 0 AND r.id = j.run_id
WHERE j.queue = {queue} AND j.state = 'active' GROUP BY 1
""".replace("_DUE_DELAYED", _DUE_DELAYED)
# Since when the longest-waiting due job has been due (epoch seconds, NULL: none): the waiting
# jobs, and the delayed ones whose time has come found by it (`jobs_due_at`): of a backlog of
# delayed jobs, only those due are read (each one's time was read, 39 ms with 100,000 later).
OLDEST_WAITING = """
SELECT min(since) FROM (
    SELECT min({greatest}(created_at, coalesce(run_at, 0))) AS since FROM jobs
    WHERE queue = {queue} AND state = 'waiting' AND (run_at IS NULL OR run_at <= {now})
    UNION ALL
    SELECT min({greatest}(created_at, run_at)) FROM (_DUE_DELAYED) AS d
) AS due
""".replace("_DUE_DELAYED", _DUE_DELAYED)

# A run the janitor keeps past the retention: a dead letter's last (its error says why it died,
# and a replay starts from it; the job is kept until it is requeued).
NOT_A_DEAD_LETTER = (
    "NOT EXISTS (SELECT 1 FROM jobs j"
    " WHERE j.id = runs.job_id AND j.run_id = runs.id AND j.state = 'dead')"
)

JOB_COLUMNS = (
    "id",
    "queue",
    "workflow_name",
    "payload",
    "headers",
    "priority",
    "state",
    "run_at",
    "attempts",
    "max_retries",
    "run_id",
    "created_at",
    "finished_at",
    "error",
    "worker",
    "lease_until",
    "resume",
    "meta",
    "epoch",
    "signals",
    "forced",
    "handed",
)

# One encoder for every row: `json.dumps(value, default=str)` builds a new one each call.
_encode = json.JSONEncoder(default=str).encode


def dump(value: Any) -> str | None:
    return None if value is None else _encode(value)


def load(value: str | None) -> Any:
    return None if value is None else json.loads(value)


# ---- runs --------------------------------------------------------------------------------
# The rows below convert their times inline (`None if t is None else t.timestamp()`), not with
# models.to_epoch: a job's rows hold about fourteen of them, and each was a call.
def run_row(run: Run) -> tuple[Any, ...]:
    return (
        run.id,
        run.workflow_name,
        run.workflow_version,
        run.queue,
        run.job_id,
        str(run.status),
        dump(run.input),
        dump(run.headers) if run.headers else None,
        dump(run.output),
        run.error,
        run.error_step,
        run.priority,
        run.job_attempt,
        run.created_at.timestamp(),
        None if run.started_at is None else run.started_at.timestamp(),
        None if run.finished_at is None else run.finished_at.timestamp(),
        None if run.run_at is None else run.run_at.timestamp(),
        None if run.wait_until is None else run.wait_until.timestamp(),
        run.replay_of,
        run.replay_from_step,
        run.parent_run_id,
        run.depth,
        run.worker,
        dump(run.cursor) if run.cursor else None,
        dump(run.state) if run.state else None,
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
        None if step.started_at is None else step.started_at.timestamp(),
        None if step.finished_at is None else step.finished_at.timestamp(),
        dump(step.input),
        dump(step.output),
        step.error,
        step.max_attempts,
        step.cached_from,
        None if step.wait_until is None else step.wait_until.timestamp(),
        int(step.timed_out),
        dump(step.tags) if step.tags else None,
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
        None if attempt.finished_at is None else attempt.finished_at.timestamp(),
        attempt.error,
        attempt.error_type,
        attempt.traceback,
        attempt.backoff_ms,
    )


def run_from_row(row: Mapping[str, Any]) -> Run:
    return construct(
        Run,
        dict(
            id=row["id"],
            workflow_name=row["workflow_name"],
            workflow_version=row["workflow_version"],
            queue=row["queue"],
            job_id=row["job_id"],
            status=RunStatus(row["status"]),
            input=load(row["input"]),
            headers=load(row["headers"]) or {},
            output=load(row["output"]),
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
            cursor=load(row["cursor"]) or [],
            state=load(row["state"]) or {},
            steps=[],
            logs=[],
        ),
    )


def step_from_row(row: Mapping[str, Any]) -> StepRun:
    return construct(
        StepRun,
        dict(
            index=row["idx"],
            name=row["name"],
            kind=row["kind"],
            status=StepStatus(row["status"]),
            started_at=from_epoch(row["started_at"]),
            finished_at=from_epoch(row["finished_at"]),
            input=load(row["input"]),
            output=load(row["output"]),
            error=row["error"],
            max_attempts=row["max_attempts"],
            attempts=[],
            logs=[],
            cached_from=row["cached_from"],
            wait_until=from_epoch(row["wait_until"]),
            timed_out=bool(row["timed_out"]),
            tags=load(row["tags"]) or [],
            parent=row["parent"],
            child_run_id=row["child_run_id"],
        ),
    )


def attempt_from_row(row: Mapping[str, Any]) -> Attempt:
    return construct(
        Attempt,
        dict(
            number=row["number"],
            status=AttemptStatus(row["status"]),
            started_at=from_epoch(row["started_at"]),
            finished_at=from_epoch(row["finished_at"]),
            error=row["error"],
            error_type=row["error_type"],
            traceback=row["traceback"],
            backoff_ms=row["backoff_ms"],
        ),
    )


def assemble(
    runs: list[Run], steps: list[Mapping[str, Any]], attempts: list[Mapping[str, Any]]
) -> None:
    """Put step and attempt rows (ordered by run, index, number) on their runs."""
    by_run = {run.id: run for run in runs}
    found: dict[tuple[str, int], StepRun] = {}
    for row in steps:
        run = by_run.get(row["run_id"])
        if run is not None:
            step = step_from_row(row)
            run.steps.append(step)
            found[(run.id, step.index)] = step
    for row in attempts:
        owner = found.get((row["run_id"], row["step_idx"]))
        if owner is not None:
            owner.attempts.append(attempt_from_row(row))


def place_lines(run: Run, lines: Iterable[Sequence[Any]]) -> None:
    """Put log lines, rows of (step index or None, time in epoch seconds, level, message) in
    their order, on the run's steps (a line without a step, or of a step the run lacks, on the
    run itself). The run's steps are on it already (`assemble`)."""
    by_index = {step.index: step for step in run.steps}
    for step_idx, ts, level, message in lines:
        line = construct(
            LogLine,
            {
                "ts": datetime.fromtimestamp(ts, UTC),
                "level": level,
                "message": message,
                "step": step_idx,
            },
        )
        step = by_index.get(step_idx) if step_idx is not None else None
        (step.logs if step is not None else run.logs).append(line)


# ---- jobs --------------------------------------------------------------------------------
def job_row(job: Job) -> tuple[Any, ...]:
    """A new job's row, in JOB_COLUMNS order (DatabaseQueue.offers_for: one may be added
    already claimed)."""
    return (
        job.id,
        job.queue,
        job.workflow_name,
        dump(job.payload) if job.payload is not None else "null",
        dump(job.headers) if job.headers else None,
        job.priority,
        str(job.state),
        None if job.run_at is None else job.run_at.timestamp(),
        job.attempts,
        job.max_retries,
        job.run_id,
        job.created_at.timestamp(),
        None,
        None,
        job.worker,  # a new job is nobody's, unless handed to a claim as it is added
        None if job.lease_until is None else job.lease_until.timestamp(),
        int(job.resume),
        dump(job.meta) if job.meta else None,
        job.epoch,
        None,
        int(job.force),
        int(job.handed),
    )


def job_from_row(row: Sequence[Any]) -> Job:
    """A job from a row whose first columns are `JOB_COLUMNS`, in that order (every query
    that reads jobs selects them so): read by position, which costs a fifth of reading 21
    columns by name from a `sqlite3.Row`."""
    (
        id_,
        queue,
        workflow_name,
        payload,
        headers,
        priority,
        state,
        run_at,
        attempts,
        max_retries,
        run_id,
        created_at,
        finished_at,
        error,
        worker,
        lease_until,
        resume,
        meta,
        epoch,
        signals,
        forced,
        handed,
    ) = row[: len(JOB_COLUMNS)]
    return construct(
        Job,
        dict(
            id=id_,
            queue=queue,
            workflow_name=workflow_name,
            payload=load(payload),
            headers=load(headers) or {},
            priority=priority,
            state=JobState(state),
            run_at=from_epoch(run_at),
            attempts=attempts,
            max_retries=max_retries,
            run_id=run_id,
            created_at=from_epoch(created_at),
            finished_at=from_epoch(finished_at),
            error=error,
            worker=worker,
            resume=bool(resume),
            meta=load(meta) or {},
            epoch=epoch,
            lease_until=from_epoch(lease_until),
            signals=load(signals) or {},
            force=bool(forced),
            handed=bool(handed),
        ),
    )


# ---- shared state ------------------------------------------------------------------------
def worker_from_row(row: Any, heartbeat_at: float | None = None) -> WorkerInfo:
    """`heartbeat_at`: the heartbeat on the reader's clock, where the row's is another's."""
    beat = row["heartbeat_at"] if heartbeat_at is None else heartbeat_at
    return WorkerInfo(
        id=row["id"],
        host=row["host"],
        pid=row["pid"],
        started_at=datetime.fromtimestamp(row["started_at"], UTC),
        heartbeat_at=datetime.fromtimestamp(beat, UTC),
        process=row["process"],
        stopping_since=(
            None if row["stopping_at"] is None else datetime.fromtimestamp(row["stopping_at"], UTC)
        ),
    )


def stopping_at(worker: WorkerInfo) -> float | None:
    return None if worker.stopping_since is None else worker.stopping_since.timestamp()


def catalog_row(catalog: WorkerCatalog) -> tuple[Any, ...]:
    queues = [
        {
            "name": q.name,
            "workflow_name": q.workflow_name,
            "workflow_version": q.workflow_version,
            "provider": q.provider,
            "concurrency": q.concurrency,
            "retries": q.retries,
            "start_delay_ms": q.start_delay_ms,
            "timeout_ms": q.timeout_ms,
        }
        for q in catalog.queues
    ]
    workflows = [
        {**info.model_dump(mode="json"), "kinds": catalog.step_kinds.get(info.name, ())}
        for info in catalog.workflows
    ]
    return (
        catalog.worker,
        json.dumps(queues),
        json.dumps(workflows),
        json.dumps(catalog.reload_errors),
        catalog.updated_at,
    )


def catalog_from_row(row: Any) -> WorkerCatalog:
    # Only the fields this version knows: a newer worker may write more.
    queues = tuple(
        ServedQueue(**{k: q.get(k) for k in ServedQueue.__dataclass_fields__ if k in q})
        for q in json.loads(row[1])
    )
    workflows = []
    kinds: dict[str, tuple[tuple[str, str], ...]] = {}
    for w in json.loads(row[2]):
        # Fields an older worker did not write take their defaults.
        workflows.append(WorkflowInfo(**{k: w[k] for k in WorkflowInfo.model_fields if k in w}))
        kinds[w["name"]] = tuple((name, kind) for name, kind in w.get("kinds", ()))
    return WorkerCatalog(row[0], queues, tuple(workflows), kinds, json.loads(row[3]), row[4])


def spec_text(spec: ScheduleSpec) -> str:
    return json.dumps(
        {
            "queue": spec.queue,
            "cron": spec.cron,
            "every_ms": spec.every_ms,
            "timezone": spec.timezone,
            "catch_up": spec.catch_up,
            "payload": spec.payload,
        },
        default=str,
    )


def schedule_from_row(row: Any) -> ScheduleState:
    """A row of SCHEDULE_COLUMNS, its spec as JSON text."""
    fields = json.loads(row[2])
    spec = ScheduleSpec(
        workflow=row[0],
        schedule=row[1],
        queue=fields.get("queue", ""),
        cron=fields.get("cron"),
        every_ms=fields.get("every_ms"),
        timezone=fields.get("timezone", "UTC"),
        catch_up=fields.get("catch_up", "latest"),
        payload=fields.get("payload"),
    )
    return ScheduleState(spec, row[3], bool(row[4]), row[5], row[6], row[7])


SCHEDULE_COLUMNS = (
    "workflow, schedule, spec, last_tick, paused, last_fired_at, last_job_id, last_run_id"
)


# ---- filters -----------------------------------------------------------------------------
TERMINAL = tuple(str(s) for s in TERMINAL_RUN_STATUSES)


def like_pattern(text: str, *, anywhere: bool = True) -> str:
    """`text` anywhere (or at the start), for `LIKE ... ESCAPE '\\'`: its own % and _ match
    only themselves."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%" if anywhere else f"{escaped}%"


def where_clause(
    where: RunFilter | None,
    mark: Callable[[], str],
    *,
    like: str = "LIKE",
    as_text: Callable[[str], str] = lambda column: column,
) -> tuple[str, list[Any]]:
    """`where` as " WHERE ..." over the runs table, with `mark()` giving each placeholder.
    `like`: the case-blind LIKE of the dialect (SQLite's LIKE is; PostgreSQL's ILIKE);
    `as_text`: a JSON column as text (PostgreSQL: `input::text`)."""
    if where is None:
        return "", []
    clauses: list[str] = []
    params: list[Any] = []

    def marks(values: tuple[Any, ...] | list[Any]) -> str:
        params.extend(values)
        return ", ".join(mark() for _ in values)

    if where.status:
        clauses.append(f"status IN ({marks(where.status)})")
    if where.workflow:
        clauses.append(f"workflow_name = {marks([where.workflow])}")
    if where.queue:
        clauses.append(f"queue = {marks([where.queue])}")
    if where.not_queues:
        clauses.append(f"queue NOT IN ({marks(where.not_queues)})")
    if where.job_id:
        clauses.append(f"job_id = {marks([where.job_id])}")
    if where.replay_of:
        clauses.append(f"replay_of = {marks([where.replay_of])}")
    if where.replays:
        clauses.append("replay_of IS NOT NULL")
    if where.id_prefix is not None:
        # LIKE, not a range of ids: PostgreSQL orders text by the database's collation, in
        # which "_" may not sort where its byte does. Case-blind, as the text filter is.
        pattern = like_pattern(where.id_prefix, anywhere=False)
        clauses.append(f"id {like} {marks([pattern])} ESCAPE '\\'")
    if where.job_id_prefix is not None:
        pattern = like_pattern(where.job_id_prefix, anywhere=False)
        clauses.append(f"job_id {like} {marks([pattern])} ESCAPE '\\'")
    if where.workers is not None:
        clauses.append(f"worker IN ({marks(where.workers) or 'NULL'})")
    if where.finished_after is not None:
        clauses.append(f"finished_at >= {marks([where.finished_after])}")
    if where.created_after is not None:
        clauses.append(f"created_at >= {marks([where.created_after])}")
    if where.retrying:
        clauses.append(
            f"status IN ({marks(LIVE_RUN_STATUSES)}) AND (failed_attempts > 0 OR job_attempt > 1)"
        )
    cutoffs = where.stuck_before()
    if cutoffs is not None:
        parts = [
            f"(workflow_name = {marks([workflow])} AND started_at < {marks([cutoff])})"
            for workflow, cutoff in cutoffs.items()
        ]
        clauses.append(f"status = 'running' AND ({' OR '.join(parts) or '1 = 0'})")
    if where.text:
        pattern = like_pattern(where.text)
        fields = (
            "id",
            "job_id",
            "workflow_name",
            "workflow_version",  # the runs of one version of a deploy
            "queue",
            "status",
            "error",
            "worker",  # the runs of one worker (the runs view names it by its pid)
            as_text("input"),
        )
        found = [f"{f} {like} {marks([pattern])} ESCAPE '\\'" for f in fields]
        # The input is JSON text, its non-ASCII characters escaped ("\u6ce8"): the text is
        # looked for as it is written there too.
        escaped = json.dumps(where.text)[1:-1]
        if escaped != where.text:
            found.append(f"{as_text('input')} {like} {marks([like_pattern(escaped)])} ESCAPE '\\'")
        clauses.append("(" + " OR ".join(found) + ")")
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params
