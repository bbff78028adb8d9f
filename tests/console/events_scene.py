"""A frozen scene for the snapshots of events, schedules and rate limits: a run waiting for an
event (with one event nobody took), a run throttled by a rate limit whose window two runs hold,
and schedules listed as of the scene's moment."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, timedelta
from pathlib import Path

from blok_tui.app import BlokApp
from engine import Engine, RunStatus, ScheduleInfo, StepRun, StepStatus, WorkerInfo

from . import scene
from .scene import NOW, WORKERS, at, rid

FAR = 4_000_000_000.0  # the window's starts, recorded "later" than any real clock reads


def approval_run() -> object:
    run = scene._order(20, 2.0, RunStatus.WAITING)
    run.workflow_name = "orders.approval"
    run.steps = [
        StepRun(index=0, name="prepare", kind="node"),
        StepRun(index=1, name="approval", kind="event"),
        StepRun(index=2, name="ship", kind="node"),
    ]
    scene._done(run.steps[0], at(2.0), 140, output={"ready": True})
    wait = run.steps[1]
    wait.status = StepStatus.WAITING
    wait.started_at = at(1.9)
    wait.wait_until = NOW + timedelta(minutes=58)
    wait.input = {"event": "approved", "key": "A1010"}
    run.wait_until = wait.wait_until
    return run


def rate_runs() -> list[object]:
    first = scene._order(17, 0.9, RunStatus.COMPLETED, finished_at=at(0.85))
    second = scene._order(18, 0.7, RunStatus.RUNNING)
    held = scene._order(19, 0.3, RunStatus.THROTTLED, started_at=None)
    held.run_at = NOW + timedelta(seconds=14)
    held.steps = []  # not started: its steps are not laid out yet
    until = held.run_at.isoformat()
    held.error = f"throttled: rate limit: 2/2 runs started in the last 1m; may start at {until}"
    return [first, second, held]


SCHEDULES = [
    ScheduleInfo(
        workflow="reports.nightly",
        schedule="cron 0 2 * * * Europe/Paris",
        queue="reports",
        cron="0 2 * * *",
        every_ms=None,
        timezone="Europe/Paris",
        catch_up="latest",
        paused=False,
        next_at=NOW + timedelta(hours=15, minutes=30),
        last_tick_at=NOW - timedelta(hours=8, minutes=30),
        last_fired_at=NOW - timedelta(hours=8, minutes=30),
        last_run_id=rid(3),
        last_status=RunStatus.COMPLETED,
    ),
    ScheduleInfo(
        workflow="exports.sync",
        schedule="every 30s",
        queue="exports",
        cron=None,
        every_ms=30_000,
        timezone="UTC",
        catch_up="none",
        paused=False,
        next_at=NOW + timedelta(seconds=12),
        last_tick_at=NOW - timedelta(seconds=18),
        last_fired_at=NOW - timedelta(seconds=18),
        last_run_id=rid(9),
        last_status=RunStatus.FAILED,
    ),
    ScheduleInfo(
        workflow="webhooks.digest",
        schedule="every 1h",
        queue="webhooks",
        cron=None,
        every_ms=3_600_000,
        timezone="UTC",
        catch_up="all",
        paused=True,
        next_at=None,
        last_tick_at=NOW - timedelta(hours=3),
        last_fired_at=NOW - timedelta(hours=3),
        last_run_id=rid(5),
        last_status=RunStatus.RUNNING,
    ),
]


async def build(root: Path) -> tuple[Path, Path]:
    folder = scene.workflows_folder(root)
    database = root / "events.db"
    async with Engine(workflows=folder, database=database, consume=False) as engine:
        backend = engine.backend
        runs = [approval_run(), *rate_runs()]
        jobs = scene.showcase_jobs(runs)  # type: ignore[arg-type]
        held = runs[-1]
        for job in jobs:
            if job.run_id == held.id:  # type: ignore[attr-defined]
                job.meta = {
                    "gate": {
                        "gate": "rate_limit",
                        "key": "*",
                        "until": held.run_at.timestamp(),  # type: ignore[attr-defined]
                        "limit": 2,
                        "period_ms": 60_000,
                    }
                }
        await backend.queue("sqlite").add(jobs, [])
        for run in runs:
            backend.runs.save_run(run)  # type: ignore[arg-type]
        await backend.runs.flush()
        await backend.runs.post_event("refunded", {"why": "duplicate"}, run_id=rid(20))
        for n, run in enumerate(runs[1:3]):
            await backend.shared.acquire_start(
                "orders.pipeline",
                "*",
                2,
                60.0,
                run.id,
                FAR + n,  # type: ignore[attr-defined]
            )
        await backend.runs.flush()
    return folder, database


@asynccontextmanager
async def scene_engine(folder: Path, database: Path) -> AsyncIterator[Engine]:
    async with Engine(workflows=folder, database=database, consume=False) as engine:

        async def fixed_workers() -> list[WorkerInfo]:
            return list(WORKERS)

        async def fixed_schedules() -> list[ScheduleInfo]:
            return list(SCHEDULES)

        engine.workers = fixed_workers  # type: ignore[method-assign]
        engine.schedules = fixed_schedules  # type: ignore[method-assign]
        yield engine


def app(folder: Path, database: Path) -> BlokApp:
    return BlokApp(
        open_engine=lambda: scene_engine(folder, database),
        clock=lambda: NOW,
        tz=UTC,
        where="db .blok/blok.db",
    )
