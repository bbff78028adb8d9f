"""What one `enqueue` costs on SQLite, next to a raw WAL commit, and whether callers share commits.

    python benchmarks/enqueue_latency.py               # N = 2000 calls per row
    python benchmarks/enqueue_latency.py -n 500 --callers 8

Rows, all in this one process, one after the other, on fresh SQLite files in WAL mode with
`synchronous=NORMAL` (blok's setting):

- `raw sqlite3 commit`: one INSERT of one row + COMMIT on a plain `sqlite3` connection, in the
  calling thread: the floor.
- `raw commit, 1 thread hop`: the same, run in a worker thread with `anyio.to_thread.run_sync`:
  the floor for async code, which must not block its event loop on SQLite.
- `raw aiosqlite commit`: the same through aiosqlite, as blok reaches SQLite today: three
  awaits (BEGIN, INSERT, COMMIT), each a hop to aiosqlite's thread and back.
- `enqueue, queue paused`: `engine.enqueue(...)` on an engine whose queue is paused, so nothing
  else writes (only the engine's heartbeat, every 2 s). Goal: p50 ≤ 150 µs.
- `enqueue, producer engine`: the same calls from an `Engine(database=...)` with no workflows
  (a web app's) on the same file once the worker above has closed: an engine that claims
  nothing from the queue commits a lone call itself instead of waiting for its writer's task.
- `enqueue, worker idle`: the queue consumes; each `enqueue` is timed alone, then the job is
  awaited (`wait_for_job`) before the next call, so the worker is idle when the call starts.
- `enqueue, C callers`: C tasks each calling `enqueue` in a loop on the paused queue: the
  latency each caller sees, and how many commits the calls took.

Commits are counted from outside the engine, in the WAL file (see wal.py): the WAL is emptied
before a burst of calls and its commit frames are counted after. A burst is kept small (the
count is only valid if SQLite did not restart the log during it). `calls/commit` = 1.0 means
every call committed on its own; C would mean C concurrent callers shared each commit.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

import contract  # noqa: E402
import wal  # noqa: E402
from queues import engine_source, machine  # noqa: E402

from engine import Engine  # noqa: E402


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    """p50/p95/p99/mean in µs."""
    cuts = statistics.quantiles(samples_ns, n=100, method="inclusive")
    return {
        "p50": cuts[49] / 1000,
        "p95": cuts[94] / 1000,
        "p99": cuts[98] / 1000,
        "mean": statistics.fmean(samples_ns) / 1000,
    }


class Row:
    def __init__(self, name: str, samples_ns: list[int], per_commit: str = "") -> None:
        self.name = name
        self.stats = percentiles(samples_ns)
        self.n = len(samples_ns)
        self.per_commit = per_commit


def open_wal(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
    return db


def raw_sqlite3(folder: Path, n: int) -> Row:
    path = folder / "raw.db"
    db = open_wal(path)
    samples = []
    for i in range(n):
        started = time.perf_counter_ns()
        db.execute("BEGIN")
        db.execute("INSERT INTO t (body) VALUES (?)", (f'{{"i": {i}}}',))
        db.execute("COMMIT")
        samples.append(time.perf_counter_ns() - started)
    db.close()
    return Row("raw sqlite3 commit", samples)


async def raw_thread_hop(folder: Path, n: int) -> Row:
    path = folder / "raw-hop.db"
    open_wal(path).close()
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA synchronous=NORMAL")

    def commit(i: int) -> None:
        db.execute("BEGIN")
        db.execute("INSERT INTO t (body) VALUES (?)", (f'{{"i": {i}}}',))
        db.execute("COMMIT")

    samples = []
    for i in range(n):
        started = time.perf_counter_ns()
        await anyio.to_thread.run_sync(commit, i)
        samples.append(time.perf_counter_ns() - started)
    db.close()
    return Row("raw commit, 1 thread hop", samples)


async def raw_aiosqlite(folder: Path, n: int) -> Row:
    import aiosqlite

    path = folder / "raw-aio.db"
    open_wal(path).close()
    samples = []
    async with aiosqlite.connect(path, isolation_level=None) as db:
        await db.execute("PRAGMA synchronous=NORMAL")
        for i in range(n):
            started = time.perf_counter_ns()
            await db.execute("BEGIN")
            await db.execute("INSERT INTO t (body) VALUES (?)", (f'{{"i": {i}}}',))
            await db.execute("COMMIT")
            samples.append(time.perf_counter_ns() - started)
    return Row("raw aiosqlite commit", samples)


async def timed_calls(
    call: Callable[[int], Awaitable[object]], total: int, callers: int
) -> list[int]:
    """`total` calls spread over `callers` concurrent tasks; each call's latency in ns."""
    samples: list[int] = []

    async def caller(first: int) -> None:
        for i in range(first, total, callers):
            started = time.perf_counter_ns()
            await call(i)
            samples.append(time.perf_counter_ns() - started)

    async with anyio.create_task_group() as group:
        for k in range(callers):
            group.start_soon(caller, k)
    return samples


