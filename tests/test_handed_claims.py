"""A job its claim handed straight to a worker slot starts without waiting for the commit of its
run's start (engine/worker.py): the claim's own commit marks the job `handed`, so whoever takes
the job from a worker that is gone (a claim after the lease expired, or the recovery a booting
worker runs for dead workers) records the run crashed even though its record still says
queued. So is each job of a top-up (`claim_ahead`: a worker whose slots are busy with short
jobs claims more to keep ahead), which starts within moments. A job a claim keeps ahead of its
free slots is not handed: its start is committed before its code runs, and the run's record
tells.

The lost holder here is a worker process that claimed through the queue and died before it ran
anything (as if killed -9 between its claim's commit and its start's): a real subprocess, so
its pid is really gone; then a real worker takes over. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import socket
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import anyio
import pytest
from support import (
    add_unserved,
    all_tasks_blocked,
    dead_pid,
    durable_database,
    provider_of,
    until,
)

from engine import Engine, RunStatus, Step, WorkerTrigger, Workflow
from engine.backends.sqlite.schema import SCHEMA_VERSION
from engine.ledger import make_job, make_run
from engine.models import MAX_CRASHES, JobState, WorkerInfo, utcnow

pytestmark = pytest.mark.anyio

database = durable_database  # the fixture: each DURABLE database in turn (tests/support.py)

QUEUE = "handed"
LEASE_S = 0.3


async def echo(ctx: object) -> str:
    return "done"


def workflows(database: str) -> list[Workflow]:
    trigger = WorkerTrigger(queue=QUEUE, concurrency=2, provider=provider_of(database))
    return [Workflow(name="handed", trigger=trigger, steps=[Step("echo", echo)])]


async def lost_holder(
    database: str, jobs: int, slots: int, lease_s: float, registered: bool, topped_up: int = 0
) -> tuple[dict[str, str], dict[str, str]]:
    """Enqueue `jobs` jobs, then claim them as a worker with `slots` free slots whose process
    is gone at once (`registered`: known as a worker, so that recovery finds it dead), the
    last `topped_up` of them by a top-up: the jobs handed (to its slots, or by the top-up), and
    those it kept ahead of its free slots, each with its first run's id."""
    holder = f"{socket.gethostname()}:{dead_pid()}"
    async with Engine(database=database) as producer:
        if registered:
            pid = int(holder.rsplit(":", 1)[1])
            now = utcnow()
            producer.backend.shared.heartbeat(
                WorkerInfo(
                    id=holder, host=socket.gethostname(), pid=pid, started_at=now, heartbeat_at=now
                )
            )
        queue = producer.backend.queue(provider_of(database))
        await add_unserved(queue, QUEUE, [{"i": i} for i in range(jobs)])
        claims = await queue.claim(QUEUE, slots, holder, lease_s)
        assert await queue.claim_ahead(QUEUE, topped_up, holder, lease_s) == topped_up
        ahead = []
        while (claim := queue.claim_nowait(QUEUE, holder, lease_s)) is not None:
            ahead.append(claim)
        assert len(claims) + len(ahead) == jobs
        topped, ahead = ahead[len(ahead) - topped_up :], ahead[: len(ahead) - topped_up]
        claims += topped
        assert all(c.job.handed for c in claims) and not any(c.job.handed for c in ahead)
        held_at = time.monotonic()
    # Closing the producer hands back nothing of the holder's: the jobs stay leased to it.
    remaining = lease_s - (time.monotonic() - held_at)
    if not registered and remaining > 0:
        await anyio.sleep(remaining + 0.05)  # the lease must run out: time is the condition
    return {c.job.id: c.job.run_id for c in claims}, {c.job.id: c.job.run_id for c in ahead}


