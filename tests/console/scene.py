"""A frozen scene for snapshots and screenshots: the bundled example workflows, one broken
workflow file, and runs and jobs with fixed ids and times, seen at a fixed moment.

The console never writes here (the engine runs with consume=False), so what it shows depends
on nothing but this file.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import examples
from blok_tui.app import BlokApp
from engine import (
    Attempt,
    AttemptStatus,
    Engine,
    Job,
    JobState,
    LogLine,
    QueueInfo,
    Run,
    RunStatus,
    StepRun,
    StepStatus,
    WorkerInfo,
)
from engine.liveness import Orphan, orphaned, worker_alive, worker_state

NOW = datetime(2026, 1, 15, 9, 30, 0, tzinfo=UTC)
BROKEN = '''"""Refunds: being edited, and broken for the moment."""

from engine import Step, WorkerTrigger, Workflow


def refund(ctx, order_id):
    return {"refunded": order_id}


workflow = Workflow(
    name="refunds.issue",
    trigger=WorkerTrigger(queue="refunds"),
    steps=[Step("refund", refund, inputs={"order_id": "$.body.order_id"}), Step("mail", mail)],
)
'''
TRACEBACK = """Traceback (most recent call last):
  File "examples/orders.py", line 19, in charge
    return await call_gateway(order_id, amount, ctx.attempt, flaky)
  File "examples/_shop.py", line 15, in call_gateway
    raise GatewayDeclined(f"gateway 503 for order {order_id} (attempt {attempt})")
