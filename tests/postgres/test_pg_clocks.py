"""Machines whose clocks disagree share one PostgreSQL database: the moments that decide who
may start (a debounce window open or closed; rate windows: test_pg_rate_limits.py) and who is
alive (a heartbeat) are the server's, never a worker's. A worker in
another process whose clock runs two minutes ahead (as an unsynchronised machine's may; the
producer and this process keep the right time) stands for such a machine."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import anyio
import pytest
from anyio.streams.text import TextReceiveStream
from pg import NO_DRIVER
from support import add_unserved

pytest.importorskip("asyncpg", reason=NO_DRIVER)

from engine import Engine, RunStatus, Step, WorkerTrigger, Workflow
from engine.liveness import worker_alive
from engine.models import WorkerInfo, utcnow

pytestmark = pytest.mark.anyio

AHEAD_S = 120.0
WORKFLOW = """
from engine import Debounce, Step, WorkerTrigger, Workflow


def press(ctx):
    return ctx.body["n"]


workflow = Workflow(
    name="press",
    trigger=WorkerTrigger(
        queue="press",
        provider="postgres",
        debounce=Debounce("$.body.button", delay="60s", mode="leading"),
    ),
    steps=[Step("press", press)],
)
"""  # leading: a burst's first press runs, the presses within a minute of it join its run
AHEAD = f"""
import sys, time

real = time.time
time.time = lambda: real() + {AHEAD_S}  # this machine's clock runs two minutes ahead

import anyio
from engine import Engine


async def main(url: str, workflows: str) -> None:
    async with Engine(workflows=workflows, database=url):
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)  # until the test closes it


anyio.run(main, sys.argv[1], sys.argv[2])
"""


async def test_a_worker_whose_clock_runs_ahead_keeps_a_burst_in_its_window(
    pg_schema: str, tmp_path: Path
) -> None:
    (tmp_path / "press.py").write_text(WORKFLOW)
    async with Engine(workflows=str(tmp_path), database=pg_schema) as here:
        first = await here.enqueue("press", {"button": "a", "n": 1})
        assert (await here.wait_for_job(first, timeout=20)).status is RunStatus.COMPLETED
    command = [sys.executable, "-c", AHEAD, pg_schema, str(tmp_path)]
    async with await anyio.open_process(command, stderr=subprocess.STDOUT) as ahead:
        assert ahead.stdout is not None and ahead.stdin is not None
        said = ""
        with anyio.fail_after(30):
            async for text in TextReceiveStream(ahead.stdout):
                said += text
                if "ready\n" in said:
                    break
        assert "ready\n" in said, said  # else it ended before it was ready: its output
        async with Engine(database=pg_schema) as producer:
            second = await producer.enqueue("press", {"button": "a", "n": 2})
            run = await producer.wait_for_job(second, timeout=20)
        await ahead.stdin.aclose()
        with anyio.fail_after(30):
            await ahead.wait()
    # Within the minute by the server's clock: the press joins the first run. By the worker's
    # own clock the window had closed a minute before, and the press ran again.
    assert run.status is RunStatus.DEBOUNCED, (run.status, run.logs)


async def test_a_worker_whose_clock_runs_behind_is_alive_while_it_beats(pg_schema: str) -> None:
    """Its heartbeat is a moment on its own clock, two minutes behind: read against another
    machine's clock it looked two minutes old, and recovery took the jobs it was running (a
    second run of each, while the first went on). The heartbeat is the server's moment."""
    now = utcnow()
    behind = WorkerInfo(
        id="behind:7:0a0b0c",
        host="behind",
        pid=7,
        process="another-boot/4026531836#812",
        started_at=now - timedelta(seconds=AHEAD_S),
        heartbeat_at=now - timedelta(seconds=AHEAD_S),  # "now", by its clock
    )
    async with Engine(database=pg_schema) as producer:
        producer.backend.shared.heartbeat(behind)
        [seen] = [w for w in await producer.backend.shared.workers() if w.id == behind.id]
        queue = producer.backend.queue("postgres")
        await add_unserved(queue, "echo", [{"i": 1}])
        [claim] = await queue.claim("echo", 1, behind.id, 3600.0)
    assert worker_alive(seen)
    assert abs((seen.heartbeat_at - utcnow()).total_seconds()) < 5.0
    trigger = WorkerTrigger(queue="echo", provider="postgres")
    echo = Workflow(name="echo", trigger=trigger, steps=[Step("echo", lambda ctx: "done")])
    async with Engine(workflows=[echo], database=pg_schema) as worker:
        # Its recovery ran as it opened, and again here: the job stays the other worker's.
        assert worker._chores is not None and await worker._chores.recover() == 0
        assert (await worker.get_job(claim.job.id)).worker == behind.id