@pytest.mark.parametrize("found_by", ["lease", "recovery"])
@pytest.mark.parametrize("handed_by", ["claim", "top-up"])
async def test_a_handed_job_taken_from_a_dead_worker_records_its_run_crashed(
    database: str, found_by: str, handed_by: str
) -> None:
    recovery = found_by == "recovery"
    lease = 3600.0 if recovery else LEASE_S  # by recovery: long before the lease could expire
    # One free slot: a claim takes up to 4 jobs, and a top-up 2 more after those.
    jobs, topped_up = (6, 2) if handed_by == "top-up" else (3, 0)
    handed, ahead = await lost_holder(database, jobs, 1, lease, recovery, topped_up)
    assert len(handed) == 1 + topped_up and len(ahead) == jobs - len(handed)
    async with Engine(workflows=workflows(database), database=database) as worker:
        for job_id, first in handed.items():
            run = await worker.wait_for_job(job_id, timeout=20)
            assert run.status is RunStatus.COMPLETED
            assert run.id != first, "the run the lost holder may have begun ran again as itself"
            old = await worker.get_run(first)
            assert old.status is RunStatus.CRASHED
            why = "before the run's start was recorded" if not recovery else "found by recovery"
            assert why in (old.error or "")
            assert any("redelivery" in line.message for line in run.logs)


@pytest.mark.parametrize("found_by", ["lease", "recovery"])
async def test_a_run_taken_from_a_dead_worker_says_crashed_once(
    database: str, found_by: str
) -> None:
    """Its status says crashed; `show`, the console and the worker's log put its error after
    the status ("crashed: <error>"), so the error does not say it again."""
    recovery = found_by == "recovery"
    lease = 3600.0 if recovery else LEASE_S
    handed, _ = await lost_holder(database, 1, 1, lease, recovery)
    [(job_id, first)] = handed.items()
    async with Engine(workflows=workflows(database), database=database) as worker:
        await worker.wait_for_job(job_id, timeout=20)
        old = await worker.get_run(first)
    assert old.status is RunStatus.CRASHED and old.error
    assert not old.error.startswith("crashed"), old.error


@pytest.mark.parametrize("found_by", ["lease", "recovery"])
async def test_a_job_claimed_ahead_and_lost_runs_its_own_run(database: str, found_by: str) -> None:
    """Not handed: its start would have been committed before any of its code ran, and the
    run's record says queued, so nothing of it ran; no crashed run is made up for it."""
    recovery = found_by == "recovery"
    lease = 3600.0 if recovery else LEASE_S
    handed, ahead = await lost_holder(database, 3, 1, lease, registered=recovery)
    async with Engine(workflows=workflows(database), database=database) as worker:
        for job_id, first in ahead.items():
            run = await worker.wait_for_job(job_id, timeout=20)
            assert run.status is RunStatus.COMPLETED and run.id == first
        [(job_id, first)] = handed.items()
        await worker.wait_for_job(job_id, timeout=20)
        # The handed job's first run only.
        assert [run.id for run in await worker.runs(status="crashed")] == [first]


async def test_a_file_of_the_previous_schema_is_migrated_and_its_jobs_run(tmp_path: Path) -> None:
    """A SQLite file written before `handed` existed (schema 6) gets the column when a worker
    opens it; a job that was active under a dead worker's lease there counts as not handed
    (its start was committed first by the engine of that time), and everything runs. Schema 8
    then drops `jobs_run`."""
    database = str(tmp_path / "blok.db")
    handed, ahead = await lost_holder(database, 2, 1, LEASE_S, registered=False)
    with closing(sqlite3.connect(database)) as conn:  # back to what schema 6 wrote
        conn.execute("ALTER TABLE jobs DROP COLUMN handed")
        conn.execute("ALTER TABLE workers DROP COLUMN process")  # schema 9's
        conn.execute("DROP INDEX runs_replay_of")  # schema 10's
        conn.execute("ALTER TABLE workers DROP COLUMN stopping_at")  # schema 11's
        conn.execute("DROP INDEX jobs_gated")  # schema 12's
        conn.execute("DROP INDEX jobs_due_at")  # schema 13's, and its jobs_ready
        conn.execute("DROP INDEX jobs_ready")
        conn.execute(
            "CREATE INDEX jobs_ready ON jobs(queue, priority DESC, seq)"
            " WHERE state IN ('waiting', 'delayed')"
        )
        conn.execute("CREATE INDEX jobs_run ON jobs(run_id)")
        conn.execute("DELETE FROM schema_version WHERE version > 6")
        conn.commit()
    async with Engine(workflows=workflows(database), database=database) as worker:
        runs = {job: await worker.wait_for_job(job, timeout=20) for job in {**handed, **ahead}}
    assert all(run.status is RunStatus.COMPLETED for run in runs.values())
    # Without the column, the dead holder's claims read as not handed: their runs go on.
    assert {job: run.id for job, run in runs.items()} == {**handed, **ahead}
    with closing(sqlite3.connect(database)) as conn:
        version = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]
        columns = [row[1] for row in conn.execute("PRAGMA table_info(jobs)")]
        indexes = [row[1] for row in conn.execute("PRAGMA index_list(jobs)")]
    assert version == SCHEMA_VERSION and "handed" in columns
    assert "jobs_run" not in indexes  # schema 8: no query reads jobs by run id
    with closing(sqlite3.connect(database)) as conn:
        run_indexes = [row[1] for row in conn.execute("PRAGMA index_list(runs)")]
    assert "runs_replay_of" in run_indexes  # schema 10: a requeue reads a run's replays
    with closing(sqlite3.connect(database)) as conn:
        worker_columns = [row[1] for row in conn.execute("PRAGMA table_info(workers)")]
    assert "stopping_at" in worker_columns  # schema 11: a draining worker says so
    # Schemas 12 and 13: the held jobs of a key, the delayed ones by their time.
    assert {"jobs_gated", "jobs_due_at", "jobs_ready"} <= set(indexes)