_shop.GatewayDeclined: gateway 503 for order A0997 (attempt {n})"""


def rid(n: int) -> str:
    """The showcase's run n: an id shaped like the engine's (milliseconds first, then random),
    37 s apart, so that short ids read as they do on a real store."""
    ms = int(NOW.timestamp() * 1000) - (20 - n) * 37_000
    return f"run_{ms:011x}{(n * 2654435761) % 2**32:08x}"


def jid(n: int) -> str:
    ms = int(NOW.timestamp() * 1000) - (20 - n) * 37_000
    return f"job_{ms:011x}{(n * 40503 + 977) % 2**32:08x}"


def at(minutes: float) -> datetime:
    """A moment `minutes` before NOW."""
    return NOW - timedelta(minutes=minutes)


def _steps(names: list[str], kinds: dict[str, str] | None = None) -> list[StepRun]:
    kinds = kinds or {}
    return [StepRun(index=i, name=n, kind=kinds.get(n, "node")) for i, n in enumerate(names)]


ORDER_STEPS = ["validate", "charge", "fraud_window", "pack", "notify"]


def _done(step: StepRun, start: datetime, ms: int, output: Any = None, inp: Any = None) -> None:
    step.status = StepStatus.COMPLETED
    step.started_at = start
    step.finished_at = start + timedelta(milliseconds=ms)
    step.input = inp
    step.output = output
    if step.kind == "node":
        step.attempts = [
            Attempt(
                number=1,
                status=AttemptStatus.COMPLETED,
                started_at=start,
                finished_at=step.finished_at,
            )
        ]


def _order(n: int, minutes: float, status: RunStatus, **extra: Any) -> Run:
    extra.setdefault("started_at", at(minutes))
    run = Run(
        id=rid(n),
        workflow_name="orders.pipeline",
        workflow_version="3f9a1c2e",
        queue="orders",
        job_id=jid(n),
        status=status,
        input={"order_id": f"A{990 + n}", "amount": 1200 + 7 * n, "items": 2},
        created_at=at(minutes),
        worker="showcase:1",
        steps=_steps(ORDER_STEPS, {"fraud_window": "wait"}),
        **extra,
    )
    for step in run.steps:
        if step.name == "charge":
            step.max_attempts = 4
    return run


def _completed_order(n: int, minutes: float) -> Run:
    run = _order(n, minutes, RunStatus.COMPLETED)
    start = run.created_at
    body = run.input
    for step, ms, out in zip(
        run.steps,
        (2, 160, 4000, 1100, 3),
        (body, {"charged": body["amount"]}, None, {"parcels": 1}, {"sent": True}),
        strict=True,
    ):
        _done(step, start, ms, out, inp=body if step.name != "pack" else {"items": 2})
        start = step.finished_at or start
    run.finished_at = start
    run.attempts = 4
    return run


def retried_order() -> list[Run]:
    """A job whose first delivery failed (the gateway said no four times) and whose second
    went through: run 4 failed, then run 5 completed, one job."""
    first = _order(4, 17, RunStatus.FAILED)
    _done(first.steps[0], first.created_at, 2, first.input, first.input)
    charge = first.steps[1]
    charge.status = StepStatus.FAILED
    charge.started_at = first.created_at + timedelta(milliseconds=2)
    charge.input = {"order_id": "A994", "amount": 1228, "flaky": 4}
    t = charge.started_at
    for k in (1, 2, 3, 4):
        charge.attempts.append(
            Attempt(
                number=k,
                status=AttemptStatus.FAILED,
                started_at=t,
                finished_at=t + timedelta(milliseconds=150),
                error=f"GatewayDeclined: gateway 503 for order A994 (attempt {k})",
                backoff_ms=400 * 2 ** (k - 1) if k < 4 else None,
            )
        )
        t += timedelta(milliseconds=150 + (400 * 2 ** (k - 1) if k < 4 else 0))
    charge.finished_at = t
    charge.error = "GatewayDeclined: gateway 503 for order A994 (attempt 4) (after 4 attempts)"
    first.finished_at = t
    first.error = "[step 2/5] charge failed: " + charge.error
    first.error_step = "charge"
    first.attempts, first.failed_attempts = 5, 4
    first.logs = [
        LogLine(ts=t, level="warning", message=f"job attempt 1/2 failed; retrying as run {rid(5)}")
    ]
    second = _completed_order(5, 12)
    second.job_id = first.job_id
    second.job_attempt = 2
    second.input = first.input
    return [first, second]


def showcase_runs() -> list[Run]:
    runs: list[Run] = []
    # A flaky charge that went through on the third attempt.
    flaky = _completed_order(1, 28)
    charge = flaky.step("charge")
    base = charge.started_at or NOW
    charge.attempts = [
        Attempt(
            number=k,
            status=AttemptStatus.FAILED if k < 3 else AttemptStatus.COMPLETED,
            started_at=base + timedelta(milliseconds=600 * (k - 1)),
            finished_at=base + timedelta(milliseconds=600 * (k - 1) + 150),
            error=f"GatewayDeclined: gateway 503 for order A991 (attempt {k})" if k < 3 else None,
            backoff_ms=400 * 2 ** (k - 1) if k < 3 else None,
        )
        for k in (1, 2, 3)
    ]
    flaky.attempts, flaky.failed_attempts = 6, 2
    runs.append(flaky)
    for n, minutes in ((2, 26), (3, 21)):
        runs.append(_completed_order(n, minutes))
    runs.extend(retried_order())

    # An order that failed: the gateway said no four times.
    failed = _order(6, 9, RunStatus.FAILED)
    _done(failed.steps[0], failed.created_at, 2, failed.input, failed.input)
    charge = failed.steps[1]
    charge.status = StepStatus.FAILED
    charge.started_at = failed.created_at + timedelta(milliseconds=2)
    charge.input = {"order_id": "A996", "amount": 1242, "flaky": 9}
    t = charge.started_at
    for k in (1, 2, 3, 4):
        backoff = min(5000, 400 * 2 ** (k - 1)) if k < 4 else None
        charge.attempts.append(
            Attempt(
                number=k,
                status=AttemptStatus.FAILED,
                started_at=t,
                finished_at=t + timedelta(milliseconds=150),
                error=f"GatewayDeclined: gateway 503 for order A996 (attempt {k})",
                error_type="GatewayDeclined",
                traceback=TRACEBACK.replace("A0997", "A996").replace("{n}", str(k))
                if k == 4
                else None,
                backoff_ms=backoff,
            )
        )
        t += timedelta(milliseconds=150 + (backoff or 0))
    charge.finished_at = t
    charge.error = "GatewayDeclined: gateway 503 for order A996 (attempt 4) (after 4 attempts)"
    charge.logs = [
        LogLine(ts=a.started_at, level="info", message=f"charging A996, attempt {a.number}", step=1)
        for a in charge.attempts
    ]
    failed.finished_at = t
    failed.error = "[step 2/5] charge failed: " + charge.error
    failed.error_step = "charge"
    failed.attempts, failed.failed_attempts = 5, 4
    failed.logs = [
        LogLine(
            ts=t,
            level="warning",
            message=f"job attempt 1/2 failed; retrying in 2.1s as run {rid(7)}",
        )
    ]
    runs.append(failed)

    # Its replay, which went through.
    replay = _completed_order(7, 6)
    replay.replay_of = failed.id
    runs.append(replay)

    # Waiting out the fraud window, with a countdown.
    waiting = _order(8, 0.2, RunStatus.WAITING)
    _done(waiting.steps[0], waiting.created_at, 2, waiting.input, waiting.input)
    _done(waiting.steps[1], waiting.created_at, 160, {"charged": 1256}, waiting.input)
    window = waiting.steps[2]
    window.status = StepStatus.WAITING
    window.started_at = waiting.created_at + timedelta(milliseconds=162)
    window.wait_until = NOW + timedelta(seconds=4)
    waiting.wait_until = window.wait_until
    waiting.attempts = 2
    runs.append(waiting)

    # Queued behind the others.
    runs.append(_order(9, 0.05, RunStatus.QUEUED, started_at=None))

    # A report rendering for 48 s: the run worth cancelling.
    report = Run(
        id=rid(10),
        workflow_name="reports.monthly",
        workflow_version="a41d07b9",
        queue="reports",
        job_id=jid(10),
        status=RunStatus.RUNNING,
        input={"month": "2025-12", "seconds": 90},
        created_at=at(0.8),
        started_at=at(0.8),
        worker="showcase:1",
        steps=_steps(["gather", "render"]),
        attempts=2,
    )
    _done(report.steps[0], report.created_at, 300, {"month": "2025-12", "rows": 48000})
    render = report.steps[1]
    render.status = StepStatus.RUNNING
    render.started_at = report.created_at + timedelta(milliseconds=300)
    render.attempts = [Attempt(number=1, started_at=render.started_at)]
    runs.append(report)

    # An upload past its time limit.
    export = Run(
        id=rid(11),
        workflow_name="exports.upload",
        workflow_version="5c2e88d0",
        queue="exports",
        job_id=jid(11),
        status=RunStatus.TIMED_OUT,
        input={"size_mb": 90},
        created_at=at(4),
        started_at=at(4),
        finished_at=at(4) + timedelta(milliseconds=2204),
        error="[step 2/2] upload failed: timed out after 2s (max_duration)",
        error_step="upload",
        steps=_steps(["prepare", "upload"]),
        attempts=2,
        failed_attempts=1,
    )
    _done(export.steps[0], export.created_at, 204, {"size_mb": 90, "parts": 9})
    upload = export.steps[1]
    upload.status = StepStatus.FAILED
    upload.timed_out = True
    upload.started_at = export.created_at + timedelta(milliseconds=204)
    upload.finished_at = upload.started_at + timedelta(milliseconds=2000)
    upload.attempts = [
        Attempt(
            number=1,
            status=AttemptStatus.TIMED_OUT,
            started_at=upload.started_at,
            finished_at=upload.finished_at,
            error="timed out after 2s (max_duration)",
        )
    ]
    runs.append(export)

    # A webhook to an endpoint that is gone: its last run, before the dead-letter queue.
    hook = Run(
        id=rid(12),
        workflow_name="webhooks.deliver",
        workflow_version="0be61f4a",
        queue="webhooks",
        job_id=jid(12),
        status=RunStatus.FAILED,
        input={"url": "https://gone.example.com/hooks/orders", "event": "order.paid"},
        created_at=at(2),
        started_at=at(2),
        finished_at=at(2) + timedelta(milliseconds=520),
        error="[step 1/1] deliver failed: POST https://gone.example.com/hooks/orders: 410 Gone",
        job_attempt=3,
        steps=_steps(["deliver"]),
        attempts=2,
        failed_attempts=2,
    )
    runs.append(hook)

    # An upload whose worker, the laptop's, went away mid-run 40 minutes ago: its record still
    # says running, and nobody runs it (the console marks it orphaned).
    stranded = Run(
        id=rid(18),
        workflow_name="exports.upload",
        workflow_version="5c2e88d0",
        queue="exports",
        job_id=jid(18),
        status=RunStatus.RUNNING,
        input={"size_mb": 12},
        created_at=at(41),
        started_at=at(41),
        worker="laptop:4242",
        steps=_steps(["prepare", "upload"]),
        attempts=2,
    )
    _done(stranded.steps[0], stranded.created_at, 180, {"size_mb": 12, "parts": 2})
    upload = stranded.steps[1]
    upload.status = StepStatus.RUNNING
    upload.started_at = stranded.created_at + timedelta(milliseconds=180)
    upload.attempts = [Attempt(number=1, started_at=upload.started_at)]
    runs.append(stranded)
    runs.extend(flow_control_runs())
    return runs


def _nested(
    run: Run, name: str, parent: int, tags: list[str], status: StepStatus, ms: int = 40
) -> StepRun:
    step = StepRun(index=len(run.steps), name=name, parent=parent, tags=tags)
    run.steps.append(step)
    start = run.created_at + timedelta(milliseconds=10 * len(run.steps))
    if status is StepStatus.COMPLETED:
        _done(step, start, ms, {"ok": True})
    elif status is StepStatus.FAILED:
        step.status = status
        step.started_at, step.finished_at = start, start + timedelta(milliseconds=ms)
        step.error = "OutOfStock: no stock for SKU-3"
        step.attempts = [
            Attempt(
                number=1,
                status=AttemptStatus.FAILED,
                started_at=start,
                finished_at=step.finished_at,
                error=step.error,
            )
        ]
    return step


def flow_control_runs() -> list[Run]:
    """Runs of the flow-control issue: middleware, a for_each with a subworkflow per item, a
    try/catch, and runs held or ended by the scheduling gates."""
    batch = Run(
        id=rid(13),
        workflow_name="orders.batch",
        workflow_version="77d0e1aa",
        queue="orders",
        job_id=jid(13),
        status=RunStatus.RUNNING,
        input={"orders": ["A1001", "A1002"]},
        created_at=at(1),
        started_at=at(1),
        worker="showcase:1",
        attempts=6,
        failed_attempts=1,
    )
    auth = StepRun(index=0, name="check_token", tags=["mw:auth"])
    items = StepRun(index=1, name="orders", kind="for_each", status=StepStatus.RUNNING)
    safe = StepRun(index=2, name="reserve_safely", kind="try_catch")
    batch.steps = [auth, items, safe]
    _done(auth, batch.created_at, 4, {"user": "ops"})
    items.started_at = batch.created_at + timedelta(milliseconds=5)
    for n, state in ((1, StepStatus.COMPLETED), (2, StepStatus.RUNNING)):
        tag = f"iteration {n}"
        _nested(batch, "price", 1, [tag], StepStatus.COMPLETED)
        ship = _nested(batch, "ship", 1, [tag, "sub"], state, ms=900)
        ship.kind = "subworkflow"
        ship.child_run_id = rid(13 + n)
        if state is StepStatus.RUNNING:
            ship.status = StepStatus.WAITING
            ship.started_at = NOW - timedelta(seconds=3)
    _nested(batch, "notify_async", 1, ["iteration 1", "async"], StepStatus.COMPLETED, ms=2)
    _done(safe, batch.created_at, 60)
    _nested(batch, "reserve", 2, ["try"], StepStatus.FAILED)
    _nested(batch, "backorder", 2, ["catch"], StepStatus.COMPLETED)
    children = []
    for n in (1, 2):
        child = Run(
            id=rid(13 + n),
            workflow_name="shipping.label",
            workflow_version="1c9e02f3",
            queue="orders",
            job_id=jid(13 + n),
            status=RunStatus.COMPLETED if n == 1 else RunStatus.RUNNING,
            input={"order_id": f"A100{n}"},
            created_at=at(0.9),
            started_at=at(0.9),
            finished_at=at(0.9) + timedelta(milliseconds=850) if n == 1 else None,
            parent_run_id=batch.id,
            depth=1,
            worker="showcase:1",
            steps=_steps(["label", "book_courier"]),
            attempts=2,
        )
        _done(child.steps[0], child.created_at, 300, {"label": f"L-{n}"})
        if n == 1:
            _done(child.steps[1], child.created_at, 550, {"courier": "DHL"})
        else:
            child.steps[1].status = StepStatus.RUNNING
            child.steps[1].started_at = child.created_at + timedelta(milliseconds=300)
        children.append(child)
    throttled = _order(16, 0.5, RunStatus.THROTTLED, started_at=None)
    throttled.error = "throttled: 2 runs of key 'acme' hold its 2 slots"
    throttled.run_at = NOW + timedelta(seconds=3)
    throttled.steps = []  # no worker has started it: its steps are not laid out yet
    debounced = _order(17, 0.3, RunStatus.DEBOUNCED, started_at=None)
    debounced.finished_at = at(0.25)
    debounced.output = {"debounced_into": rid(9)}
    debounced.error = f"debounced: joined run {rid(9)} (trailing, 2s window)"
    return [batch, *children, throttled, debounced]


WORKERS = [
    WorkerInfo(
        id="showcase:1",
        host="showcase",
        pid=1,
        started_at=NOW - timedelta(minutes=31),
        heartbeat_at=NOW - timedelta(seconds=1),
    ),
    WorkerInfo(
        id="showcase:2",
        host="showcase",
        pid=2,
        started_at=NOW - timedelta(minutes=12),
        heartbeat_at=NOW - timedelta(seconds=2),
    ),
    WorkerInfo(
        id="laptop:4242",
        host="laptop",
        pid=4242,
        started_at=NOW - timedelta(hours=3),
        heartbeat_at=NOW - timedelta(minutes=40),
    ),
]


def showcase_jobs(runs: list[Run]) -> list[Job]:
    state = {
        RunStatus.COMPLETED: JobState.COMPLETED,
        RunStatus.FAILED: JobState.DEAD,
        RunStatus.TIMED_OUT: JobState.FAILED,
        RunStatus.RUNNING: JobState.ACTIVE,
        RunStatus.WAITING: JobState.DELAYED,
        RunStatus.QUEUED: JobState.WAITING,
        RunStatus.THROTTLED: JobState.DELAYED,
        RunStatus.DEBOUNCED: JobState.COMPLETED,
    }
    jobs = []
    for run in runs:
        if run.id in (rid(4), rid(6)):
            continue  # run 4's job went on to run 5; run 6's job was removed since
        job = Job(
            id=run.job_id,
            queue=run.queue,
            workflow_name=run.workflow_name,
            payload=run.input,
            state=state[run.status],
            run_id=run.id,
            created_at=run.created_at,
            finished_at=run.finished_at,
            error=run.error,
            attempts=run.job_attempt,
            max_retries=2 if run.queue == "webhooks" else 1,
            # Far in the future, so that "delayed" never turns "waiting" under a real clock.
            run_at=datetime(2099, 1, 1, tzinfo=UTC)
            if run.status in (RunStatus.WAITING, RunStatus.THROTTLED)
            else None,
            worker=run.worker if run.status is RunStatus.RUNNING else None,
        )
        jobs.append(job)
    return jobs


def workflows_folder(root: Path) -> Path:
    """A copy of the bundled examples."""
    folder = root / "workflows"
    folder.mkdir(parents=True, exist_ok=True)
    source = Path(examples.__file__).parent
    for path in source.glob("*.py"):
        if path.name != "__init__.py":
            shutil.copy(path, folder / path.name)
    return folder


def break_a_workflow(folder: Path) -> None:
    """Add a workflow file that fails to load, at line 13."""
    (folder / "refunds.py").write_text(BROKEN)


async def build(root: Path) -> tuple[Path, Path]:
    """Write the scene under `root`; returns (workflows folder, database)."""
    folder = workflows_folder(root)
    database = root / "blok.db"
    async with Engine(workflows=folder, database=database, consume=False) as engine:
        runs = showcase_runs()
        store = engine.backend.runs
        await engine.backend.queue("sqlite").add(showcase_jobs(runs), [])
        for run in runs:
            store.save_run(run)
            for line in [*run.logs, *(line for step in run.steps for line in step.logs)]:
                store.add_log(run.id, line)
        await store.flush()
    return folder, database


@asynccontextmanager
async def scene_engine(folder: Path, database: Path) -> AsyncIterator[Engine]:
    """The engine over the scene. Its own worker row carries the real host and pid, so the
    console is shown the scene's fixed workers instead."""
    async with Engine(workflows=folder, database=database, consume=False) as engine:

        async def fixed_workers() -> list[WorkerInfo]:
            return list(WORKERS)

        def alive_at_now(worker: WorkerInfo) -> bool:
            return worker_alive(worker, NOW)  # the engine's rule, on the scene's clock

        def state_at_now(worker: WorkerInfo) -> str:
            return worker_state(worker, NOW)  # the engine's rule, on the scene's clock

        def orphaned_at_now(
            run: Run, job: Job | None, workers: Sequence[WorkerInfo]
        ) -> Orphan | None:
            return orphaned(run, job, workers, NOW)  # the engine's rule, on the scene's clock

        queues = engine.queues

        async def served_queues() -> list[QueueInfo]:
            # The scene's fixed workers serve its queues (this engine consumes nothing).
            return [queue.model_copy(update={"served": True}) for queue in await queues()]

        # What the engine works out from the time (a wait that is due) on the scene's clock too.
        engine.backend.clock.now = lambda: NOW  # type: ignore[method-assign]
        engine.workers = fixed_workers  # type: ignore[method-assign]
        engine.queues = served_queues  # type: ignore[method-assign]
        engine.worker_alive = alive_at_now  # type: ignore[method-assign]
        engine.worker_state = state_at_now  # type: ignore[method-assign]
        engine.orphaned = orphaned_at_now  # type: ignore[method-assign]
        yield engine


def app(folder: Path, database: Path) -> BlokApp:
    """The real console over the scene, with the clock stopped at NOW."""
    return BlokApp(
        open_engine=lambda: scene_engine(folder, database),
        clock=lambda: NOW,
        tz=UTC,
        where="db .blok/blok.db",
    )
