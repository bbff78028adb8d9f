"""Where a job's SQLite time goes: every statement of the contract path, timed, per job.

    python benchmarks/statements.py              # N = 2000, submit-all, one-step `echo`
    python benchmarks/statements.py -n 3000 --top 20

One fresh process runs `contract.py`'s headline shape on a fresh SQLite file with every
`sqlite3` connection of the process (the engine's writer and point reader, and aiosqlite's
thread) made through a connection class that times `execute` and `executemany`: the time
inside SQLite's own code and the module's binding, not the Python that builds the rows. The
table prints, for each statement (its first words; literals vary, so the SQL text as sent,
with `?` for parameters), how many times a job ran it, the µs it cost a job and the µs of one
call, then the job's total time and the part of it spent in statements in the event loop's thread
(rows marked `[thread]` ran in another thread: aiosqlite's, a checkpoint's). Only statements run while
the clock runs are counted. The timing wrapper adds about a microsecond a call, so the jobs/s
here is a little below `contract.py`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sqlite3
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

import contract  # noqa: E402
from queues import engine_source, machine  # noqa: E402

SPENT: dict[str, float] = defaultdict(float)  # seconds by statement
CALLS: Counter[str] = Counter()
COUNTING = threading.Event()  # set while the clock runs


def _key(sql: str) -> str:
    # Statements run in another thread (aiosqlite's, a checkpoint's) are marked: they do not
    # hold up the event loop the way the writer's do.
    text = re.sub(r"\s+", " ", sql).strip()
    if threading.current_thread() is not threading.main_thread():
        text = "[thread] " + text
    return text[:72]


@contextmanager
def _timed(sql: str, calls: int) -> Iterator[None]:
    if not COUNTING.is_set():
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        key = _key(sql)
        SPENT[key] += time.perf_counter() - started
        CALLS[key] += calls


class TimedConnection(sqlite3.Connection):
    """A connection that adds each statement's time to SPENT, by its SQL."""

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        with _timed(sql, 1):
            return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> sqlite3.Cursor:
        rows = list(parameters)
        with _timed(sql, len(rows)):
            return super().executemany(sql, rows)


@contextmanager
def clocked() -> Iterator[None]:
    """Statements are counted from here (the clock starts) until the clock stops."""
    SPENT.clear()
    CALLS.clear()
    COUNTING.set()
    try:
        yield
    finally:
        COUNTING.clear()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    # Every connection the engine (and aiosqlite) opens from here on is a timed one.
    sqlite3.connect = partial(sqlite3.connect, factory=TimedConnection)  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as folder:
        seconds = asyncio.run(
            contract.run_contract(
                "sqlite", "echo", "submit-all", args.n, 8, Path(folder), clocked=clocked
            )
        )
    n = args.n
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"contract path (submit-all), SQLite, N = {n}, concurrency 8: {n / seconds:,.0f} jobs/s")
    print()
    print(f"| {'statement':<72} | a job | µs a job | µs a call |")
    print(f"|{'-' * 74}|------:|---------:|----------:|")
    for key, spent in sorted(SPENT.items(), key=lambda kv: kv[1], reverse=True)[: args.top]:
        print(
            f"| {key:<72} | {CALLS[key] / n:5.2f} | {spent * 1e6 / n:8.1f} |"
            f" {spent * 1e6 / CALLS[key]:9.1f} |"
        )
    total = sum(v for k, v in SPENT.items() if not k.startswith("[thread]"))
    calls = sum(v for k, v in CALLS.items() if not k.startswith("[thread]"))
    print()
    print(
        f"a job: {seconds * 1e6 / n:,.0f} µs of wall time, {total * 1e6 / n:,.0f} µs of it in "
        f"{calls / n:.1f} statements in the event loop's thread ({100 * total / seconds:.0f} %)"
    )


if __name__ == "__main__":
    main()
