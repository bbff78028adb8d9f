"""Machines whose clocks disagree share one PostgreSQL database: every moment the engine writes
or compares (when a delayed job, a wait or a retry is due, whether a run outlived its ttl, a
debounce window, a heartbeat; rate windows: test_pg_rate_limits.py) is on the server's clock,
never on a machine's own. A process whose clock runs two minutes ahead or behind (time.time and
datetime.now alike, as on an unsynchronised machine; this process and the server keep the right
time) stands for such a machine."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream
from pg import NO_DRIVER
from support import add_unserved, raised_at, until

pytest.importorskip("asyncpg", reason=NO_DRIVER)

from engine import Engine, RunStatus, Step, StepStatus, WorkerTrigger, Workflow
from engine.liveness import worker_alive
from engine.models import WorkerInfo, utcnow

pytestmark = pytest.mark.anyio

AHEAD_S = 120.0
WORKFLOWS = """
from engine import Debounce, Schedule, Step, WorkerTrigger, Workflow, wait


def done(ctx):
    return ctx.body.get("n", "done")


def flaky(ctx):
    if ctx.job.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return "done"


PRESSES = Debounce("$.body.button", delay="60s", mode="leading")


def flow(name, *steps, schedules=(), **trigger):
    return Workflow(
        name=name,
        trigger=WorkerTrigger(queue=name, provider="postgres", **trigger),
        steps=list(steps),
        schedules=list(schedules),
    )


workflows = [
    # leading: a burst's first press runs, the presses within a minute of it join its run
    flow("press", Step("press", done), debounce=PRESSES),
    flow("nap", wait.for_("1s", name="nap"), Step("done", done)),
    flow("flaky", Step("flaky", flaky)),
    flow("later", Step("done", done)),
    flow("fresh", Step("done", done), ttl="60s"),
    flow("tick", Step("done", done), schedules=[Schedule(every="1s")]),
    flow("charge", Step("charge", done, idempotency_key="$.body.order", idempotency_ttl="60s")),
]
"""
# argv: the clock's offset in seconds, the database, the workflows folder ('' for none), and
# jobs to enqueue as JSON ([queue, payload, options] each). It prints each job's id, what its
# engine reads as now, how long ago each worker's heartbeat was and which workers it finds alive,
# then "ready", and runs until its stdin is closed.
SKEWED = """
import json, sys, time

import time_machine

time_machine.travel(time.time() + float(sys.argv[1]), tick=True).start()

import anyio
from engine import Engine


async def main(offset: str, url: str, workflows: str, jobs: str) -> None:
    async with Engine(workflows=workflows or None, database=url) as engine:
        for queue, payload, options in json.loads(jobs):
            print("job", await engine.enqueue(queue, payload, **options), flush=True)
        now = engine.now()
        print("now", now.timestamp(), flush=True)
        ages = [(now - w.heartbeat_at).total_seconds() for w in await engine.workers()]
        print("heartbeats", json.dumps(ages, separators=(",", ":")), flush=True)
        alive = [w.id for w in await engine.live_workers()]
        print("alive", json.dumps(alive, separators=(",", ":")), flush=True)
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)  # until the test closes it


