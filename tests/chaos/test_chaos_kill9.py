"""Workers under a load of 500 jobs are `kill -9`ed three times; nothing is lost or doubled.

The node records its effect in a side SQLite ledger (one per worker process, so a frozen worker
cannot lock the others out): one row per job (keyed by job id) plus a counter of executions. A
job whose worker died after the effect but before the run's record committed runs again, so
"executed at least once" (the counters) and "completed exactly once in the run store" (one
completed run per job) are checked separately.

Scenarios: one worker killed and restarted (its successor finds the dead pid on boot and
redelivers at once); two workers sharing the file, where the survivor finds the killed one's
dead pid at its next heartbeat and takes its jobs over; and a worker frozen (SIGSTOP) past its
lease, whose jobs are taken over when their leases expire, that wakes up
after its jobs were taken over. Settings for a longer soak locally: CHAOS_JOBS, CHAOS_SEED.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from support import freeze, process_runs_here, until

from engine import Engine

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]

JOBS = int(os.environ.get("CHAOS_JOBS", "500"))
KILLS = 3
LEASE_S = 1.5

WORKER_SCRIPT = """
import signal
import sys

import anyio

from engine import Engine


async def main() -> None:
    database, workflows, lease = sys.argv[1], sys.argv[2], float(sys.argv[3])
    async with Engine(
        workflows=workflows, database=database, lease=lease, heartbeat=lease / 4, grace_period=5
    ) as engine:
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            print(f"worker {engine.worker.id} ready", flush=True)
            async for _ in signals:
                print("worker stopping", flush=True)
                return


anyio.run(main)
"""

WORKFLOW_FILE = """
import os
import sqlite3

import anyio

from engine import Step, WorkerTrigger, Workflow

# One ledger per worker process: a worker frozen mid-commit must not lock the others out.
LEDGER = os.path.join(os.environ["CHAOS_EFFECTS_DIR"], f"effects-{os.getpid()}.db")
WORK_S = float(os.environ["CHAOS_WORK_MS"]) / 1000
CONCURRENCY = int(os.environ["CHAOS_CONCURRENCY"])


def record_effect(job_id: str, run_id: str) -> None:
    conn = sqlite3.connect(LEDGER, timeout=30, isolation_level=None)
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS effects (job_id TEXT PRIMARY KEY,"
            " first_run TEXT NOT NULL, executions INTEGER NOT NULL)"
        )
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO effects (job_id, first_run, executions) VALUES (?, ?, 1)"
            " ON CONFLICT(job_id) DO UPDATE SET executions = executions + 1",
            (job_id, run_id),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


async def apply(ctx, n: int) -> dict:
    await anyio.sleep(WORK_S)
    await anyio.to_thread.run_sync(record_effect, ctx.params["job_id"], ctx.run_id)
    return {"job": ctx.params["job_id"], "n": n}


workflow = Workflow(
    name="chaos.apply",
    trigger=WorkerTrigger(queue="chaos", concurrency=CONCURRENCY, provider="sqlite"),
    steps=[Step("apply", apply, inputs={"n": "$.body.n"})],
)
"""


@contextmanager
def reading(path: Path) -> Iterator[sqlite3.Connection]:
    with closing(sqlite3.connect(path, timeout=30)) as conn:
        yield conn


def count(conn: sqlite3.Connection, sql: str, params: tuple[object, ...] = ()) -> int:
    return int(conn.execute(sql, params).fetchone()[0])


@dataclass
class Setup:
    tmp: Path
    database: Path
    effects: Path
    workflows: Path
    job_ids: list[str]
    rng: random.Random
    why: str
    started: list[Worker] = field(default_factory=list)

    def start_worker(self) -> Worker:
        worker = Worker(self, len(self.started) + 1)
        self.started.append(worker)
        return worker

    def executions(self) -> dict[str, int]:
        """Executions per job, over every worker's ledger."""
        total: dict[str, int] = {}
        for ledger in self.effects.glob("effects-*.db"):
            with reading(ledger) as conn:
                for job_id, executions in conn.execute("SELECT job_id, executions FROM effects"):
                    total[job_id] = total.get(job_id, 0) + executions
        return total


