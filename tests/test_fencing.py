"""Leases and fencing with real processes: a frozen worker rewrites nothing, a live worker keeps
its job however long it runs, a dead one's job is taken over when its lease expires.

The node records every execution in a side file per process (one line: job, run, pid), so a
duplicated side effect can be told from a duplicated record: the first may happen (a frozen
worker was mid-step), the second must not.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import anyio
import pytest
from support import freeze, until

from engine import Engine, RunStatus, Step, WorkerTrigger, Workflow

pytestmark = pytest.mark.anyio

LEASE = "1.5s"

FLOW = """
import os

import anyio

from engine import Step, WorkerTrigger, Workflow

EFFECTS = os.environ["FENCING_EFFECTS"]
WORK_S = float(os.environ.get("FENCING_WORK_S", "0.05"))


async def apply(ctx, n: int) -> dict:
    await anyio.sleep(WORK_S)
    with open(os.path.join(EFFECTS, f"{os.getpid()}.log"), "a") as log:
        log.write(f"{ctx.params['job_id']} {ctx.run_id}\\n")
    return {"n": n}


workflow = Workflow(
    name="fenced",
    trigger=WorkerTrigger(queue="fenced", concurrency=4),
    steps=[Step("apply", apply, inputs={"n": "$.body.n"})],
)
"""


@contextmanager
def reading(path: Path) -> Iterator[sqlite3.Connection]:
    with closing(sqlite3.connect(path, timeout=30)) as conn:
        yield conn


def scalar(database: Path, sql: str, *params: object) -> int:
    with reading(database) as conn:
        return int(conn.execute(sql, params).fetchone()[0])


class Project:
    def __init__(self, root: Path, work_s: float) -> None:
        self.root = root
        self.database = root / "blok.db"
        self.workflows = root / "workflows"
        self.workflows.mkdir()
        (self.workflows / "fenced.py").write_text(FLOW)
        self.effects = root / "effects"
        self.effects.mkdir()
        self.env = {
            **os.environ,
            "FENCING_EFFECTS": str(self.effects),
            "FENCING_WORK_S": str(work_s),
        }
        self.env.pop("BLOK_WORKER_ADAPTER", None)
        self.processes: list[subprocess.Popen[str]] = []

    def worker(self, name: str) -> tuple[subprocess.Popen[str], Path]:
        stderr = self.root / f"{name}.stderr"
        with stderr.open("w") as err:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "blok_tui",
                    "worker",
                    "--db",
                    str(self.database),
                    "--workflows",
                    str(self.workflows),
                    "--lease",
                    LEASE,
                    "--no-watch",
                    "--grace",
                    "2",
                ],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=self.env,
            )
        self.processes.append(process)
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("blok worker "), (line, stderr.read_text())
        return process, stderr

    def executions(self) -> dict[str, list[str]]:
        """job id → the runs that executed its node (in any process)."""
        seen: dict[str, list[str]] = {}
        for log in self.effects.glob("*.log"):
            for line in log.read_text().splitlines():
                job, run = line.split()
                seen.setdefault(job, []).append(run)
        return seen

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
                process.wait()


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    made = Project(tmp_path, work_s=0.05)
    yield made
    made.close()


def run_rows(database: Path, statuses: tuple[str, ...]) -> dict[str, tuple[object, ...]]:
    """Every run in these statuses with everything stored of it (run, steps, attempts)."""
    marks = ", ".join("?" * len(statuses))
    with reading(database) as conn:
        runs = conn.execute(
            f"SELECT id, status, output, error, finished_at, worker FROM runs"
            f" WHERE status IN ({marks})",
            statuses,
        ).fetchall()
        found = {}
        for run in runs:
            steps = conn.execute(
                "SELECT idx, status, output, error, finished_at FROM steps WHERE run_id = ?"
                " ORDER BY idx",
                (run[0],),
            ).fetchall()
            attempts = conn.execute(
                "SELECT step_idx, number, status, error, finished_at FROM attempts"
                " WHERE run_id = ? ORDER BY step_idx, number",
                (run[0],),
            ).fetchall()
            found[run[0]] = (tuple(run), tuple(steps), tuple(attempts))
    return found


async def test_a_frozen_worker_wakes_up_and_rewrites_nothing(project: Project) -> None:
    """The redesign issue's scenario: a worker holding jobs (running and claimed ahead) is
    frozen past its lease; a second worker completes them; the first wakes up. Every job ends
    with exactly one completed run, no completed run is rewritten, and the queue and the run
    store agree."""
    jobs = 60
    async with Engine(database=project.database, create=True) as producer:
        frozen, frozen_log = project.worker("frozen")
        await until(lambda: scalar(project.database, "SELECT count(*) FROM worker_catalog") > 0)
        ids = await producer.enqueue_many("fenced", [{"n": n} for n in range(jobs)])
        held = "SELECT count(*) FROM jobs WHERE state = 'active' AND worker LIKE ?"
        pattern = f"%:{frozen.pid}:%"  # host:pid:tag
        # Running and claimed ahead: the claim-ahead jobs are what used to be run twice.
        await until(lambda: scalar(project.database, held, pattern) >= 8)
        await freeze(
            frozen.pid, project.database, lambda: scalar(project.database, held, pattern) >= 8
        )
        survivor, _ = project.worker("survivor")
        completed = "SELECT count(*) FROM jobs WHERE state = 'completed'"
        await until(lambda: scalar(project.database, completed) == jobs, timeout=60)
        before = run_rows(project.database, ("completed",))
        assert len(before) == jobs
        os.kill(frozen.pid, signal.SIGCONT)
        # Awake: its next renewal finds it holds nothing; it says so and writes nothing more.
        await until(lambda: "lease" in frozen_log.read_text(), timeout=20)
        await until(
            lambda: (
                scalar(project.database, held, pattern) == 0 and "lease" in frozen_log.read_text()
            )
        )
        frozen.send_signal(signal.SIGTERM)
        survivor.send_signal(signal.SIGTERM)
        assert frozen.wait(20) == 0 and survivor.wait(20) == 0
        after = run_rows(project.database, ("completed",))
        assert after == before, "a completed run was rewritten by the worker that woke up"
        for job_id in ids:
            job = await producer.get_job(job_id)
            run = await producer.get_run(job.run_id)
            assert (job.state, run.status) == ("completed", RunStatus.COMPLETED)
            assert len(await producer.runs(status="completed", limit=10, text=job_id)) == 1
        assert await producer.count_runs() == jobs + len(
            await producer.runs(status="crashed", limit=1000)
        )
    # Side effects done twice belong to runs the store records as crashed, never completed.
    crashed = set(run_rows(project.database, ("crashed",)))
    for job_id, runs in project.executions().items():
        for extra in runs[1:] if len(runs) > 1 else []:
            assert extra in crashed or runs.count(extra) == 1, (job_id, runs)
        assert len([r for r in runs if r not in crashed]) <= 1, (job_id, runs)
    assert scalar(project.database, "SELECT count(*) FROM runs WHERE status = 'running'") == 0


async def test_a_job_running_four_leases_long_is_never_taken_over(tmp_path: Path) -> None:
    """A worker renews its leases while it runs: a second engine on the same file, claiming
    the whole time, never takes over a job that runs four times longer than the lease."""
    executions: list[str] = []

    async def long(ctx: object) -> str:
        run_id = ctx.run_id  # type: ignore[attr-defined]
        executions.append(run_id)
        await anyio.sleep(2.0)
        return "done"

    wf = Workflow(
        name="long",
        trigger=WorkerTrigger(queue="long", concurrency=1),
        steps=[Step("long", long)],
    )
    db = tmp_path / "blok.db"
    async with (
        Engine(workflows=[wf], database=db, lease=0.5) as first,
        Engine(workflows=[wf], database=db, lease=0.5) as second,
    ):
        job = await first.enqueue("long")
        run = await second.wait_for_job(job, timeout=20)
        assert run.status is RunStatus.COMPLETED
        assert executions == [run.id], "taken over while its worker was alive and renewing"
        assert await first.count_runs() == 1
        assert not await first.runs(status="crashed")


async def test_a_dead_workers_job_is_taken_over_when_its_lease_expires(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No restart and no recovery round: only the lease running out frees the job, and the
    claim that takes it records the old run crashed, saying why."""
    project.env["FENCING_WORK_S"] = "30"  # the victim's runs never end by themselves
    victim, _ = project.worker("victim")
    async with Engine(database=project.database) as producer:
        await until(lambda: scalar(project.database, "SELECT count(*) FROM worker_catalog") > 0)
        job = await producer.enqueue("fenced", {"n": 1})
    started = "SELECT count(*) FROM runs WHERE status = 'running' AND worker LIKE ?"
    await until(lambda: scalar(project.database, started, f"%:{victim.pid}:%") == 1)
    monkeypatch.setenv("FENCING_EFFECTS", str(project.effects))
    monkeypatch.setenv("FENCING_WORK_S", "0.01")
    # Started while the victim lives: its boot recovery finds nobody dead.
    async with Engine(
        workflows=project.workflows, database=project.database, janitor_interval=3600
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


async def test_a_lone_worker_frozen_past_its_lease_runs_the_job_again_on_waking(
    project: Project,
) -> None:
    """With no other worker to take the job over, the frozen one, awake, dropped the run's
    outcome (its lease was gone) and went on renewing that lease for ever: the run said
    `running` for good. A lease that ran out is renewed no more: the job is claimed again, its
    run recorded crashed, and a new delivery completes it."""
    project.env["FENCING_WORK_S"] = "2.5"  # the first delivery outlives the lease: frozen in it
    worker, log = project.worker("alone")
    async with Engine(database=project.database) as producer:
        await until(lambda: scalar(project.database, "SELECT count(*) FROM worker_catalog") > 0)
        job = await producer.enqueue("fenced", {"n": 1})
        running = "SELECT count(*) FROM runs WHERE status = 'running'"
        await until(lambda: scalar(project.database, running) == 1)
        first = (await producer.get_job(job)).run_id
        await freeze(worker.pid, project.database, lambda: True)
        expired = "SELECT count(*) FROM jobs WHERE lease_until < ?"
        await until(lambda: scalar(project.database, expired, time.time() - 1.0) == 1)
        os.kill(worker.pid, signal.SIGCONT)
        run = await producer.wait_for_job(job, timeout=30)
        old = await producer.get_run(first)
    assert run.status is RunStatus.COMPLETED and run.id != first, run
    assert old.status is RunStatus.CRASHED and "lease expired" in (old.error or ""), old
    # Said as it was: this worker's own claim took it over, after the process was stopped.
    assert "this process was suspended for " in (old.error or ""), old.error
    assert (old.error or "").endswith("it took the job over from itself"), old.error
    assert "not renewed in time" in log.read_text()