anyio.run(main, *sys.argv[1:5])
"""


@asynccontextmanager
async def skewed(
    offset_s: float, url: str, workflows: Path | None = None, jobs: list[Any] | None = None
) -> AsyncIterator[tuple[Process, list[str]]]:
    """A process whose clock is `offset_s` off, ready, and the lines it printed until then."""
    folder = "" if workflows is None else str(workflows)
    command = [sys.executable, "-c", SKEWED, str(offset_s), url, folder, json.dumps(jobs or [])]
    async with await anyio.open_process(command, stderr=subprocess.STDOUT) as process:
        assert process.stdout is not None and process.stdin is not None
        said = ""
        with anyio.fail_after(30):
            async for text in TextReceiveStream(process.stdout):
                said += text
                if "ready\n" in said:
                    break
        assert "ready\n" in said, said  # else it ended before it was ready: its output
        yield process, said.splitlines()
        await process.stdin.aclose()
        with anyio.fail_after(30):
            await process.wait()


def other_machine(worker_id: str, beat_at: datetime) -> WorkerInfo:
    """The row of a worker on another machine, whose heartbeat says `beat_at` by its clock."""
    host, pid, _ = worker_id.split(":")
    return WorkerInfo(
        id=worker_id,
        host=host,
        pid=int(pid),
        process="another-boot/4026531836#812",
        started_at=beat_at,
        heartbeat_at=beat_at,
    )


def said(lines: list[str], word: str) -> list[str]:
    return [line.split()[1] for line in lines if line.startswith(f"{word} ")]


async def test_an_engine_reads_the_servers_clock_whatever_its_machines_says(
    pg_schema: str, tmp_path: Path
) -> None:
    """Its times are on the server's clock: a run or a worker on another machine reads "3s ago"
    here (the console shows `engine.now()`), every machine computes a due time alike, and a
    worker known by its heartbeat alone is alive to all (its recovery as it opens, too)."""
    (tmp_path / "flows.py").write_text(WORKFLOWS)
    async with Engine(workflows=str(tmp_path), database=pg_schema) as here:
        elsewhere = other_machine("elsewhere:9:0a0b0c", beat_at=utcnow())
        here.backend.shared.heartbeat(elsewhere)
        queue = here.backend.queue("postgres")
        await add_unserved(queue, "held", [{}])
        [held] = await queue.claim("held", 1, elsewhere.id, 3600.0)
        for offset in (AHEAD_S, -AHEAD_S):
            here.backend.shared.heartbeat(elsewhere)  # a moment ago
            async with skewed(offset, pg_schema, tmp_path) as (process, lines):
                [now] = said(lines, "now")
                assert abs(float(now) - time.time()) < 5.0, (offset, float(now) - time.time())
                # Every heartbeat it reads (this process's worker's, its own) is just now...
                [beats] = said(lines, "heartbeats")
                assert len(json.loads(beats)) == 3  # a recovery that found one dead forgot it
                [alive] = said(lines, "alive")
                assert elsewhere.id in json.loads(alive), (offset, alive)
                assert all(abs(age) < 10.0 for age in json.loads(beats)), (offset, beats)
                # ... and its worker, read here, started just now and beat just now.
                [its] = [w for w in await here.workers() if w.pid == process.pid]
                for moment in (its.started_at, its.heartbeat_at):
                    assert abs((here.now() - moment).total_seconds()) < 10.0, (offset, moment)
            assert (await here.get_job(held.job.id)).worker == elsewhere.id, offset


async def test_a_worker_whose_clock_runs_ahead_keeps_a_burst_in_its_window(
    pg_schema: str, tmp_path: Path
) -> None:
    (tmp_path / "flows.py").write_text(WORKFLOWS)
    async with Engine(workflows=str(tmp_path), database=pg_schema) as here:
        first = await here.enqueue("press", {"button": "a", "n": 1})
        assert (await here.wait_for_job(first, timeout=20)).status is RunStatus.COMPLETED
    async with skewed(AHEAD_S, pg_schema, tmp_path), Engine(database=pg_schema) as producer:
        second = await producer.enqueue("press", {"button": "a", "n": 2})
        run = await producer.wait_for_job(second, timeout=20)
    # Within the minute by the server's clock: the press joins the first run. By the worker's
    # own clock the window had closed a minute before, and the press ran again.
    assert run.status is RunStatus.DEBOUNCED, (run.status, run.logs)


async def test_a_worker_whose_clock_runs_ahead_resumes_a_wait_and_retries_on_time(
    pg_schema: str, tmp_path: Path
) -> None:
    """A one-second wait and a job retry's backoff are due a second or so later by the server's
    clock. By the worker's own, two minutes later: the runs sat parked that long."""
    (tmp_path / "flows.py").write_text(WORKFLOWS)
    async with skewed(AHEAD_S, pg_schema, tmp_path), Engine(database=pg_schema) as producer:
        nap = await producer.enqueue("nap", {})
        flaky = await producer.enqueue("flaky", {}, retries=1)
        napped = await producer.wait_for_job(nap, timeout=30)
        retried = await producer.wait_for_job(flaky, timeout=30)
        napped = await producer.get_run(napped.id)  # with its steps
    assert napped.status is RunStatus.COMPLETED, (napped.status, napped.wait_until)
    assert retried.status is RunStatus.COMPLETED, (retried.status, retried.error)
    assert retried.job_attempt == 2
    waits = [step for step in napped.steps if step.name == "nap"]
    assert len(waits) == 1, [step.name for step in napped.steps]
    waited = waits[0]
    assert waited.started_at is not None and waited.finished_at is not None
    assert (waited.finished_at - waited.started_at).total_seconds() >= 0.9