class Worker:
    """One worker process; its output goes to a log file that a failure message quotes."""

    def __init__(self, setup: Setup, boot: int) -> None:
        self.log = setup.tmp / f"worker-{boot}.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    str(setup.tmp / "worker.py"),
                    str(setup.database),
                    str(setup.workflows),
                    str(LEASE_S),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.said = ""  # its engine's worker id (host:pid:tag), once it said it is ready

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def alive(self) -> None:
        assert self.process.poll() is None, f"worker exited early:\n{self.tail()}"

    def ready(self) -> bool:
        """Its engine has started: its boot recovery (which frees the jobs of a worker found
        dead on this host at once) is behind it."""
        self.alive()
        named = f"worker {socket.gethostname()}:{self.process.pid}:"
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith(named) and line.endswith(" ready"):
                self.said = line.removeprefix("worker ").removesuffix(" ready")
                return True
        return False

    @property
    def id(self) -> str:
        """Its engine's worker id: known once it is ready (it is, once it has run jobs)."""
        assert self.said or self.ready(), f"worker not ready:\n{self.tail()}"
        return self.said

    def kill9(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        assert self.process.wait(timeout=10) == -signal.SIGKILL

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=20) == 0, self.tail()


@pytest.fixture
def reap() -> Iterator[list[Setup]]:
    """Whatever a failing test left running is killed, not left behind."""
    setups: list[Setup] = []
    yield setups
    for setup in setups:
        for worker in setup.started:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGCONT)
                worker.process.kill()
                worker.process.wait(timeout=10)


async def prepare(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    reap: list[Setup],
    *,
    work_ms: int,
    concurrency: int,
) -> Setup:
    seed = int(os.environ.get("CHAOS_SEED", random.randrange(1_000_000)))
    setup = Setup(
        tmp=tmp_path,
        database=tmp_path / "blok.db",
        effects=tmp_path / "effects",
        workflows=tmp_path / "workflows",
        job_ids=[],
        rng=random.Random(seed),
        why=f"(CHAOS_SEED={seed})",
    )
    reap.append(setup)
    setup.workflows.mkdir()
    setup.effects.mkdir()
    (setup.workflows / "chaos_flow.py").write_text(textwrap.dedent(WORKFLOW_FILE))
    (tmp_path / "worker.py").write_text(textwrap.dedent(WORKER_SCRIPT))
    monkeypatch.setenv("CHAOS_EFFECTS_DIR", str(setup.effects))
    monkeypatch.setenv("CHAOS_WORK_MS", str(work_ms))
    monkeypatch.setenv("CHAOS_CONCURRENCY", str(concurrency))
    async with Engine(workflows=setup.workflows, database=setup.database, consume=False) as e:
        setup.job_ids = await e.enqueue_many("chaos", [{"n": n} for n in range(JOBS)])
    assert len(set(setup.job_ids)) == JOBS
    return setup


async def poll(setup: Setup, sql: str, until: Callable[[int], bool], *workers: Worker) -> int:
    """Poll the shared file: other processes write it, so there is no event to await."""
    with anyio.fail_after(45), reading(setup.database) as conn:
        while True:
            value = count(conn, sql)
            if until(value):
                return value
            for worker in workers:
                worker.alive()
            await anyio.sleep(0.02)


COMPLETED_JOBS = "SELECT count(*) FROM jobs WHERE state = 'completed'"
# The last wait is for every job to end, however: a failure is then reported with its error.
ENDED_JOBS = "SELECT count(*) FROM jobs WHERE state IN ('completed', 'failed', 'dead', 'cancelled')"
RUNNING_RUNS = "SELECT count(*) FROM runs WHERE status = 'running'"


