"""Health: `engine.health()` and `blok-tui health` — the database answers, a worker is alive, no
queue's oldest waiting job is older than the threshold; and the queue read it rests on,
`JobQueue.oldest_waiting`, on each backend."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from cli_helpers import blok, eventually, start_worker, write_workflows
from support import any_database, until

from engine import Engine, Step, UnknownQueue, WorkerTrigger, Workflow
from engine.backends import open_backend
from engine.ledger import make_job, make_run
from engine.models import utcnow

database = any_database  # the fixture: each of DATABASES in turn (tests/support.py)


# ---- the queue read ------------------------------------------------------------------------
@pytest.mark.anyio
async def test_oldest_waiting_is_when_the_longest_waiting_due_job_became_due(
    database: Path | str | None,
) -> None:
    now = utcnow()

    def job(created_ago_s: float, run_at_in_s: float | None = None, queue: str = "q") -> Any:
        made = make_job(
            queue=queue,
            workflow_name="w",
            payload={},
            headers=None,
            priority=0,
            run_at=now + timedelta(seconds=run_at_in_s) if run_at_in_s is not None else None,
            max_retries=0,
        )
        made.created_at = now - timedelta(seconds=created_ago_s)
        return made

    async with open_backend(database) as backend:
        queue = backend.queue(None)
        assert await queue.oldest_waiting("q") is None
        # A job not due yet is not waiting: a queue with only such a job has none waiting.
        later = job(600, run_at_in_s=3600, queue="later")
        await queue.add([later], [make_run(later, workflow_version="v1")])
        assert await queue.oldest_waiting("later") is None
        jobs = [
            job(60, run_at_in_s=-10),  # delayed, due for 10 s: waits since its run_at
            job(30),  # due since it was made, 30 s ago: the oldest
            job(600, run_at_in_s=3600),  # not due for an hour: not waiting
            job(5),
        ]
        await queue.add(jobs, [make_run(j, workflow_version="v1") for j in jobs])
        oldest = await queue.oldest_waiting("q")
        assert oldest is not None
        assert abs((oldest - jobs[1].created_at).total_seconds()) < 0.01
        assert await queue.oldest_waiting("other") is None
        # Once the oldest is claimed, the next one is.
        claims = await queue.claim("q", 1, "w1", 30.0, timeout=1)
        assert [c.job.id for c in claims] == [jobs[0].id]  # same priority: first added first
        claims = await queue.claim("q", 1, "w1", 30.0, timeout=1)
        assert [c.job.id for c in claims] == [jobs[1].id]
        later = await queue.oldest_waiting("q")
        assert later is not None
        assert abs((later - jobs[3].created_at).total_seconds()) < 0.01


# ---- engine.health() -----------------------------------------------------------------------
def blocking_flow(release: anyio.Event) -> Workflow:
    async def hold(ctx: Any) -> str:
        await release.wait()
        return "done"

    return Workflow(
        name="one.at.a.time",
        trigger=WorkerTrigger(queue="narrow", concurrency=1),
        steps=[Step("hold", hold)],
    )


@pytest.mark.anyio
async def test_health_fails_once_a_queue_leaves_a_job_waiting_too_long(
    database: Path | str | None,
) -> None:
    release = anyio.Event()
    async with Engine(workflows=[blocking_flow(release)], database=database) as e:
        healthy = await e.health()
        assert healthy.ok, healthy.reason
        assert healthy.workers_alive == 1
        first = await e.enqueue("narrow", {})

        async def running() -> bool:
            return (await e.queue_stats("narrow")).active == 1

        await until(running)
        await e.enqueue("narrow", {})  # waits behind the first: the only slot is taken

        async def stale() -> bool:
            return not (await e.health(max_age="100ms")).ok

        await until(stale)
        report = await e.health(max_age="100ms")
        assert report.reason.startswith("queue narrow: its oldest waiting job has waited")
        assert "narrow" in report.waiting
        assert (await e.health(max_age="1h")).ok  # the same wait is fine with more patience

        await e.pause("narrow")  # a paused queue holds its jobs on purpose
        paused = await e.health(max_age="100ms")
        assert paused.ok
        # ... and the healthy answer says so: "no job waiting" was said of a paused queue
        # that held 16.
        assert "; queue narrow is paused with 1 job(s) waiting" in paused.reason, paused.reason
        await e.resume("narrow")
        release.set()
        await e.wait_for_job(first, timeout=10)


@pytest.mark.anyio
async def test_a_healthy_answer_counts_the_dead_letters(database: Path | str | None) -> None:
    # A total outage (every job failing into the dead-letter queue) read "healthy: ... no job
    # waiting", and the probe saw nothing.
    async def declined(ctx: Any) -> None:
        raise ValueError("declined")

    flow = Workflow(name="pay", trigger=WorkerTrigger(queue="pay"), steps=[Step("go", declined)])
    async with Engine(workflows=[flow], database=database) as e:
        assert "dead letter" not in (await e.health()).reason
        for _ in range(2):
            await e.wait_for_job(await e.enqueue("pay", {}), timeout=10)
        report = await e.health()
        assert report.ok and report.reason.endswith("; 2 dead letter(s) (blok-tui dead QUEUE)")


# ---- blok-tui health -----------------------------------------------------------------------
def test_blok_tui_health_exit_codes(tmp_path: Path) -> None:
    db = tmp_path / "blok.db"
    missing = blok("health", "--db", tmp_path / "nowhere.db")
    assert missing.returncode == 1
    assert missing.stderr.startswith("blok-tui: error: unhealthy: ")
    assert "nowhere.db" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1

    folder = write_workflows(tmp_path / "workflows")
    worker = start_worker(db, folder, "--no-watch")
    try:
        ok = blok("health", "--db", db)
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.startswith("healthy: ") and "1 worker alive" in ok.stdout

        # One slot, taken until the test releases it (a fixed nap raced the commands' start on
        # a loaded machine): the next job waits, and past --max-age that is unhealthy.
        release = tmp_path / "release"
        held = json.dumps({"seconds": 60, "until": str(release)})
        for body in (held, '{"seconds": 0}'):
            enqueued = blok("enqueue", "single", body, "--db", db)
            assert enqueued.returncode == 0, enqueued.stderr

        def stale() -> Any:
            done = blok("health", "--db", db, "--max-age", "300ms")
            return done if done.returncode == 1 else None

        done = eventually(stale, timeout=10)
        assert done.stderr.startswith(
            "blok-tui: error: unhealthy: queue single: its oldest waiting job has waited"
        ), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert blok("health", "--db", db, "--max-age", "1h").returncode == 0
        release.touch()
    finally:
        assert worker.stop() == 0, worker.stderr()

    gone = blok("health", "--db", db, "--max-age", "1h")
    assert gone.returncode == 1
    assert gone.stderr.strip() == f"blok-tui: error: unhealthy: no worker alive on {db}"


@pytest.mark.anyio
async def test_health_names_a_workflow_file_that_fails_to_load_on_a_live_worker(
    tmp_path: Path,
) -> None:
    """A headless operator saw "healthy" and nothing else while a workflow file failed to load
    on the worker: only its log and an attached console said so."""
    folder = write_workflows(tmp_path / "workflows")
    broken = folder / "broken.py"
    broken.write_text("from engine import Workflow\n\nworkflow = Workflow(\n")
    async with Engine(workflows=folder, database=tmp_path / "blok.db") as engine:
        health = await engine.health()
        assert health.ok
        assert "; 1 workflow file failed to load on live workers: " in health.reason
        assert f"{broken.resolve()}:3: SyntaxError" in health.reason


@pytest.mark.anyio
async def test_a_queue_renamed_with_jobs_left_on_it_stays_listed_and_health_says_so(
    tmp_path: Path,
) -> None:
    # A deploy renamed the trigger's queue ("orders" → "orders-v2"): the old queue's jobs
    # waited for a worker that would never come, and `queues()` (the console's queues view,
    # `blok-tui queues`) dropped its row at once while `health` said "no job waiting".
    database = tmp_path / "blok.db"

    def orders(queue: str) -> Workflow:
        return Workflow(
            name="orders.process",
            trigger=WorkerTrigger(queue=queue),
            steps=[Step("go", lambda ctx: "ok")],
        )

    async with Engine(workflows=[orders("orders")], database=database) as before:
        for order in ("A1", "A2"):  # left on it when the rename lands
            await before.enqueue("orders", {"order_id": order}, delay="1h")
    async with Engine(workflows=[orders("orders-v2")], database=database) as after:
        listed = {q.name: q for q in await after.queues()}
        assert set(listed) == {"orders", "orders-v2"}
        stranded = listed["orders"]
        assert (stranded.served, stranded.workflow_name) == (False, "orders.process")
        assert (await after.queue_stats("orders")).delayed == 2
        report = await after.health()
        assert report.ok
        assert (
            "; queue orders has 2 job(s) not ended and no live worker serves it (was its "
            "workflow file removed, or its queue renamed?)"
        ) in report.reason
        # A queue that never held a job stays unknown: a typo is not a stranded queue.
        with pytest.raises(UnknownQueue):
            await after.queue_stats("ordres")