async def commits_per_call(
    engine: Engine, database: Path, burst: int, callers: int
) -> tuple[str, list[int]]:
    """A burst of `burst` enqueues from `callers` tasks, counted in the WAL: 'x.x (c/n)'."""
    wal.truncate(database)
    samples = await timed_calls(lambda i: engine.enqueue(contract.QUEUE, {"i": i}), burst, callers)
    try:
        count = wal.count_commits(database)
    except wal.WalCountError as error:
        return f"? ({error})", samples
    if not count.commits:
        return "? (no commit frames)", samples
    return f"{burst / count.commits:.1f} ({burst} calls, {count.commits} commits)", samples


async def blok_rows(folder: Path, n: int, callers: int, burst: int) -> list[Row]:
    rows = []
    database = folder / "paused.db"
    async with Engine(
        workflows=[contract.workflow("echo", 8, "sqlite")], database=database
    ) as engine:
        await engine.pause(contract.QUEUE)
        for i in range(50):  # warm up: connections, statement cache, the job table's pages
            await engine.enqueue(contract.QUEUE, {"i": i})
        lone, _ = await commits_per_call(engine, database, burst, 1)
        samples = await timed_calls(lambda i: engine.enqueue(contract.QUEUE, {"i": i}), n, 1)
        rows.append(Row("enqueue, queue paused", samples, lone))
        shared, _ = await commits_per_call(engine, database, burst * callers, callers)
        samples = await timed_calls(lambda i: engine.enqueue(contract.QUEUE, {"i": i}), n, callers)
        rows.append(Row(f"enqueue, {callers} callers", samples, shared))

    # A web app's path: an engine with no workflows on the file the worker above declared its
    # queue in (paused), alone on it as the worker rows were (in a process of its own, its
    # worker elsewhere, a producer's loop does not also run the worker's).
    async with Engine(database=database) as producer:
        for i in range(50):
            await producer.enqueue(contract.QUEUE, {"i": i})
        alone, _ = await commits_per_call(producer, database, burst, 1)
        samples = await timed_calls(lambda i: producer.enqueue(contract.QUEUE, {"i": i}), n, 1)
        rows.append(Row("enqueue, producer engine", samples, alone))

    async with Engine(
        workflows=[contract.workflow("echo", 8, "sqlite")], database=folder / "idle.db"
    ) as engine:
        samples = []
        for i in range(n):
            started = time.perf_counter_ns()
            job_id = await engine.enqueue(contract.QUEUE, {"i": i})
            samples.append(time.perf_counter_ns() - started)
            await engine.wait_for_job(job_id, timeout=60)
        rows.append(Row("enqueue, worker idle", samples))
    return rows


def print_table(rows: list[Row], args: argparse.Namespace) -> None:
    print("\nOne enqueue on SQLite (WAL, synchronous=NORMAL): latency per call, µs")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"N = {args.n} calls per row; commits counted over bursts of {args.burst} per caller")
    head = "| row                      |     N |    p50 |    p95 |    p99 |   mean | calls/commit"
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:]))
    for row in rows:
        s = row.stats
        print(
            f"| {row.name:<24} | {row.n:>5} | {s['p50']:>6.0f} | {s['p95']:>6.0f} "
            f"| {s['p99']:>6.0f} | {s['mean']:>6.0f} | {row.per_commit}"
        )
    print("(goal: enqueue, queue paused: p50 ≤ 150 µs; C callers share commits)")


async def run(args: argparse.Namespace) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="blok-latency-") as name:
        folder = Path(name)
        rows = [raw_sqlite3(folder, args.n), await raw_thread_hop(folder, args.n)]
        rows.append(await raw_aiosqlite(folder, args.n))
        rows += await blok_rows(folder, args.n, args.callers, args.burst)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--burst", type=int, default=16, help="calls per caller, WAL counted")
    args = parser.parse_args(argv)
    print_table(anyio.run(run, args), args)


if __name__ == "__main__":
    main()
