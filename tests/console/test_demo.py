"""The demo producer shows a newcomer every feature early: retries, a slow run, a wait, a
timeout and a dead letter, over the bundled example workflows."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import examples
from blok_tui.demo import demo_producer
from engine import AttemptFailed, Engine, RunFinished, RunStarted, RunStatusChanged

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
