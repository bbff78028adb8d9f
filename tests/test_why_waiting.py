"""engine.why_waiting on memory, SQLite and PostgreSQL: the gate that holds a pending run, its key, the runs
holding its slots, and when it may start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from support import DATABASES, a_database, add_unserved, any_database, job_run, run_when, until

from engine import Debounce, Engine, RunStatus, Step, WorkerTrigger, Workflow, wait
from engine.waiting import served

pytestmark = pytest.mark.anyio


database = any_database  # the fixture: each of DATABASES in turn (tests/support.py)


async def test_a_concurrency_key_names_the_runs_in_its_slots(database: Path | str | None) -> None:
    release = anyio.Event()

    async def hold(ctx: Any) -> None:
        await release.wait()

    wf = Workflow(
        name="tenants",
        trigger=WorkerTrigger(
            queue="tenants", concurrency=4, concurrency_key="$.body.tenant", on_limit="queue"
        ),
        steps=[Step("hold", hold)],
    )
    async with Engine(workflows=[wf], database=database) as engine:
        first = await engine.enqueue("tenants", {"tenant": "acme"})

        await run_when(engine, first, RunStatus.RUNNING)
        second = await engine.enqueue("tenants", {"tenant": "acme"})

        async def held() -> bool:
            run = await job_run(engine, second)
            return run.status is RunStatus.QUEUED and run.run_at is not None

        await until(held)
        why = await engine.why_waiting((await job_run(engine, second)).id)
        assert (why.gate, why.key) == ("concurrency", "acme")
        assert why.holders == ((await job_run(engine, first)).id,)
        assert why.until is not None and "1 run(s) hold its slots" in why.summary
        release.set()
        for job_id in (first, second):
            assert (await engine.wait_for_job(job_id, timeout=15)).status is RunStatus.COMPLETED


async def test_debounce_pause_and_delay_say_what_holds_them(database: Path | str | None) -> None:
    wf = Workflow(
        name="search.index",
        trigger=WorkerTrigger(queue="index", debounce=Debounce(key="$.body.doc", delay="1h")),
        steps=[Step("index", lambda ctx: None)],
    )
    async with Engine(workflows=[wf], database=database) as engine:
        job_id = await engine.enqueue("index", {"doc": "d1"})

        async def debounced() -> bool:
            return (await job_run(engine, job_id)).run_at is not None

        await until(debounced)
        why = await engine.why_waiting((await job_run(engine, job_id)).id)
        assert (why.gate, why.key) == ("debounce", "d1") and why.until is not None
        await engine.pause("index")
        assert (await engine.why_waiting((await job_run(engine, job_id)).id)).gate == "paused"
        await engine.resume("index")
        later = await engine.enqueue("index", {"doc": "d2"}, delay="1h")
        why = await engine.why_waiting((await job_run(engine, later)).id)
        assert why.gate == "delay" and why.until is not None
        done = await engine.cancel((await job_run(engine, later)).id)
        assert (await engine.why_waiting(done.id)).gate == "ended"


@pytest.mark.parametrize("kind", [d for d in DATABASES if d != "memory"])
async def test_a_queued_run_no_live_worker_serves_says_so(
    kind: str, tmp_path: Path, anyio_backend: str
) -> None:
    """Its workers stopped, a producer still enqueues to their queue (what they served stays
    known): the run waits for the next worker, and says so, until one starts."""
    wf = Workflow(
        name="mail.send", trigger=WorkerTrigger(queue="mail"), steps=[Step("send", lambda ctx: 1)]
    )
    async with a_database(kind, tmp_path) as database:
        async with Engine(workflows=[wf], database=database) as first:
            assert await served(first.backend, "mail")
            assert not await served(first.backend, "post")
        async with Engine(database=database, create=False) as producer:
            job_id = await producer.enqueue("mail", {})
            why = await producer.why_waiting((await job_run(producer, job_id)).id)
            assert why.gate == "no_worker", why
            assert why.summary == (
                "no live worker serves queue 'mail': it starts once one does (blok-tui worker)"
            )
            async with Engine(workflows=[wf], database=database) as second:
                run = await second.wait_for_job(job_id, timeout=10)
                assert run.status is RunStatus.COMPLETED


def _sleeper(queue: str) -> Workflow:
    return Workflow(
        name="orders.ship",
        trigger=WorkerTrigger(queue=queue),
        steps=[wait.for_("100ms", name="cooldown"), Step("ship", lambda ctx: "shipped")],
    )


@pytest.mark.parametrize("kind", [d for d in DATABASES if d != "memory"])
async def test_a_run_whose_queue_the_live_workers_no_longer_serve_says_so(
    kind: str, tmp_path: Path, anyio_backend: str
) -> None:
    """Its queue renamed under a live worker: a waiting run said "sleeping until 08:55:13" at
    08:55:28, for ever, and a queued one "no live worker serves queue", with one alive."""
    async with a_database(kind, tmp_path) as database:
        async with Engine(workflows=[_sleeper("orders")], database=database) as first:
            waiting = await job_run(first, await first.enqueue("orders", {}))
            await run_when(first, waiting.job_id, RunStatus.WAITING)
        async with Engine(workflows=[_sleeper("fulfil")], database=database) as second:
            provider = "postgres" if kind == "postgres" else "sqlite"
            [job] = await add_unserved(second.backend.queue(provider), "orders", [{}])
            queued = await job_run(second, job.id)
            slept = await second.get_run(waiting.id)
            assert slept.wait_until is not None
            await until(lambda: second.now() > slept.wait_until, timeout=10)
            why_waiting = await second.why_waiting(waiting.id)
            why_queued = await second.why_waiting(queued.id)
    renamed = (
        "no live worker serves queue 'orders' (those alive serve fulfil; was its workflow file "
        "removed, or its queue renamed?): it {} once one serves 'orders' again"
    )
    assert why_waiting.gate == why_queued.gate == "no_worker"
    assert why_waiting.summary == (
        f"due since {slept.wait_until.isoformat(timespec='seconds')}; " + renamed.format("goes on")
    )
    assert why_queued.summary == renamed.format("starts")
