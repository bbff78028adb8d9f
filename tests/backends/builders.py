"""Records for the backend contract tests: jobs with their first runs, runs with steps, attempts
and logs, log lines, workers. Built with pydantic's validation, as a test should; every id is
new, so tests never collide on a shared database."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from engine.models import (
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
    utcnow,
)

QUEUE = "orders"
WORKFLOW = "ship"


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def after(seconds: float) -> datetime:
    """A moment `seconds` from now (negative: in the past)."""
    return utcnow() + timedelta(seconds=seconds)


def job_and_run(
    queue: str = QUEUE,
    *,
    priority: int = 0,
    run_at: datetime | None = None,
    payload: Any = None,
    headers: dict[str, str] | None = None,
    job_id: str | None = None,
    run_id: str | None = None,
) -> tuple[Job, Run]:
    """A new job (waiting, or delayed until `run_at`) and its first run (queued)."""
    job = Job(
        id=job_id or new_id("job"),
        queue=queue,
        workflow_name=WORKFLOW,
        payload=payload if payload is not None else {"n": 1},
        headers=headers or {},
        priority=priority,
        state=JobState.DELAYED if run_at is not None else JobState.WAITING,
        run_at=run_at,
        max_retries=2,
        run_id=run_id or new_id("run"),
        created_at=utcnow(),
    )
    return job, run_of(job)


def run_of(job: Job, **fields: Any) -> Run:
    """A run of `job` (queued unless `fields` say otherwise)."""
    values: dict[str, Any] = dict(
        id=job.run_id,
        workflow_name=job.workflow_name,
        workflow_version="v1",
        queue=job.queue,
        job_id=job.id,
        status=RunStatus.DELAYED if job.run_at is not None else RunStatus.QUEUED,
        input=job.payload,
        priority=job.priority,
        created_at=job.created_at,
        run_at=job.run_at,
    )
    values.update(fields)
    return Run(**values)


def a_run(**fields: Any) -> Run:
    """A run with no job in any queue (the run store's own tests)."""
    values: dict[str, Any] = dict(
        id=new_id("run"),
        workflow_name=WORKFLOW,
        workflow_version="v1",
        queue=QUEUE,
        job_id=new_id("job"),
        created_at=utcnow(),
    )
    values.update(fields)
    return Run(**values)


def line(message: str, step: int | None = None, level: str = "info") -> LogLine:
    return LogLine(ts=utcnow(), level=level, message=message, step=step)


def finished_run(**fields: Any) -> Run:
    """A completed run with every field set: two steps (one nested), a failed attempt and a
    retried one, and a log line on the run and on a step."""
    started = utcnow() - timedelta(seconds=5)
    first = Attempt(
        number=1,
        status=AttemptStatus.FAILED,
        started_at=started,
        finished_at=started + timedelta(milliseconds=120),
        error="ConnectionError: refused",
        error_type="ConnectionError",
        traceback="Traceback (most recent call last):\n  ...",
        backoff_ms=250,
    )
    second = Attempt(
        number=2,
        status=AttemptStatus.COMPLETED,
        started_at=started + timedelta(milliseconds=400),
        finished_at=started + timedelta(milliseconds=900),
    )
    fetch = StepRun(
        index=0,
        name="fetch",
        kind="node",
        status=StepStatus.COMPLETED,
        started_at=started,
        finished_at=started + timedelta(milliseconds=900),
        input={"url": "https://example.test/a", "ids": [1, 2, 3]},
        output={"rows": 3, "ok": True, "ratio": 0.5},
        max_attempts=3,
        attempts=[first, second],
        tags=["mw:auth", "iteration 1"],
        logs=[line("fetched 3 rows", step=0)],
    )
    child = StepRun(
        index=1,
        name="notify",
        kind="subworkflow",
        status=StepStatus.CACHED,
        started_at=started + timedelta(seconds=1),
        finished_at=started + timedelta(seconds=2),
        output="sent",
        cached_from=new_id("run"),
        wait_until=started + timedelta(seconds=3),
        timed_out=True,
        parent=0,
        child_run_id=new_id("run"),
    )
    values: dict[str, Any] = dict(
        status=RunStatus.COMPLETED,
        input={"order": 7, "items": ["a", "b"], "note": "ünïcode ✓"},
        headers={"x-request-id": "abc"},
        output=[1, "two", {"three": 3.0}, None],
        error="an earlier failure",
        error_step="fetch",
        priority=5,
        job_attempt=2,
        started_at=started,
        finished_at=started + timedelta(seconds=2),
        run_at=started - timedelta(seconds=1),
        wait_until=started + timedelta(seconds=30),
        replay_of=new_id("run"),
        replay_from_step="fetch",
        parent_run_id=new_id("run"),
        depth=1,
        worker="host:123",
        attempts=3,
        failed_attempts=1,
        cursor=[1, 0],
        state={"fetch": {"rows": 3}},
        steps=[fetch, child],
        logs=[line("run started"), line("slow host", level="warning")],
    )
    values.update(fields)
    return a_run(**values)


def worker(worker_id: str | None = None, *, started: datetime | None = None) -> WorkerInfo:
    now = utcnow()
    return WorkerInfo(
        id=worker_id or new_id("worker"),
        host="host-a",
        pid=4242,
        started_at=started or now,
        heartbeat_at=now,
    )
