"""The demo producer shows a newcomer every feature early: retries, a slow run, a wait, a
timeout and a dead letter, over the bundled example workflows."""

from __future__ import annotations

from collections.abc import Awaitable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from support import until

import examples
from blok_tui.demo import OPENING, demo_producer, demo_producer_for
from engine import (
    AttemptFailed,
    Engine,
    RunFinished,
    RunStarted,
    RunStatusChanged,
    Step,
    WorkerTrigger,
    Workflow,
)

pytestmark = pytest.mark.anyio


async def test_the_opening_shows_every_feature_within_ten_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    folder = Path(examples.__file__).parent
    seen: set[str] = set()
    wanted = {"retry", "slow", "wait", "timed_out", "dead"}
    # exit_when_stuck=False: a run whose code did not stop at the end would otherwise end the
    # process (the test runner's), and say nothing; here it fails the test with its run ids.
    async with Engine(workflows=folder, grace_period=0.2, exit_when_stuck=False) as engine:
        events = engine.events()
        async with anyio.create_task_group() as tg:
            tg.start_soon(demo_producer, engine)
            with anyio.fail_after(10):
                async for event in events:
                    match event:
                        case AttemptFailed():
                            seen.add("retry")
                        case RunStarted(queue="reports"):
                            seen.add("slow")
                        case RunStatusChanged(status="waiting"):
                            seen.add("wait")
                        case RunFinished(status="timed_out"):
                            seen.add("timed_out")
                        case RunFinished(queue="webhooks", status="failed"):
                            if await engine.dead_letters("webhooks"):
                                seen.add("dead")
                    if wanted <= seen:
                        break
            tg.cancel_scope.cancel()
        await events.aclose()
    assert wanted <= seen
    assert not [r.message for r in caplog.records if "did not stop" in r.getMessage()]


async def test_a_warming_webhook_fails_its_first_delivery_then_completes() -> None:
    """What the console marks `↻ then completed`: a failed run whose job went on to complete."""
    folder = Path(examples.__file__).parent
    async with Engine(workflows=folder, grace_period=0.2) as engine:
        job = await engine.enqueue("webhooks", {"url": "https://warming.example.com/h"})
        done = await engine.wait_for_job(job, timeout=10)
        runs = await engine.runs(queue="webhooks")
    assert done.status == "completed" and done.job_attempt == 2
    assert sorted(str(r.status) for r in runs) == ["completed", "failed"]


def orders_only() -> Engine:
    """An engine on the demo's `orders` queue alone, its runs held (the queue paused at the
    start): what the producer enqueued stays there to be counted."""

    def echo(ctx: Any) -> None:
        return None

    trigger = WorkerTrigger(queue="orders", concurrency=1)
    return Engine(
        workflows=[Workflow(name="orders.echo", trigger=trigger, steps=[Step("echo", echo)])]
    )


async def test_one_demo_producer_feeds_a_database_however_many_consoles_serve_it(
    tmp_path: Path,
) -> None:
    # A second console on the demo's database started a second producer: twice the jobs, and
    # the opening (the retry, the dead letter...) played again.
    lock = tmp_path / "blok.db.demo"
    opening = [payload for _, payload in OPENING]
    async with orders_only() as first, orders_only() as second, anyio.create_task_group() as tg:
        await first.pause("orders")
        await second.pause("orders")

        async def orders(engine: Engine) -> list[dict[str, Any]]:
            return [run.input for run in await engine.runs(queue="orders", limit=1000)]

        feeding = anyio.CancelScope()

        async def feed_first() -> None:
            with feeding:
                await demo_producer_for(first, lock, pace=0.01)

        tg.start_soon(feed_first)
        await until(lambda: orders(first), timeout=5)
        tg.start_soon(partial(demo_producer_for, second, lock, pace=0.01, recheck=0.01))
        count = len(await orders(first))
        await until(lambda: _more_than(orders(first), count + 20), timeout=10)
        assert await orders(second) == []  # it looked again at least 20 times meanwhile
        feeding.cancel()  # the first console quits: the second takes over, with the trickle
        await until(lambda: orders(second), timeout=5)
        assert not [p for p in await orders(second) if p in opening]
        tg.cancel_scope.cancel()


async def _more_than(counted: Awaitable[list[Any]], n: int) -> bool:
    return len(await counted) > n
