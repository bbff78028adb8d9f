"""Rows in the column order of `engine.backends.postgres.sql`, for tests to insert."""

from __future__ import annotations

import json
import time
from typing import Any

from engine.backends.postgres import sql


def row(fields: tuple[tuple[str, str], ...], **values: Any) -> tuple[Any, ...]:
    unknown = set(values) - {name for name, _ in fields}
    if unknown:
        raise KeyError(f"no such columns: {sorted(unknown)}")
    return tuple(values.get(name) for name, _ in fields)


def job(
    job_id: str, queue: str = "q", priority: int = 0, run_at: float | None = None, **values: Any
) -> tuple[Any, ...]:
    return row(
        sql.JOB_FIELDS,
        **{
            "id": job_id,
            "queue": queue,
            "workflow_name": "wf",
            "payload": json.dumps({"job": job_id}),
            "priority": priority,
            "state": "delayed" if run_at is not None else "waiting",
            "run_at": run_at,
            "attempts": 0,
            "max_retries": 0,
            "run_id": f"run-{job_id}",
            "created_at": time.time(),
            "resume": False,
            **values,
        },
    )


def run(run_id: str, job_id: str, status: str = "running", **values: Any) -> tuple[Any, ...]:
    return row(
        sql.RUN_FIELDS,
        **{
            "id": run_id,
            "workflow_name": "wf",
            "workflow_version": "v1",
            "queue": "q",
            "job_id": job_id,
            "status": status,
            "priority": 0,
            "job_attempt": 1,
            "created_at": time.time(),
            "depth": 0,
            "attempts": 0,
            "failed_attempts": 0,
            **values,
        },
    )


def step(run_id: str, idx: int, status: str = "running", **values: Any) -> tuple[Any, ...]:
    return row(
        sql.STEP_FIELDS,
        **{
            "run_id": run_id,
            "idx": idx,
            "name": f"step{idx}",
            "kind": "step",
            "status": status,
            "max_attempts": 1,
            "timed_out": False,
            **values,
        },
    )


def attempt(
    run_id: str, step_idx: int, number: int, status: str = "running", **values: Any
) -> tuple[Any, ...]:
    return row(
        sql.ATTEMPT_FIELDS,
        **{
            "run_id": run_id,
            "step_idx": step_idx,
            "number": number,
            "status": status,
            "started_at": time.time(),
            **values,
        },
    )
