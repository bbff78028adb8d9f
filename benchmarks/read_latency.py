"""What `wait_for_job` on a finished job and `get_run` cost, next to one raw read.

    python benchmarks/read_latency.py                  # 2000 finished jobs, each read once

The goal (issue 14): `wait_for_job` and `get_run` cost what one read costs: no polling, no
deep copies. For each provider an engine runs N one-step jobs to completion (not timed); then
each call is timed alone, once per job, in this order: `wait_for_job(job_id)` on the finished
job, then `get_run(run_id)`. For reference, one row of about the same size read by primary
key from a plain SQLite file (WAL): in the calling thread, and in a worker thread
(`anyio.to_thread.run_sync`), the floor for async code.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

import contract  # noqa: E402
from enqueue_latency import Row, open_wal  # noqa: E402
from queues import engine_source, machine  # noqa: E402


async def engine_rows(provider: str, folder: Path, n: int) -> list[Row]:
    async with contract.open_engine(provider, "echo", 8, folder) as engine:
        ids = [await engine.enqueue(contract.QUEUE, {"i": i}) for i in range(n)]
        run_ids = [(await engine.wait_for_job(job_id, timeout=60)).id for job_id in ids]
        waits, gets = [], []
        for job_id, run_id in zip(ids, run_ids, strict=True):
            started = time.perf_counter_ns()
            await engine.wait_for_job(job_id, timeout=60)
            waits.append(time.perf_counter_ns() - started)
            started = time.perf_counter_ns()
            await engine.get_run(run_id)
            gets.append(time.perf_counter_ns() - started)
    return [
        Row(f"{provider}: wait_for_job, done", waits),
        Row(f"{provider}: get_run", gets),
    ]


async def raw_rows(folder: Path, n: int) -> list[Row]:
    path = folder / "raw-read.db"
    db = open_wal(path)
    body = '{"i": 1, "output": 1, "status": "completed", "steps": [' + '"x", ' * 60 + '"x"]}'
    db.executemany("INSERT INTO t (id, body) VALUES (?, ?)", [(i, body) for i in range(n)])
    db.close()
    db = sqlite3.connect(path, check_same_thread=False)

    def read(i: int) -> object:
        return db.execute("SELECT body FROM t WHERE id = ?", (i,)).fetchone()

    here, hop = [], []
    for i in range(n):
        started = time.perf_counter_ns()
        read(i)
        here.append(time.perf_counter_ns() - started)
    for i in range(n):
        started = time.perf_counter_ns()
        await anyio.to_thread.run_sync(read, i)
        hop.append(time.perf_counter_ns() - started)
    db.close()
    return [Row("raw sqlite3 read", here), Row("raw read, 1 thread hop", hop)]


async def run(n: int) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="blok-read-") as name:
        folder = Path(name)
        rows = await raw_rows(folder, n)
        for provider in ("memory", "sqlite"):
            rows += await engine_rows(provider, folder, n)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000)
    args = parser.parse_args(argv)
    rows = anyio.run(run, args.n)
    print("\nReading a finished job's run: latency per call, µs")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    head = "| row                          |     N |    p50 |    p95 |    p99 |   mean |"
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
    for row in rows:
        s = row.stats
        print(
            f"| {row.name:<28} | {row.n:>5} | {s['p50']:>6.0f} | {s['p95']:>6.0f} "
            f"| {s['p99']:>6.0f} | {s['mean']:>6.0f} |"
        )
    print("(goal: wait_for_job and get_run cost what one read costs)")


if __name__ == "__main__":
    main()
