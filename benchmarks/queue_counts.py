"""A queue's counts (`stats`) and its oldest wait (`oldest_waiting`) beside a backlog of jobs
scheduled for later.

The console's queues view reads `stats` for each queue at each refresh, `blok-tui health` and
each metrics sample read both. Their statements read every delayed job's row for its time; they
now count the delayed jobs from index entries and find the due ones by their time
(`jobs_due_at`). Here `--backlog` jobs a month ahead are written to a queue with a few waiting
ones, then each statement is timed (the mean of `--reads`) against the statements of 86144be,
kept below as they were, on the same database in the same invocation, SQLite and PostgreSQL
(its statistics brought up to date after the bulk write, as autovacuum does).

Usage: python benchmarks/queue_counts.py [--backlog 100000] [--reads 20]
       [--providers sqlite,postgres] [--url postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from backlog import fill, job_of_q
from scratch_pg import DEFAULT_URL, scratch_database

from engine.backends import open_backend
from engine.backends import rows as now_rows
from engine.ledger import make_run

# The statements of 86144be: every job of the queue read for its time; the delayed ones by state.
BEFORE_STATS = """
SELECT CASE WHEN r.status IN {unstarted} THEN 'waiting' ELSE j.state END AS state,
    coalesce(j.run_at > {now}, false) AS later, count(*) AS n
FROM jobs j LEFT JOIN runs r ON j.state = 'active' AND j.handed = 0 AND r.id = j.run_id
WHERE j.queue = {queue} GROUP BY 1, 2
"""
BEFORE_OLDEST = """
SELECT min({greatest}(created_at, coalesce(run_at, 0))) FROM jobs
WHERE queue = {queue} AND state IN ('waiting', 'delayed') AND (run_at IS NULL OR run_at <= {now})
"""


def statements(postgres: bool) -> dict[str, str]:
    if postgres:
        from engine.backends.postgres import sql

        shape: dict[str, Any] = {"now": sql.NOW, "queue": "$1", "greatest": "greatest"}
        current = {"stats": sql.STATS, "oldest_waiting": sql.OLDEST_WAITING}
    else:
        from engine.backends.sqlite import queue

        shape = {"now": "?1", "queue": "?2", "greatest": "max"}
        current = {"stats": queue.STATS, "oldest_waiting": queue.OLDEST_WAITING}
    shape["unstarted"] = now_rows.UNSTARTED_RUN
    return {
        **current,
        "stats before": BEFORE_STATS.format(**shape),
        "oldest_waiting before": BEFORE_OLDEST.format(**shape),
    }


async def timed(read: Callable[[], Awaitable[Any]], reads: int) -> float:
    await read()
    began = time.perf_counter()
    for _ in range(reads):
        await read()
    return (time.perf_counter() - began) / reads * 1000


async def measure(database: str, reads: int) -> dict[str, float]:
    postgres = database.startswith("postgresql://")
    async with open_backend(database) as backend:
        queue: Any = backend.queues[0]
        waiting = [job_of_q({}) for _ in range(10)]
        await queue.add(waiting, [make_run(job, workflow_version="") for job in waiting])
        await backend.runs.flush()
        found: dict[str, float] = {}
        for name, text in statements(postgres).items():

            async def read(text: str = text) -> Any:
                if postgres:
                    return await queue.db.fetch(text, "q")
                return await queue.db.fetchall(text, (time.time(), "q"))

            found[name] = await timed(read, reads)
        return found


async def one(provider: str, url: str, backlog: int, reads: int) -> dict[str, float]:
    if provider == "postgres":
        with scratch_database(url, "counts") as database:
            await fill(database, backlog, None)
            return await measure(database, reads)
    with tempfile.TemporaryDirectory() as folder:
        database = str(Path(folder) / "blok.db")
        await fill(database, backlog, None)
        return await measure(database, reads)


async def main(args: argparse.Namespace) -> None:
    print(
        f"machine: {platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )
    print(
        f"backlog = {args.backlog:,} jobs a month ahead and 10 waiting on the queue; the mean "
        f"of {args.reads} reads each"
    )
    print()
    print("| queue | read | ms now | ms before (86144be) | ratio |")
    print("|---|---|--:|--:|--:|")
    for provider in args.providers.split(","):
        found = await one(provider, args.url, args.backlog, args.reads)
        for name in ("stats", "oldest_waiting"):
            now, before = found[name], found[f"{name} before"]
            print(f"| {provider} | {name} | {now:.2f} | {before:.2f} | {before / now:.1f}x |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--reads", type=int, default=20)
    parser.add_argument("--providers", default="sqlite,postgres")
    parser.add_argument("--url", default=DEFAULT_URL)
    anyio.run(main, parser.parse_args())
