"""Chaos on PostgreSQL: three `blok-tui worker` processes on one database run 1,000 jobs while
five of them are `kill -9`ed at random moments (each restarted at once) and one has its
database sessions ended under it (`pg_terminate_backend`).

The step records its side effect outside the database, in a file per worker process (one line
per execution: job, run), so that a side effect done twice can be told from a run recorded
twice. Afterwards: every job completed exactly once in the run store (a job whose runs were in
flight at three of the kills is dead-lettered by design, `MAX_CRASHES`: the test requeues it
as an operator would, and it must then complete), nothing is stuck (no job active, no run, step
or attempt left running, no worker registered), and every side effect done more than once for
a job belongs to runs the store records as crashed — at most one execution per job belongs to
a run that is not crashed, and that run is the job's completed one.

Settings for a longer soak: CHAOS_JOBS, CHAOS_SEED.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from pg import NO_DRIVER, fresh_database
from support import process_runs_here, until

from engine import Engine
from engine.models import MAX_CRASHES

asyncpg = pytest.importorskip("asyncpg", reason=NO_DRIVER)

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]

JOBS = int(os.environ.get("CHAOS_JOBS", "1000"))
WORKERS = 3
KILLS = 5
LEASE = "1.5s"
WORK_MS = 100
CONCURRENCY = 8

WORKFLOW_FILE = """
import os

import anyio

from engine import Step, WorkerTrigger, Workflow

EFFECTS = os.environ["CHAOS_EFFECTS_DIR"]
WORK_S = float(os.environ["CHAOS_WORK_MS"]) / 1000


