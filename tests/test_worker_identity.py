"""Who a worker is. Its id is not its host name and pid alone: cloned machines starting the same
service often share both, and two workers under one id renew each other's leases (a renewal is
by worker), so the jobs of the one that died are never taken over while the other lives.

A worker's pid means a process only where it was taken: on that machine (that kernel's boot)
and in that PID namespace; and only as long as that process lives, since a pid is given again.
So a worker records its process as the kernel knows it (`WorkerInfo.process`: its pid space
and when it began, in clock ticks since boot), and another judges it by its pid only in the
same pid space, and only if the process with that pid began when the worker's did; elsewhere by
its heartbeat. Machines and containers often share a host name (VMs cloned from one image,
containers on the host's network, pods with `hostNetwork`): judged by its pid on a machine
where that pid meant nothing, a live worker on another machine was found dead, and recovery
took its jobs and recorded its runs crashed while it ran them.

Real databases (SQLite and PostgreSQL), real processes and pids; the other machine is a row
written as that machine's worker writes it, the other container a real worker in a PID namespace
of its own (`unshare`, where this machine lets a test make one).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from anyio.streams.text import TextReceiveStream
from support import add_unserved, dead_pid, durable_database, provider_of, until

from engine import Engine, Job, JobState, RunStatus, Step, WorkerTrigger, Workflow
from engine.liveness import PID_SPACE, STALE_HEARTBEAT_S, process_of, this_process
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


async def held_by(database: str, process: str, pid: int | None = None) -> tuple[str, str, str]:
    """A job claimed, with a lease of an hour, by a worker registered under this host name with
    `process` and `pid` (default: one dead here); its heartbeat is fresh. The worker's id, the
    job's id and its run's."""
    pid = dead_pid() if pid is None else pid
    holder = f"{socket.gethostname()}:{pid}:0a0b0c"
    now = utcnow()
    async with Engine(database=database) as producer:
        producer.backend.shared.heartbeat(
            WorkerInfo(
                id=holder,
                host=socket.gethostname(),
                pid=pid,
                process=process,
                started_at=now,
                heartbeat_at=now,
            )
        )
        queue = producer.backend.queue(provider_of(database))
        [job] = await add_unserved(queue, QUEUE, [{"i": 1}])
        [claim] = await queue.claim(QUEUE, 1, holder, 3600.0)
        assert claim.job.id == job.id
    return holder, job.id, job.run_id


async def taken_over(database: str, holder: str, job_id: str, run_id: str) -> None:
    """A worker opens, finds the holder dead, and runs the job in a new run; the first one is
    recorded crashed."""
    async with Engine(workflows=workflows(database), database=database) as worker:
        run = await worker.wait_for_job(job_id, timeout=20)
        assert run.status is RunStatus.COMPLETED and run.id != run_id
        assert (await worker.get_run(run_id)).status is RunStatus.CRASHED
        assert holder not in {w.id for w in await worker.live_workers()}


async def test_a_live_worker_on_another_machine_of_the_same_name_keeps_its_jobs(
    database: str,
) -> None:
    holder, job_id, run_id = await held_by(database, f"{ANOTHER_MACHINE}#812")
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
    await taken_over(database, *await held_by(database, f"{PID_SPACE}#812"))


def a_live_process() -> list[str]:
    """A process that lives until its stdin closes."""
    return [sys.executable, "-c", "import sys; sys.stdin.read()"]


async def test_a_worker_whose_pid_a_newer_process_took_is_found_dead(database: str) -> None:
    """Killed long ago; its pid now names a process that began later (pids are given again
    once their process ended). A live process stands for that newer one; the worker's record
    says its own began a tick earlier. Judged by its pid alone, it lived on: recovery never
    released its job, and a health check saw a worker alive where none was."""
    async with await anyio.open_process(a_live_process()) as newer:
        space, _, began = process_of(newer.pid).partition("#")
        assert began, "no start time in /proc here"
        earlier = f"{space}#{int(began) - 1}"
        await taken_over(database, *await held_by(database, earlier, newer.pid))
        assert newer.stdin is not None
        await newer.stdin.aclose()


async def test_a_live_worker_of_this_machine_is_alive(database: str) -> None:
    """The other side: the process with its pid is the one that began when the worker's did,
    so it is alive and keeps its job."""
    async with await anyio.open_process(a_live_process()) as process:
        holder, job_id, _ = await held_by(database, process_of(process.pid), process.pid)
        async with Engine(workflows=workflows(database), database=database) as worker:
            assert (await worker.get_job(job_id)).worker == holder
            assert holder in {w.id for w in await worker.live_workers()}
            assert worker._chores is not None and await worker._chores.recover() == 0
        assert process.stdin is not None
        await process.stdin.aclose()


def a_zombie() -> subprocess.Popen[bytes]:
    """A process killed and not yet reaped by its parent (this test): its pid is still taken,
    by a process that runs no more."""
    child = subprocess.Popen(a_live_process())
    os.kill(child.pid, signal.SIGKILL)
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead; left unreaped
    return child


async def test_a_worker_killed_and_not_yet_reaped_is_dead(database: str) -> None:
    """Its process is the one it recorded, killed; its parent (a supervisor slow to reap, or
    none that reaps) has not collected it, so its pid still answers."""
    zombie = a_zombie()
    try:
        await taken_over(database, *await held_by(database, process_of(zombie.pid), zombie.pid))
    finally:
        zombie.wait()


# A worker in a PID namespace of its own, as in a container: its pid there is one no process of
# this namespace can have (past pid_max here), so judged by that pid here it would be dead.
NAMESPACED_PID = 99_991
CONTAINED = """
import sys

