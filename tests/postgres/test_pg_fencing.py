"""The fencing scenarios of tests/test_fencing.py on PostgreSQL: a frozen worker rewrites
nothing, a live worker keeps its job however long it runs, a dead one's job is taken over when
its lease expires. Real `blok-tui worker` processes on one database URL."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pg import NO_DRIVER
from support import until

asyncpg = pytest.importorskip("asyncpg", reason=NO_DRIVER)

from test_fencing import Project

from engine import Engine, RunStatus, Step, WorkerTrigger, Workflow

from .conftest import connect

pytestmark = pytest.mark.anyio


class Database:
    """Reads of the database the workers write, on one connection of the test's own."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def scalar(self, statement: str, *args: Any) -> int:
        return int(await self.conn.fetchval(statement, *args))

    async def runs(self, status: str) -> dict[str, tuple[Any, ...]]:
        """Every run in this status with everything stored of it (run, steps, attempts)."""
        found = {}
        for run in await self.conn.fetch(
            "SELECT id, status, output::text, error, finished_at, worker FROM runs"
            " WHERE status = $1",
            status,
        ):
            steps = await self.conn.fetch(
                "SELECT idx, status, output::text, error, finished_at FROM steps"
                " WHERE run_id = $1 ORDER BY idx",
                run[0],
            )
            attempts = await self.conn.fetch(
                "SELECT step_idx, number, status, error, finished_at FROM attempts"
                " WHERE run_id = $1 ORDER BY step_idx, number",
                run[0],
            )
            found[run[0]] = (tuple(run), tuple(map(tuple, steps)), tuple(map(tuple, attempts)))
        return found


@pytest.fixture
async def project(pg_url: str, tmp_path: Path) -> AsyncIterator[tuple[Project, Database]]:
    made = Project(tmp_path, work_s=0.05)
    made.database = pg_url  # type: ignore[assignment]  # a URL where the SQLite test has a path
    async with Engine(database=pg_url):  # installs blok's schema
        pass
    conn = await connect(pg_url)
    try:
        yield made, Database(conn)
    finally:
        made.close()
        await conn.close()


async def test_a_frozen_worker_wakes_up_and_rewrites_nothing(
    project: tuple[Project, Database],
) -> None:
    project_, db = project
    jobs = 60
    async with Engine(database=str(project_.database)) as producer:
        frozen, frozen_log = await anyio.to_thread.run_sync(project_.worker, "frozen")
        await until(lambda: db.scalar("SELECT count(*) FROM worker_catalog"))
        ids = await producer.enqueue_many("fenced", [{"n": n} for n in range(jobs)])
        held = "SELECT count(*) FROM jobs WHERE state = 'active' AND worker LIKE $1"
        pattern = f"%:{frozen.pid}:%"  # host:pid:tag
        # Running and claimed ahead.
        await until(lambda: check(db.scalar(held, pattern), lambda n: n >= 8))
        os.kill(frozen.pid, signal.SIGSTOP)
        survivor, _ = await anyio.to_thread.run_sync(project_.worker, "survivor")
        completed = "SELECT count(*) FROM jobs WHERE state = 'completed'"
        await until(lambda: check(db.scalar(completed), lambda n: n == jobs), timeout=60)
        before = await db.runs("completed")
        assert len(before) == jobs
        os.kill(frozen.pid, signal.SIGCONT)
        # Awake: its next renewal finds it holds nothing; it says so and writes nothing more.
        await until(lambda: "lease" in frozen_log.read_text(), timeout=20)
        await until(lambda: check(db.scalar(held, pattern), lambda n: n == 0))
        frozen.send_signal(signal.SIGTERM)
        survivor.send_signal(signal.SIGTERM)
        assert frozen.wait(20) == 0 and survivor.wait(20) == 0
        after = await db.runs("completed")
        assert after == before, "a completed run was rewritten by the worker that woke up"
        for job_id in ids:
            job = await producer.get_job(job_id)
            run = await producer.get_run(job.run_id)
            assert (job.state, run.status) == ("completed", RunStatus.COMPLETED)
            assert len(await producer.runs(status="completed", limit=10, text=job_id)) == 1
        crashed_runs = await producer.runs(status="crashed", limit=1000)
        assert await producer.count_runs() == jobs + len(crashed_runs)
    # Side effects done twice belong to runs the store records as crashed, never completed.
    crashed = set(await db.runs("crashed"))
    for job_id, runs in project_.executions().items():
        assert len([r for r in runs if r not in crashed]) <= 1, (job_id, runs)
    assert await db.scalar("SELECT count(*) FROM runs WHERE status = 'running'") == 0


async def check(value: Any, test: Any) -> bool:
    return bool(test(await value))


async def test_a_job_running_four_leases_long_is_never_taken_over(pg_url: str) -> None:
    """A worker renews its leases while it runs: a second engine on the same database,
    claiming the whole time, never takes over a job that runs four times longer than the
    lease."""
    executions: list[str] = []

    async def long(ctx: Any) -> str:
        executions.append(ctx.run_id)
        await anyio.sleep(2.0)
        return "done"

    wf = Workflow(
        name="long",
        trigger=WorkerTrigger(queue="long", concurrency=1),
        steps=[Step("long", long)],
    )
    async with (
        Engine(workflows=[wf], database=pg_url, lease=0.5) as first,
        Engine(workflows=[wf], database=pg_url, lease=0.5) as second,
    ):
        job = await first.enqueue("long")
        run = await second.wait_for_job(job, timeout=20)
        assert run.status is RunStatus.COMPLETED
        assert executions == [run.id], "taken over while its worker was alive and renewing"
        assert await first.count_runs() == 1
        assert not await first.runs(status="crashed")


async def test_a_dead_workers_job_is_taken_over_when_its_lease_expires(
    project: tuple[Project, Database], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No restart and no recovery round: only the lease running out (on the server's clock)
    frees the job, and the claim that takes it records the old run crashed, saying why."""
    project_, db = project
    project_.env["FENCING_WORK_S"] = "30"  # the victim's runs never end by themselves
    victim, _ = await anyio.to_thread.run_sync(project_.worker, "victim")
    url = str(project_.database)
    async with Engine(database=url) as producer:
        await until(lambda: db.scalar("SELECT count(*) FROM worker_catalog"))
        job = await producer.enqueue("fenced", {"n": 1})
    started = "SELECT count(*) FROM runs WHERE status = 'running' AND worker LIKE $1"
    await until(lambda: check(db.scalar(started, f"%:{victim.pid}:%"), lambda n: n == 1))
    monkeypatch.setenv("FENCING_EFFECTS", str(project_.effects))
    monkeypatch.setenv("FENCING_WORK_S", "0.01")
    # Started while the victim lives: its boot recovery finds nobody dead.
    async with Engine(
        workflows=project_.workflows, database=url, janitor_interval=3600
    ) as survivor:
        first = (await survivor.get_job(job)).run_id
        victim.kill()
        victim.wait()
        killed_at = time.monotonic()
        run = await survivor.wait_for_job(job, timeout=20)
        assert time.monotonic() - killed_at >= 1.0, "taken before the lease could expire"
        assert run.status is RunStatus.COMPLETED and run.id != first
        old = await survivor.get_run(first)
        assert old.status is RunStatus.CRASHED
        assert "lease expired" in (old.error or "")
        assert any("redelivery" in line.message for line in run.logs)
