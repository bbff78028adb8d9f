"""Who a worker is. Its id is not its host name and pid alone: cloned machines starting the same
service often share both, and two workers under one id renew each other's leases (a renewal is
by worker), so the jobs of the one that died are never taken over while the other lives.

A worker's pid means a process only where it was taken: on that machine (that kernel's
boot) and in that PID namespace. Machines and containers often share a host name (VMs cloned
from one image, containers on the host's network, pods with `hostNetwork`), so a worker that
reads another's row judges it by its pid only when both run in the same pid space
(`WorkerInfo.pid_space`); elsewhere by its heartbeat. Judged by its pid on a machine where that
pid means nothing, a live worker on another machine was found dead: recovery took its jobs and
recorded its runs crashed while it ran them, and they ran twice.

Real databases (SQLite and PostgreSQL), a real dead pid; the other machine is a row written as
that machine's worker writes it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import anyio
import pytest
from support import add_unserved, durable_database, provider_of

from engine import Engine, JobState, RunStatus, Step, WorkerTrigger, Workflow
from engine.liveness import PID_SPACE
from engine.models import WorkerInfo, utcnow

pytestmark = pytest.mark.anyio

database = durable_database  # the fixture: each DURABLE database in turn (tests/support.py)

QUEUE = "identity"
ANOTHER_MACHINE = "0b1d4c3e-another-boot/4026531836"  # another kernel's boot id, its namespace


async def echo(ctx: object) -> str:
    return "done"


def workflows(database: str) -> list[Workflow]:
    trigger = WorkerTrigger(queue=QUEUE, concurrency=2, provider=provider_of(database))
    return [Workflow(name=QUEUE, trigger=trigger, steps=[Step("echo", echo)])]


def dead_pid() -> int:
    """A pid no process here has any more."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


async def held_by(
    database: str, pid_space: str, pid: int | None = None, started: datetime | None = None
) -> tuple[str, str, str]:
    """A job claimed, with a lease of an hour, by a worker registered under this host name in
    `pid_space`, with `pid` (default: one dead here) and registered at `started` (default:
    now); its heartbeat is fresh. The worker's id, the job's id and its run's."""
    pid = dead_pid() if pid is None else pid
    holder = f"{socket.gethostname()}:{pid}"
    now = utcnow()
    async with Engine(database=database) as producer:
        producer.backend.shared.heartbeat(
            WorkerInfo(
                id=holder,
                host=socket.gethostname(),
                pid=pid,
                pid_space=pid_space,
                started_at=started or now,
                heartbeat_at=now,
            )
        )
        queue = producer.backend.queue(provider_of(database))
        [job] = await add_unserved(queue, QUEUE, [{"i": 1}])
        [claim] = await queue.claim(QUEUE, 1, holder, 3600.0)
        assert claim.job.id == job.id
    return holder, job.id, job.run_id


async def test_a_live_worker_on_another_machine_of_the_same_name_keeps_its_jobs(
    database: str,
) -> None:
    holder, job_id, run_id = await held_by(database, ANOTHER_MACHINE)
    async with Engine(workflows=workflows(database), database=database) as worker:
        # Its recovery ran as it opened (before its first claim): the job is still the other
        # machine's, its run not crashed, and that worker counts as alive.
        job = await worker.get_job(job_id)
        assert job.state is JobState.ACTIVE and job.worker == holder
        assert (await worker.get_run(run_id)).status is not RunStatus.CRASHED
        assert holder in {w.id for w in await worker.live_workers()}
        assert worker._chores is not None
        assert await worker._chores.recover() == 0  # and again, as its chores loop would


async def test_a_dead_worker_of_this_machine_is_found_at_once(database: str) -> None:
    """Same pid space, pid gone: dead without waiting for its heartbeat to age, and its job
    taken over with its run recorded crashed."""
    holder, job_id, run_id = await held_by(database, PID_SPACE)
    async with Engine(workflows=workflows(database), database=database) as worker:
        run = await worker.wait_for_job(job_id, timeout=20)
        assert run.status is RunStatus.COMPLETED and run.id != run_id
        assert (await worker.get_run(run_id)).status is RunStatus.CRASHED
        assert holder not in {w.id for w in await worker.live_workers()}


def test_engines_of_the_same_host_name_and_pid_have_different_ids() -> None:
    """As two cloned machines starting the same service do: two engines here, neither started,
    stand for them."""
    first, second = Engine(), Engine()
    assert first.worker.id != second.worker.id
    assert first.worker.id.startswith(f"{socket.gethostname()}:{os.getpid()}:")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="no /proc: no start times")
async def test_a_worker_whose_pid_a_newer_process_took_is_found_dead(database: str) -> None:
    """Killed an hour ago; its pid now names another process, which began after it registered
    (pids are given again once their process ended). A live process started now stands for
    that newer one. Judged by its pid alone, it lived on: its job was never recovered, and a
    health check saw a worker alive where none was."""
    command = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    async with await anyio.open_process(command) as newer:
        an_hour_ago = utcnow() - timedelta(hours=1)
        holder, job_id, run_id = await held_by(database, PID_SPACE, newer.pid, an_hour_ago)
        async with Engine(workflows=workflows(database), database=database) as worker:
            run = await worker.wait_for_job(job_id, timeout=20)
            assert run.status is RunStatus.COMPLETED and run.id != run_id
            assert holder not in {w.id for w in await worker.live_workers()}
        assert newer.stdin is not None
        await newer.stdin.aclose()