async def kill_under_load(setup: Setup, victim: Worker, *others: Worker, point: int) -> int:
    """Kill `victim` once `point` jobs are done, at a random moment after; the number of runs
    that were `running` just before."""
    await poll(setup, COMPLETED_JOBS, lambda done: done >= point, victim, *others)
    await anyio.sleep(setup.rng.uniform(0, 0.05))
    with reading(setup.database) as conn:
        in_flight = count(conn, RUNNING_RUNS)
    victim.kill9()
    return in_flight


def verify(setup: Setup) -> dict[str, int]:
    """Every job completed exactly once in the run store, executed at least once, nothing left
    running, an intact file. Returns run counts by status."""
    why, job_ids = setup.why, setup.job_ids
    with reading(setup.database) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)], why
        statuses = dict(
            conn.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall()
        )
        completed = dict(
            conn.execute(
                "SELECT job_id, count(*) FROM runs WHERE status = 'completed' GROUP BY job_id"
            ).fetchall()
        )
        job_states = dict(
            conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall()
        )
        outputs = conn.execute(
            "SELECT job_id, json_extract(output, '$.job') FROM runs WHERE status = 'completed'"
        ).fetchall()
        orphans = count(
            conn,
            "SELECT count(*) FROM runs r WHERE r.status = 'crashed' AND NOT EXISTS"
            " (SELECT 1 FROM runs c WHERE c.job_id = r.job_id AND c.status = 'completed')",
        )
        errors = conn.execute(
            "SELECT error FROM runs WHERE status NOT IN ('completed', 'crashed') LIMIT 5"
        ).fetchall()
        open_steps = count(conn, "SELECT count(*) FROM steps WHERE status = 'running'")
        open_attempts = count(conn, "SELECT count(*) FROM attempts WHERE status = 'running'")
        # Registrations of live processes: none once all stopped (the killed ones stay
        # listed a while as gone: chores.GONE_KEPT_S).
        pids = [pid for (pid,) in conn.execute("SELECT pid FROM workers").fetchall()]
        workers_left = sum(1 for pid in pids if process_runs_here(pid))
        statuses["lease_expired"] = count(
            conn, "SELECT count(*) FROM runs WHERE error LIKE '%lease expired%'"
        )
        statuses["found_dead"] = count(
            conn, "SELECT count(*) FROM runs WHERE error LIKE '%found by recovery%'"
        )
        # Each names its own worker, not the gone ones still listed beside it.
        named = conn.execute(
            "SELECT error FROM runs WHERE error LIKE '%its worker process %, %died%'"
        ).fetchall()
    executions = setup.executions()
    assert named == [], named

    assert statuses.get("running", 0) == 0, (statuses, why)
    found = {"lease_expired", "found_dead"}
    assert set(statuses) - found <= {"completed", "crashed"}, (statuses, errors, why)
    assert job_states == {"completed": JOBS}, (job_states, why)
    assert completed == dict.fromkeys(job_ids, 1), why
    assert all(job == output for job, output in outputs), why
    assert set(executions) == set(job_ids), why
    assert (orphans, open_steps, open_attempts, workers_left) == (0, 0, 0, 0), why
    statuses["executed_twice"] = sum(1 for n in executions.values() if n > 1)
    return statuses