import anyio
from engine import Engine, Step, WorkerTrigger, Workflow


async def hold(ctx):
    print("running", flush=True)
    await anyio.sleep(3600)


async def main(url: str, provider: str) -> None:
    trigger = WorkerTrigger(queue="identity", provider=provider)  # QUEUE
    flow = Workflow(name="identity", trigger=trigger, steps=[Step("hold", hold)])
    # A lease of an hour: the job comes back only if the worker is found dead, not by expiry.
    async with Engine(workflows=[flow], database=url, lease="1h") as engine:
        print("worker", engine.worker.id, engine.worker.process, flush=True)
        await anyio.sleep(3600)


anyio.run(main, sys.argv[1], sys.argv[2])
"""


@asynccontextmanager
async def contained_worker(database: str) -> AsyncIterator[tuple[str, str]]:
    """A worker in a new PID namespace whose pid there is NAMESPACED_PID, once it runs a job:
    its id and its process. Its shell is the namespace's init, and dies with `unshare`."""
    script = 'echo "$1" > /proc/sys/kernel/ns_last_pid && "$0" -c "$2" "$3" "$4"; exit $?'
    command = [
        *("unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", script),
        *(sys.executable, str(NAMESPACED_PID - 1), CONTAINED, database, provider_of(database)),
    ]
    async with await anyio.open_process(command, stderr=subprocess.STDOUT) as box:
        try:
            assert box.stdout is not None
            said = ""
            with anyio.fail_after(30):
                async for text in TextReceiveStream(box.stdout):
                    said += text
                    if "running\n" in said and "worker " in said and said.endswith("\n"):
                        break
            assert "running\n" in said, said  # else it ended first: its output
            [line] = [line for line in said.splitlines() if line.startswith("worker ")]
            _, holder, process = line.split()
            yield holder, process
        finally:
            box.kill()  # the namespace with it


async def test_a_live_worker_in_another_pid_namespace_keeps_its_job(database: str) -> None:
    """Another container on this machine (the same boot, the same host name on the host's
    network): a real worker runs a job there. A worker here opens and recovers: the job stays
    the contained worker's, its run running, because its pid names no process of this
    namespace and is not taken to; its heartbeat says it lives."""
    probe = await anyio.run_process(["unshare", "--pid", "--fork", "true"], check=False)
    if probe.returncode != 0:
        pytest.skip(f"no PID namespace for a test here: {probe.stderr.decode().strip()}")
    [job_id] = [job.id for job in await enqueued(database)]
    async with contained_worker(database) as (holder, process):
        assert holder.split(":")[1] == str(NAMESPACED_PID)
        assert process.split("#")[0] != PID_SPACE  # the same boot, another pid namespace
        async with Engine(workflows=workflows(database), database=database) as worker:
            job = await worker.get_job(job_id)
            assert job.state is JobState.ACTIVE, job.state
            assert job.worker == holder, job.worker
            assert (await worker.get_run(job.run_id)).status is RunStatus.RUNNING
            assert holder in {w.id for w in await worker.live_workers()}


