"""Round trips a job on PostgreSQL: every statement of the contract path, counted and timed.

    python benchmarks/pg_statements.py                      # submit-all, N = 1000
    python benchmarks/pg_statements.py --shape producers -n 2000
    python benchmarks/pg_statements.py --url postgresql://postgres@127.0.0.1:5432/test

One fresh process, one fresh database on the server (dropped afterwards): `contract.py`'s shape
(the `echo` workflow, concurrency 8) on blok's PostgreSQL backend, with every asyncpg
connection's `execute`, `executemany`, `fetch`, `fetchrow` and `fetchval` wrapped while the
clock runs. Each is one round trip to the server (an `executemany` is one pipeline). The table
prints, for each statement (its first words), how many times a job ran it and the median wait
of one call: from the call until its answer was back in the event loop, so it includes the
server's work, the network and the time the loop took to come back to it.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

import asyncpg  # noqa: E402
import asyncpg.connection  # noqa: E402
import contract  # noqa: E402
from postgres import machine  # noqa: E402
from queues import engine_source  # noqa: E402
from scratch_pg import DEFAULT_URL, database_url  # noqa: E402

from engine import Engine  # noqa: E402

CALLS: Counter[str] = Counter()
WAITS: defaultdict[str, list[float]] = defaultdict(list)
COUNTING = [False]


def _timed(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def timed(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        if not COUNTING[0]:
            return await method(self, query, *args, **kwargs)
        key = re.sub(r"\s+", " ", query).strip()[:64]
        started = time.perf_counter()
        try:
            return await method(self, query, *args, **kwargs)
        finally:
            CALLS[key] += 1
            WAITS[key].append(time.perf_counter() - started)

    return timed


def wrap_connections() -> None:
    for name in ("execute", "executemany", "fetch", "fetchrow", "fetchval"):
        cls = asyncpg.connection.Connection
        setattr(cls, name, _timed(getattr(cls, name)))


async def measure(url: str, shape: str, n: int) -> float:
    name = f"blok_statements_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        flow = contract.workflow("echo", 8, "postgres")
        async with Engine(workflows=[flow], database=database_url(url, name)) as engine:
            COUNTING[0] = True
            started = time.perf_counter()
            runs = await contract.DRIVERS[shape](engine, n, 8)
            seconds = time.perf_counter() - started
            COUNTING[0] = False
            await contract.check(engine, runs, n, "echo", f"blok postgres/{shape}")
        return seconds
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--shape", choices=contract.SHAPES, default="submit-all")
    parser.add_argument("-n", type=int, default=1000)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    wrap_connections()
    seconds = asyncio.run(measure(args.url, args.shape, args.n))
    n = args.n
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(
        f"contract path ({args.shape}), PostgreSQL, N = {n}, concurrency 8: "
        f"{n / seconds:,.0f} jobs/s, {sum(CALLS.values()) / n:.2f} round trips a job"
    )
    print()
    print(f"| {'statement':<64} | a job | median wait, µs |")
    print(f"|{'-' * 66}|------:|----------------:|")
    for key, calls in CALLS.most_common(args.top):
        wait = statistics.median(WAITS[key]) * 1e6
        print(f"| {key:<64} | {calls / n:5.2f} | {wait:15,.0f} |")


if __name__ == "__main__":
    main()