async def test_kill9_three_times_loses_and_doubles_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reap: list[Setup]
) -> None:
    setup = await prepare(tmp_path, monkeypatch, reap, work_ms=20, concurrency=8)
    started = time.monotonic()
    points = sorted(setup.rng.sample(range(JOBS // 10, JOBS * 9 // 10), KILLS))
    in_flight = []
    for point in points:
        worker = setup.start_worker()
        in_flight.append(await kill_under_load(setup, worker, point=point))
    final = setup.start_worker()
    await poll(setup, ENDED_JOBS, lambda done: done == JOBS, final)
    final.stop()
    statuses = verify(setup)
    # The kills must have hit runs in flight, or this test proved nothing.
    assert sum(in_flight) > 0 and statuses.get("crashed", 0) > 0, (in_flight, setup.why)
    print(
        f"chaos, one worker {setup.why}: {JOBS} jobs, killed at {points} completed with "
        f"{in_flight} running, runs {statuses}, {time.monotonic() - started:.1f}s"
    )


async def test_a_surviving_worker_takes_over_a_killed_ones_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reap: list[Setup]
) -> None:
    # Slower jobs and fewer slots: the load must outlast three kills and their takeovers.
    setup = await prepare(tmp_path, monkeypatch, reap, work_ms=100, concurrency=4)
    started = time.monotonic()
    workers = [setup.start_worker(), setup.start_worker()]
    points = sorted(setup.rng.sample(range(JOBS // 20, JOBS // 2), KILLS))
    in_flight = []
    for point in points:
        index = setup.rng.randrange(2)
        victim, survivor = workers[index], workers[1 - index]
        # A worker still starting when the other is killed would free its jobs by boot
        # recovery, not by their leases running out (seen on a loaded machine).
        await until(lambda: all(worker.ready() for worker in workers), timeout=60)
        in_flight.append(await kill_under_load(setup, victim, survivor, point=point))
        # Not restarted yet, so no boot recovery: the survivor frees its jobs, finding its
        # pid dead at a heartbeat (on this machine; on another, its leases would run out).
        held = f"SELECT count(*) FROM jobs WHERE state = 'active' AND worker = '{victim.id}'"
        await poll(setup, held, lambda n: n == 0, survivor)
        workers[index] = setup.start_worker()
    await poll(setup, ENDED_JOBS, lambda done: done == JOBS, *workers)
    # The worker started after the last kill may still be starting when the jobs run out: a
    # SIGTERM then ends it as any process (-15), not by a drain.
    await until(lambda: all(worker.ready() for worker in workers), timeout=60)
    for worker in workers:
        worker.stop()
    statuses = verify(setup)
    assert sum(in_flight) > 0 and statuses["found_dead"] > 0, (statuses, setup.why)
    print(
        f"chaos, two workers {setup.why}: {JOBS} jobs, killed at {points} completed with "
        f"{in_flight} running, runs {statuses}, {time.monotonic() - started:.1f}s"
    )


async def test_a_worker_stalled_past_its_lease_does_not_complete_a_job_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reap: list[Setup]
) -> None:
    # Not dead, only frozen (SIGSTOP: a long GC pause, a suspended laptop, an overloaded host):
    # the other worker takes its jobs when their leases expire, then it wakes up and finishes
    # the runs it was holding. Those must stay crashed, and the job must not be settled by it.
    setup = await prepare(tmp_path, monkeypatch, reap, work_ms=50, concurrency=4)
    started = time.monotonic()
    frozen, survivor = setup.start_worker(), setup.start_worker()
    await poll(setup, COMPLETED_JOBS, lambda done: done >= JOBS // 10, frozen, survivor)
    held = f"SELECT count(*) FROM jobs WHERE state = 'active' AND worker = '{frozen.id}'"
    with reading(setup.database) as conn:
        assert count(conn, held) > 0, setup.why

    def holding() -> bool:
        with reading(setup.database) as conn:
            return count(conn, held) > 0

    await freeze(frozen.process.pid, setup.database, holding)
    try:
        await poll(setup, held, lambda n: n == 0, survivor)
    finally:
        os.kill(frozen.process.pid, signal.SIGCONT)
    await poll(setup, ENDED_JOBS, lambda done: done == JOBS, frozen, survivor)
    for worker in (frozen, survivor):
        worker.stop()
    statuses = verify(setup)
    assert statuses["lease_expired"] > 0 and statuses["executed_twice"] > 0, (statuses, setup.why)
    print(
        f"chaos, stalled worker {setup.why}: {JOBS} jobs, runs {statuses}, "
        f"{time.monotonic() - started:.1f}s"
    )