async def test_a_dead_worker_in_another_pid_namespace_is_found_by_its_heartbeat(
    database: str,
) -> None:
    """The container is killed with the job it was running (its lease an hour long). Its pid
    means nothing here, so its heartbeat decides: once it is older than this worker's lease (a
    worker is not given up on before its leases would have run out), recovery here finds it
    dead, takes the job over and records the first run crashed; the console and `health`
    (`live_workers`) say it is gone once its heartbeat is STALE_HEARTBEAT_S old."""
    probe = await anyio.run_process(["unshare", "--pid", "--fork", "true"], check=False)
    if probe.returncode != 0:
        pytest.skip(f"no PID namespace for a test here: {probe.stderr.decode().strip()}")
    [job] = await enqueued(database)
    async with contained_worker(database) as (holder, _):
        pass  # killed, with the job held
    flows = workflows(database)
    async with Engine(
        workflows=flows, database=database, lease="2s", janitor_interval=0.5
    ) as worker:
        assert holder in {w.id for w in await worker.live_workers()}  # its heartbeat is fresh
        run = await worker.wait_for_job(job.id, timeout=STALE_HEARTBEAT_S + 20)
        assert run.status is RunStatus.COMPLETED and run.id != job.run_id
        assert (await worker.get_run(job.run_id)).status is RunStatus.CRASHED

        async def gone() -> bool:  # listed as gone a while (chores.GONE_KEPT_S), not alive
            states = {w.id: worker.worker_state(w) for w in await worker.workers()}
            return states.get(holder) == "gone"

        await until(gone)


async def test_a_gone_worker_stays_listed_and_is_released_once_not_at_every_heartbeat(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Kept listed as gone, a dead worker of this machine was found again at every heartbeat:
    # a recovery, its reads and a commit each time (a flush at every heartbeat broke up the
    # writer's batches before).
    from engine.chores import Chores

    recoveries: list[int] = []
    looks: list[int] = []
    real_recover, real_gone = Chores.recover, Chores._gone

    async def counted_recover(self: Chores) -> int:
        recoveries.append(1)
        return await real_recover(self)

    def counted_gone(self: Chores, worker: WorkerInfo) -> bool:
        looks.append(1)
        return real_gone(self, worker)

    monkeypatch.setattr(Chores, "recover", counted_recover)
    monkeypatch.setattr(Chores, "_gone", counted_gone)
    holder, job_id, run_id = await held_by(database, f"{PID_SPACE}#812")
    async with Engine(workflows=workflows(database), database=database, heartbeat=0.05) as worker:
        run = await worker.wait_for_job(job_id, timeout=20)
        assert run.status is RunStatus.COMPLETED and run.id != run_id
        states = {w.id: worker.worker_state(w) for w in await worker.workers()}
        assert states[holder] == "gone", states
        found_by = len(recoveries)
        seen = len(looks)
        await until(lambda: len(looks) > seen + 20)  # some ten heartbeats' looks
        assert len(recoveries) == found_by, (found_by, len(recoveries))


async def enqueued(database: str) -> list[Job]:
    async with Engine(database=database) as producer:
        queue = producer.backend.queue(provider_of(database))
        return await add_unserved(queue, QUEUE, [{"i": 1}])


def test_engines_of_the_same_host_name_and_pid_have_different_ids() -> None:
    """As two cloned machines starting the same service do: two engines here, neither started,
    stand for them."""
    first, second = Engine(), Engine()
    assert first.worker.id != second.worker.id
    assert first.worker.id.startswith(f"{socket.gethostname()}:{os.getpid()}:")
    assert first.worker.process == this_process()