async def test_a_job_handed_off_by_its_add_and_lost_records_its_run_crashed(
    tmp_path: Path,
) -> None:
    """On SQLite an add hands its job to a claim asleep in its own process, in the add's
    transaction (engine/backends/database_queue.py): handed as a claim's job is, so when that
    process is gone the worker taking the job over records the first run crashed."""
    database = str(tmp_path / "handed-off.db")
    holder = f"{socket.gethostname()}:{dead_pid()}"
    claimed = []
    async with Engine(database=database) as producer:
        queue = producer.backend.queue("sqlite")

        async def claim() -> None:
            claimed.extend(await queue.claim(QUEUE, 1, holder, LEASE_S, timeout=30))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(claim)
                await all_tasks_blocked()  # its look found nothing: it sleeps
                await add_unserved(queue, QUEUE, [{"i": 0}])
        held_at = time.monotonic()
    [lost] = claimed
    assert lost.job.handed and lost.job.worker == holder
    remaining = LEASE_S - (time.monotonic() - held_at)
    if remaining > 0:
        await anyio.sleep(remaining + 0.05)  # the lease must run out: time is the condition
    async with Engine(workflows=workflows(database), database=database) as worker:
        run = await worker.wait_for_job(lost.job.id, timeout=20)
        assert run.status is RunStatus.COMPLETED and run.id != lost.job.run_id
        old = await worker.get_run(lost.job.run_id)
        assert old.status is RunStatus.CRASHED
        assert "before the run's start was recorded" in (old.error or "")


async def test_the_claim_that_finds_a_jobs_last_crash_is_not_counted_a_delivery(
    database: str,
) -> None:
    """A worker whose lease ran out (its loop blocked by an async node calling time.sleep)
    lost a job for the third time; the claim that took the job over found it a dead letter
    and ran nothing, yet the dead letters counted it: "4 deliveries" of a job three runs had,
    whose last run said "delivery 3 of 3"."""
    holder = f"{socket.gethostname()}:{dead_pid()}"
    async with Engine(database=database) as producer:
        queue = producer.backend.queue(provider_of(database))
        # Its first two runs crashed their workers: this one is its last.
        job = make_job(
            queue=QUEUE,
            workflow_name="handed",
            payload={},
            headers=None,
            priority=0,
            run_at=None,
            max_retries=0,
            meta={"crashes": MAX_CRASHES - 1},
        )
        await queue.add([job], [make_run(job, workflow_version="")])
        [claim] = await queue.claim(QUEUE, 1, holder, LEASE_S)
        held_at = time.monotonic()
    await anyio.sleep(max(0.0, LEASE_S - (time.monotonic() - held_at)) + 0.05)  # it runs out
    async with Engine(workflows=workflows(database), database=database) as worker:

        async def dead_letter() -> bool:
            return (await worker.get_job(job.id)).state is JobState.DEAD

        await until(dead_letter, timeout=20)
        dead = await worker.get_job(job.id)
        last = await worker.get_run(claim.job.run_id)
    assert last.status is RunStatus.CRASHED
    assert f"crashed their workers {MAX_CRASHES} times" in (dead.error or "")
    # One delivery: the lost holder's. (Its history is made up: two crashes, no claims.)
    assert dead.deliveries == 1
