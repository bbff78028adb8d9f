"""A keyed workflow's runs on a queue with a backlog of jobs scheduled for later.

Each end of a run whose workflow has a concurrency key reads the next job held behind that key
(`JobQueue.gated`). That read went through every delayed job of the queue, filtering their JSON,
until the held jobs had an index of their own (`jobs_gated`, SQLite schema 12, PostgreSQL 10).
Here `--backlog` jobs are scheduled a month ahead on the queue, then `-n` jobs of `--keys` keys
(a limit of 1 each, so that most are held) are enqueued one call each and awaited
(`wait_for_job`), as a user's are: with the index, and in the same invocation on a fresh database
with it dropped (the read as it was), on SQLite and PostgreSQL. Also the read alone, timed.

Usage: python benchmarks/gated_read.py [--backlog 100000] [-n 200] [--keys 4]
       [--providers sqlite,postgres] [--url postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
from scratch_pg import DEFAULT_URL, scratch_database

from engine import Engine, Step, WorkerTrigger, Workflow
from engine.backends import open_backend
from engine.ledger import make_job, make_run
from engine.models import utcnow


async def work(ctx: Any) -> int:
    return 1


def keyed() -> Workflow:
    return Workflow(
        name="keyed",
        trigger=WorkerTrigger(
            queue="keyed", concurrency=8, concurrency_key="$.body.k", concurrency_limit=1
        ),
        steps=[Step("work", work)],
    )


async def fill(database: str, backlog: int, indexed: bool) -> None:
    """`backlog` jobs of the queue scheduled a month ahead; the index dropped unless `indexed`."""
    async with open_backend(database) as backend:
        queue = backend.queues[0]
        later = utcnow() + timedelta(days=30)
        for start in range(0, backlog, 5000):
            jobs = [
                make_job(
                    queue="keyed",
                    workflow_name="keyed",
                    payload={"k": "later", "i": i},
                    headers=None,
                    priority=0,
                    run_at=later,
                    max_retries=0,
                )
                for i in range(start, min(backlog, start + 5000))
            ]
            await queue.add(jobs, [make_run(job, workflow_version="") for job in jobs])
        await backend.runs.flush()
    if not indexed:
        if database.startswith("postgresql://"):
            import psycopg

            with psycopg.connect(database, autocommit=True) as conn:
                conn.execute("DROP INDEX blok.jobs_gated")
        else:
            with sqlite3.connect(database) as conn:
                conn.execute("DROP INDEX jobs_gated")


async def measure(database: str, n: int, keys: int) -> tuple[float, float, float]:
    """(jobs/s of the keyed jobs, CPU ms a job, ms a `gated` read once they are done). The
    jobs are enqueued one call each, then each awaited (most wait behind their key); the
    clock starts at the first enqueue and stops when the engine has stopped, its reads of
    held jobs done."""
    async with Engine(workflows=[keyed()], database=database) as engine:
        # From the first enqueue: the engine's opening (a check of the file, recovery) is
        # not the read's.
        began, cpu = time.perf_counter(), time.process_time()
        ids = [await engine.enqueue("keyed", {"k": f"k{i % keys}"}) for i in range(n)]
        for job_id in ids:
            run = await engine.wait_for_job(job_id, timeout=600)
            assert run.status.value == "completed", run.error
        queue = engine.backend.queues[0]
    rate = n / (time.perf_counter() - began)
    cpu_ms = (time.process_time() - cpu) / n * 1000
    async with open_backend(database) as backend:
        queue = backend.queues[0]
        reads = 20
        began = time.perf_counter()
        for _ in range(reads):
            await queue.gated("keyed", "k0", 1)
        read_ms = (time.perf_counter() - began) / reads * 1000
    return rate, cpu_ms, read_ms


async def one(provider: str, url: str, backlog: int, n: int, keys: int, indexed: bool) -> Any:
    if provider == "postgres":
        with scratch_database(url, "gated") as database:
            await fill(database, backlog, indexed)
            return await measure(database, n, keys)
    with tempfile.TemporaryDirectory() as folder:
        database = str(Path(folder) / "blok.db")
        await fill(database, backlog, indexed)
        return await measure(database, n, keys)


async def main(args: argparse.Namespace) -> None:
    print(
        f"machine: {platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )
    print(
        f"backlog = {args.backlog:,} jobs a month ahead; N = {args.n} keyed jobs, "
        f"{args.keys} keys at a limit of 1, enqueued one call each, then each awaited"
    )
    print()
    print("| queue | index | keyed jobs/s | CPU ms a job | gated read ms | jobs/s ratio |")
    print("|---|---|--:|--:|--:|--:|")
    for provider in args.providers.split(","):
        shown = []
        for indexed in (True, False):
            shown.append(await one(provider, args.url, args.backlog, args.n, args.keys, indexed))
        base = shown[1][0]
        for name, (rate, cpu_ms, read_ms) in zip(("jobs_gated", "dropped"), shown, strict=True):
            print(
                f"| {provider} | {name} | {rate:,.0f} | {cpu_ms:.2f} | {read_ms:.2f} "
                f"| {rate / base:.2f}x |"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument("--keys", type=int, default=4)
    parser.add_argument("--providers", default="sqlite,postgres")
    parser.add_argument("--url", default=DEFAULT_URL)
    anyio.run(main, parser.parse_args())
