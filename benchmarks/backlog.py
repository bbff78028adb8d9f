"""Jobs of a queue that also holds a backlog of jobs scheduled for later.

Reminders a day ahead, or runs asleep in a `wait.for_`, are delayed jobs of their queue. Two
reads went through all of them: a claim's search for due jobs (the waiting and the delayed ones
in claim order, each delayed one filtered by its time), until the delayed jobs were found by
their time (`jobs_due_at`, SQLite schema 13, PostgreSQL 11); and, at each end of a run whose
workflow has a concurrency key, the read of the next job held behind that key, until the held
jobs had an index of their own (`jobs_gated`, SQLite 12, PostgreSQL 10).

Here `--backlog` jobs are scheduled a month ahead on the queue, then `-n` jobs are enqueued one
call each and awaited (`wait_for_job`), as a user's are: `plain`, a workflow with no key; `keyed`,
`--keys` keys at a limit of 1 each (most jobs are held). Each with the index, and in the same
invocation on a fresh database with it dropped (the read as it was: the claim's search on
PostgreSQL then goes through the queue's jobs by state, as before), on SQLite and PostgreSQL.
Also the read alone, timed: a claim of one due job, or `gated`. The clock runs from the first
enqueue until the engine has stopped (its reads of held jobs done). PostgreSQL's statistics
are brought up to date after the backlog is written (`ANALYZE`, as autovacuum does soon after
a bulk write): its planner picks the index by them.

Usage: python benchmarks/backlog.py [--backlog 100000] [-n 200] [--keys 4]
       [--shapes plain,keyed] [--providers sqlite,postgres]
       [--url postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
from scratch_pg import DEFAULT_URL, scratch_database

from engine import Engine, Step, WorkerTrigger, Workflow
from engine.backends import open_backend
from engine.ledger import make_job, make_run
from engine.models import Job, utcnow

INDEX = {"plain": "jobs_due_at", "keyed": "jobs_gated"}


async def work(ctx: Any) -> int:
    return 1


def workflow(shape: str) -> Workflow:
    if shape == "keyed":
        trigger = WorkerTrigger(
            queue="q", concurrency=8, concurrency_key="$.body.k", concurrency_limit=1
        )
    else:
        trigger = WorkerTrigger(queue="q", concurrency=8)
    return Workflow(name="q", trigger=trigger, steps=[Step("work", work)])


def job_of_q(payload: Any, run_at: datetime | None = None) -> Job:
    """A job of the queue `q` (scheduled at `run_at`, if given)."""
    return make_job(
        queue="q",
        workflow_name="q",
        payload=payload,
        headers=None,
        priority=0,
        run_at=run_at,
        max_retries=0,
    )


async def fill(database: str, backlog: int, drop: str | None) -> None:
    """`backlog` jobs of the queue scheduled a month ahead; the index `drop` dropped."""
    async with open_backend(database) as backend:
        queue = backend.queues[0]
        later = utcnow() + timedelta(days=30)
        for start in range(0, backlog, 5000):
            jobs = [
                job_of_q({"k": "later", "i": i}, later)
                for i in range(start, min(backlog, start + 5000))
            ]
            await queue.add(jobs, [make_run(job, workflow_version="") for job in jobs])
        await backend.runs.flush()
    if database.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(database, autocommit=True) as conn:
            if drop is not None:
                conn.execute(f"DROP INDEX blok.{drop}")
            conn.execute("ANALYZE blok.jobs")
    elif drop is not None:
        with sqlite3.connect(database) as conn:
            conn.execute(f"DROP INDEX {drop}")


async def measure(database: str, shape: str, n: int, keys: int) -> tuple[float, float, float]:
    """(jobs/s, CPU ms a job, ms of the read alone)."""
    async with Engine(workflows=[workflow(shape)], database=database) as engine:
        began, cpu = time.perf_counter(), time.process_time()
        ids = [await engine.enqueue("q", {"k": f"k{i % keys}"}) for i in range(n)]
        for job_id in ids:
            run = await engine.wait_for_job(job_id, timeout=600)
            assert run.status.value == "completed", run.error
    rate = n / (time.perf_counter() - began)
    cpu_ms = (time.process_time() - cpu) / n * 1000
    async with open_backend(database) as backend:
        queue = backend.queues[0]
        reads = 20
        spent = 0.0
        for _ in range(reads):
            if shape == "keyed":
                began = time.perf_counter()
                await queue.gated("q", "k0", 1)
            else:
                job = job_of_q({})
                await queue.add([job], [make_run(job, workflow_version="")])
                began = time.perf_counter()
                assert len(await queue.claim("q", 1, "bench", 30.0)) == 1
            spent += time.perf_counter() - began
    return rate, cpu_ms, spent / reads * 1000


async def one(
    provider: str, url: str, shape: str, backlog: int, n: int, keys: int, indexed: bool
) -> tuple[float, float, float]:
    drop = None if indexed else INDEX[shape]
    if provider == "postgres":
        with scratch_database(url, "backlog") as database:
            await fill(database, backlog, drop)
            return await measure(database, shape, n, keys)
    with tempfile.TemporaryDirectory() as folder:
        database = str(Path(folder) / "blok.db")
        await fill(database, backlog, drop)
        return await measure(database, shape, n, keys)


async def main(args: argparse.Namespace) -> None:
    print(
        f"machine: {platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )
    print(
        f"backlog = {args.backlog:,} jobs a month ahead; N = {args.n} jobs enqueued one call "
        f"each, then each awaited; keyed: {args.keys} keys at a limit of 1"
    )
    print()
    print("| queue | jobs | index | jobs/s | CPU ms a job | read ms | jobs/s ratio |")
    print("|---|---|---|--:|--:|--:|--:|")
    for provider in args.providers.split(","):
        for shape in args.shapes.split(","):
            shown = [
                await one(provider, args.url, shape, args.backlog, args.n, args.keys, indexed)
                for indexed in (True, False)
            ]
            base = shown[1][0]
            names = (INDEX[shape], "dropped")
            for name, (rate, cpu_ms, read_ms) in zip(names, shown, strict=True):
                print(
                    f"| {provider} | {shape} | {name} | {rate:,.0f} | {cpu_ms:.2f} | "
                    f"{read_ms:.2f} | {rate / base:.2f}x |"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument("--keys", type=int, default=4)
    parser.add_argument("--shapes", default="plain,keyed")
    parser.add_argument("--providers", default="sqlite,postgres")
    parser.add_argument("--url", default=DEFAULT_URL)
    anyio.run(main, parser.parse_args())