async def test_a_producer_whose_clock_runs_ahead_delays_a_job_by_its_delay(
    pg_schema: str, tmp_path: Path
) -> None:
    """By its own clock, the job was due two minutes and a second later."""
    (tmp_path / "flows.py").write_text(WORKFLOWS)
    jobs = [["later", {}, {"delay": "1s"}]]
    async with (
        Engine(workflows=str(tmp_path), database=pg_schema) as worker,
        skewed(AHEAD_S, pg_schema, jobs=jobs) as (_, lines),
    ):
        [job_id] = said(lines, "job")
        run = await worker.wait_for_job(job_id, timeout=30)
    assert run.status is RunStatus.COMPLETED, (run.status, run.run_at)
    assert run.started_at is not None
    assert (run.started_at - run.created_at).total_seconds() >= 0.9


async def test_a_producer_whose_clock_runs_behind_keeps_a_jobs_delay_and_ttl(
    pg_schema: str, tmp_path: Path
) -> None:
    """By its own clock, the delayed job was due two minutes before it was enqueued (it ran at
    once), and the job with a one-minute ttl was made two minutes before (it expired)."""
    (tmp_path / "flows.py").write_text(WORKFLOWS)
    jobs = [["later", {}, {"delay": "6s"}], ["fresh", {}, {}]]
    async with Engine(workflows=str(tmp_path), database=pg_schema) as worker:
        before = time.time()
        async with skewed(-AHEAD_S, pg_schema, jobs=jobs) as (_, lines):
            later_id, fresh_id = said(lines, "job")
            fresh = await worker.wait_for_job(fresh_id, timeout=30)
            later = await worker.wait_for_job(later_id, timeout=30)
    assert fresh.status is RunStatus.COMPLETED, (fresh.status, fresh.error)
    assert later.status is RunStatus.COMPLETED, (later.status, later.error)
    assert later.started_at is not None
    # Enqueued after `before`, so due six seconds after it at the earliest.
    assert later.started_at.timestamp() >= before + 6.0, later.started_at.timestamp() - before


async def test_a_worker_whose_clock_runs_ahead_fires_a_schedules_ticks_on_time(
    pg_schema: str, tmp_path: Path
) -> None:
    """By its own clock each tick fired two minutes early: the schedule of every machine on the
    database is one schedule, on the server's clock."""
    (tmp_path / "flows.py").write_text(WORKFLOWS)
    async with (
        skewed(AHEAD_S, pg_schema, tmp_path),
        Engine(database=pg_schema) as producer,
    ):

        async def fired() -> Any:
            [info] = [s for s in await producer.schedules() if s.workflow == "tick"]
            return info if info.last_tick_at is not None and info.last_fired_at else None

        await until(fired, timeout=30)
        info = await fired()
        seen = time.time()
    assert info.last_tick_at.timestamp() <= seen + 1.0, info.last_tick_at.timestamp() - seen
    assert info.last_fired_at.timestamp() <= seen + 1.0, info.last_fired_at.timestamp() - seen