def record_effect(job_id: str, run_id: str) -> None:
    # One write of one short line to a file of this process: whole or not at all.
    fd = os.open(os.path.join(EFFECTS, f"{os.getpid()}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{job_id} {run_id}\\n".encode())
    finally:
        os.close(fd)


async def apply(ctx, n: int) -> dict:
    await anyio.sleep(WORK_S)
    record_effect(ctx.params["job_id"], ctx.run_id)
    return {"job": ctx.params["job_id"], "n": n}


workflow = Workflow(
    name="chaos.apply",
    trigger=WorkerTrigger(queue="chaos", concurrency=int(os.environ["CHAOS_CONCURRENCY"])),
    steps=[Step("apply", apply, inputs={"n": "$.body.n"})],
)
"""


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def alive(self) -> None:
        assert self.process.poll() is None, f"worker exited early:\n{self.tail()}"

    def ready(self) -> bool:
        """It said it serves its queues: from then on a SIGTERM drains it. (Before, while
        Python still starts and imports, a SIGTERM ends it as it ends any process.)"""
        self.alive()
        return b"serving queues" in self.log.read_bytes()


@dataclass
class Chaos:
    url: str
    root: Path
    rng: random.Random
    why: str
    conn: Any = None
    workers: list[Worker] = field(default_factory=list)
    started: list[Worker] = field(default_factory=list)

    @property
    def effects(self) -> Path:
        return self.root / "effects"

    def start_worker(self) -> Worker:
        log = self.root / f"worker-{len(self.started) + 1}.log"
        env = {k: v for k, v in os.environ.items() if k not in ("BLOK_DB", "BLOK_WORKER_ADAPTER")}
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "blok_tui",
                    "worker",
                    "--db",
                    self.url,
                    "--workflows",
                    str(self.root / "workflows"),
                    "--lease",
                    LEASE,
                    "--grace",
                    "5",
                    "--no-watch",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        worker = Worker(process, log)
        self.started.append(worker)
        self.workers.append(worker)
        return worker

    async def scalar(self, statement: str) -> int:
        return int(await self.conn.fetchval(statement))

    async def until(self, statement: str, test: Any, timeout: float = 45) -> int:
        """Poll the database (other processes write it: there is no event to await)."""
        with anyio.fail_after(timeout):
            while True:
                value = await self.scalar(statement)
                if test(value):
                    return value
                for worker in self.workers:
                    worker.alive()
                await anyio.sleep(0.02)

    def executions(self) -> dict[str, list[str]]:
        """job id → the runs that executed its step, in any process."""
        seen: dict[str, list[str]] = {}
        for log in self.effects.glob("*.log"):
            for line in log.read_text().splitlines():
                job_id, run_id = line.split()
                seen.setdefault(job_id, []).append(run_id)
        return seen


@pytest.fixture
async def chaos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Chaos]:
    seed = int(os.environ.get("CHAOS_SEED", random.randrange(1_000_000)))
    async with fresh_database("blok_chaos") as url:
        made = Chaos(url, tmp_path, random.Random(seed), f"(CHAOS_SEED={seed})")
        (tmp_path / "workflows").mkdir()
        (tmp_path / "workflows" / "chaos_flow.py").write_text(textwrap.dedent(WORKFLOW_FILE))
        made.effects.mkdir()
        monkeypatch.setenv("CHAOS_EFFECTS_DIR", str(made.effects))
        monkeypatch.setenv("CHAOS_WORK_MS", str(WORK_MS))
        monkeypatch.setenv("CHAOS_CONCURRENCY", str(CONCURRENCY))
        from engine.backends.postgres.connect import settings

        made.conn = await asyncpg.connect(url, server_settings=settings("chaos-test"))
        try:
            yield made
        finally:
            for worker in made.started:
                if worker.process.poll() is None:
                    worker.process.kill()
                    worker.process.wait(timeout=10)
            await made.conn.close()


COMPLETED = "SELECT count(*) FROM jobs WHERE state = 'completed'"
ENDED = "SELECT count(*) FROM jobs WHERE state IN ('completed', 'failed', 'dead', 'cancelled')"
RUNNING = "SELECT count(*) FROM runs WHERE status = 'running'"


async def test_kill9_five_times_and_a_terminated_session_lose_and_double_nothing(
    chaos: Chaos,
) -> None:
    started = time.monotonic()
    async with Engine(workflows=chaos.root / "workflows", database=chaos.url, consume=False) as e:
        job_ids = await e.enqueue_many("chaos", [{"n": n} for n in range(JOBS)])
    assert len(set(job_ids)) == JOBS
    for _ in range(WORKERS):
        chaos.start_worker()
    points = sorted(chaos.rng.sample(range(JOBS // 10, JOBS * 8 // 10), KILLS + 1))
    terminate_at = points.pop(chaos.rng.randrange(len(points)))
    in_flight: list[int] = []
    terminated = 0
    for point in sorted([*points, terminate_at]):
        await chaos.until(COMPLETED, lambda done, point=point: done >= point)
        await anyio.sleep(chaos.rng.uniform(0, 0.05))
        victim = chaos.rng.choice(chaos.workers)
        if point == terminate_at:
            # Every session of one worker ended under it (writer, pool, listener): the oldest
            # worker's, which is surely connected by now.
            sessions = (
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE"
                " datname = current_database() AND application_name LIKE '%:{}'"
            )
            terminated = await chaos.scalar(sessions.format(chaos.workers[0].pid))
            continue
        in_flight.append(await chaos.scalar(RUNNING))
        os.kill(victim.pid, signal.SIGKILL)
        assert victim.process.wait(timeout=10) == -signal.SIGKILL
        chaos.workers.remove(victim)
        chaos.start_worker()  # restarted at once: its boot recovery finds the dead pid
    await chaos.until(ENDED, lambda done: done == JOBS, timeout=60)
    # A worker restarted after the last kill may still be booting when the jobs run out.
    await until(lambda: all(worker.ready() for worker in chaos.workers), timeout=30)
    for worker in chaos.workers:
        worker.process.send_signal(signal.SIGTERM)
    for worker in chaos.workers:
        assert worker.process.wait(timeout=30) == 0, worker.tail()
    why = chaos.why
    conn = chaos.conn
    # A job whose runs were in flight at MAX_CRASHES of the kills goes to the dead-letter queue
    # by design (a job that takes down every worker it is handed to must stop somewhere): it is
    # not lost. Each such job is requeued, as an operator would, and must then complete once.
    dead = await conn.fetch("SELECT id, error FROM jobs WHERE state = 'dead'")
    for row in dead:
        assert f"crashed their workers {MAX_CRASHES} times" in (row["error"] or ""), (
            [dict(r) for r in dead],
            why,
        )
    dead_ids = [row["id"] for row in dead]
    crashes_of_dead = dict(
        await conn.fetch(
            "SELECT job_id, count(*) FROM runs WHERE job_id = ANY($1::text[])"
            " AND status = 'crashed' GROUP BY job_id",
            dead_ids,
        )
    )
    assert crashes_of_dead == dict.fromkeys(dead_ids, MAX_CRASHES), (crashes_of_dead, why)
    if dead_ids:
        async with Engine(workflows=chaos.root / "workflows", database=chaos.url) as e:
            for job_id in dead_ids:
                await e.requeue(job_id)
            for job_id in dead_ids:
                await e.wait_for_job(job_id, timeout=30)
    elapsed = time.monotonic() - started

    statuses = dict(await conn.fetch("SELECT status, count(*) FROM runs GROUP BY status"))
    job_states = dict(await conn.fetch("SELECT state, count(*) FROM jobs GROUP BY state"))
    completed = dict(
        await conn.fetch(
            "SELECT job_id, count(*) FROM runs WHERE status = 'completed' GROUP BY job_id"
        )
    )
    completed_run = dict(await conn.fetch("SELECT job_id, id FROM runs WHERE status = 'completed'"))
    crashed = {r[0] for r in await conn.fetch("SELECT id FROM runs WHERE status = 'crashed'")}
    open_steps = await chaos.scalar("SELECT count(*) FROM steps WHERE status = 'running'")
    open_attempts = await chaos.scalar("SELECT count(*) FROM attempts WHERE status = 'running'")
    # Registrations of live processes: none once all stopped (the killed ones stay listed a
    # while as gone: chores.GONE_KEPT_S).
    pids = [pid for (pid,) in await conn.fetch("SELECT pid FROM workers")]
    workers_left = sum(1 for pid in pids if process_runs_here(pid))
    executions = chaos.executions()

    assert terminated >= 1, why
    not_completed = await conn.fetch(
        "SELECT id, state, error, meta FROM jobs WHERE state <> 'completed' LIMIT 5"
    )
    assert job_states == {"completed": JOBS}, (job_states, [dict(r) for r in not_completed], why)
    assert set(statuses) <= {"completed", "crashed"}, (statuses, why)
    assert completed == dict.fromkeys(job_ids, 1), why
    assert (open_steps, open_attempts, workers_left) == (0, 0, 0), why
    assert set(executions) == set(job_ids), why
    doubled = 0
    for job_id, runs in executions.items():
        not_crashed = [run for run in runs if run not in crashed]
        assert not_crashed == [completed_run[job_id]], (job_id, runs, why)
        doubled += len(runs) > 1
    # The kills must have hit runs in flight, or this test proved nothing.
    assert sum(in_flight) > 0 and statuses.get("crashed", 0) > 0, (in_flight, statuses, why)
    print(
        f"chaos on PostgreSQL {why}: {JOBS} jobs, {WORKERS} workers, {KILLS} kill -9 with "
        f"{in_flight} running, {terminated} sessions terminated; runs {statuses}, "
        f"{doubled} jobs executed more than once, {len(dead_ids)} dead-lettered after "
        f"{MAX_CRASHES} crashes and requeued; {elapsed:.1f}s"
    )