async def test_a_step_cached_by_a_worker_whose_clock_runs_behind_stays_cached_its_ttl(
    pg_schema: str, tmp_path: Path
) -> None:
    """Its idempotency entry lasts a minute by the server's clock. By the worker's own, two
    minutes behind, it had expired a minute before it was written, and the key's next run
    charged again."""
    (tmp_path / "flows.py").write_text(WORKFLOWS)
    jobs = [["charge", {"order": "o-1"}, {}]]
    async with (
        skewed(-AHEAD_S, pg_schema, tmp_path, jobs=jobs) as (_, lines),
        Engine(database=pg_schema) as producer,
    ):
        [first] = said(lines, "job")
        assert (await producer.wait_for_job(first, timeout=30)).status is RunStatus.COMPLETED
    async with Engine(workflows=str(tmp_path), database=pg_schema) as here:
        second = await here.enqueue("charge", {"order": "o-1"})
        run = await here.get_run((await here.wait_for_job(second, timeout=30)).id)
    [charge] = [step for step in run.steps if step.name == "charge"]
    assert charge.status is StepStatus.CACHED, charge.status


async def test_a_worker_whose_clock_runs_behind_is_alive_while_it_beats(pg_schema: str) -> None:
    """Its heartbeat is a moment on its own clock, two minutes behind: read against another
    machine's clock it looked two minutes old, and recovery took the jobs it was running (a
    second run of each, while the first went on). The heartbeat is the server's moment."""
    behind = other_machine("behind:7:0a0b0c", utcnow() - timedelta(seconds=AHEAD_S))
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


# argv: the clock's offset in seconds, the database and a run to cancel. It prints the run's
# status and error once `cancel` returned.
CANCELS = """
import sys, time

import time_machine

time_machine.travel(time.time() + float(sys.argv[1]), tick=True).start()

import anyio
from engine import Engine


async def main(offset: str, url: str, run_id: str) -> None:
    async with Engine(database=url) as engine:
        run = await engine.cancel(run_id)
        print("cancelled", run.status, run.error, flush=True)


anyio.run(main, *sys.argv[1:4])
"""


async def test_an_operator_whose_clock_runs_ahead_asks_the_live_holder_to_cancel(
    pg_schema: str,
) -> None:
    """The run's job is held by a live worker here, its lease half a minute on the server's
    clock. By the operator's own clock, two minutes ahead, that lease had run out: it took the
    holder for gone and wrote the run off as abandoned while its step went on. It asks the
    holder, which stops the step and records the cancel."""
    started, stopped = anyio.Event(), anyio.Event()

    async def hold(ctx: Any) -> None:
        started.set()
        try:
            await anyio.sleep(3600)
        finally:
            stopped.set()

    trigger = WorkerTrigger(queue="hold", provider="postgres")
    flow = Workflow(name="hold", trigger=trigger, steps=[Step("hold", hold)])
    async with Engine(workflows=[flow], database=pg_schema, lease="30s") as worker:
        run_id = (await worker.get_job(await worker.enqueue("hold", {}))).run_id
        with anyio.fail_after(20):
            await started.wait()
        command = [sys.executable, "-c", CANCELS, str(AHEAD_S), pg_schema, run_id]
        done = await anyio.run_process(command, check=False)
        output = done.stdout.decode() + done.stderr.decode()
        assert done.returncode == 0, output
        assert "cancelled cancelled cancelled by operator" in output, output
        assert "its worker was gone" not in output, output
        with anyio.fail_after(5):
            await stopped.wait()
        run = await worker.get_run(run_id)
    assert run.status is RunStatus.CANCELLED, run.status
    # Where the step was: the holder stopped it.
    assert run.error == f"cancelled by operator (stopped at {raised_at(hold, 3)})", run.error
