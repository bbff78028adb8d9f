"""blok against DBOS Transact on SQLite: 3-step workflows, jobs/s and the ratio blok/DBOS.

    pip install -e '.[bench]'          # DBOS is in the bench extra
    python benchmarks/dbos_peer.py                     # N = 2000, both shapes
    python benchmarks/dbos_peer.py -n 500 --shapes submit-all --repeat 3

DBOS Transact is a durable-workflow library that, like blok, records every workflow and every
step in its database. The setup (DBOS 3.x, sync API, as DBOS's docs show it):

- `DBOS(config={"name": ..., "system_database_url": "sqlite:///<file>"})`: the system database
  on SQLite. DBOS opens it through SQLAlchemy with `BEGIN IMMEDIATE` transactions; we add
  `journal_mode=WAL` and `synchronous=NORMAL` on every connection (a SQLAlchemy `connect`
  listener), blok's own durability level, so neither side pays an fsync per commit.
- A workflow of three `@DBOS.step()`s, each returning its input plus one.
- `DBOS.launch()`, then `DBOS.register_queue("bench", worker_concurrency=8,
  polling_interval_sec=0.01)`; jobs go in with `queue.enqueue(workflow, i)`, results come back
  with `handle.get_result(polling_interval_sec=0.01)`.
- blok: an Engine on a SQLite file with a 3-step workflow (`contract.py`'s `three`) on a queue
  of concurrency 8; `enqueue` + `wait_for_job`.

Shapes (see contract.py): `submit-all` (the headline: enqueue N one call each, then await each
in order) and `producers` (8 producer threads / tasks, each enqueue → await in a loop). Every
measurement runs in a fresh subprocess, systems interleaved, median of `--repeat`. After the
clock: every result is the input plus three; DBOS has 3 step records per workflow in its
`operation_outputs` table, blok 3 step records per run.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

import contract  # noqa: E402
from fresh import emit, run_fresh  # noqa: E402
from queues import engine_source, machine  # noqa: E402

SYSTEMS = ("blok", "dbos")
SHAPES = ("submit-all", "producers")


def tune_sqlite() -> list[int]:
    """WAL + synchronous=NORMAL on every SQLite connection SQLAlchemy opens; returns the
    `synchronous` level each connection reports (1 = NORMAL), to check the tuning took."""
    import sqlalchemy as sa

    levels: list[int] = []

    @sa.event.listens_for(sa.engine.Engine, "connect")
    def pragmas(dbapi_connection: Any, record: Any) -> None:
        if isinstance(dbapi_connection, sqlite3.Connection):
            dbapi_connection.execute("PRAGMA journal_mode=WAL")
            dbapi_connection.execute("PRAGMA synchronous=NORMAL")
            levels.append(dbapi_connection.execute("PRAGMA synchronous").fetchone()[0])

    return levels


def run_dbos(shape: str, n: int, concurrency: int, folder: Path) -> float:
    from dbos import DBOS

    levels = tune_sqlite()
    path = folder / f"dbos-{time.monotonic_ns()}.sqlite"
    DBOS(
        config={
            "name": "blok-bench",
            "system_database_url": f"sqlite:///{path}",
            "log_level": "WARNING",
        }
    )

    @DBOS.step()
    def first(i: int) -> int:
        return i + 1

    @DBOS.step()
    def second(i: int) -> int:
        return i + 1

    @DBOS.step()
    def third(i: int) -> int:
        return i + 1

    @DBOS.workflow()
    def three(i: int) -> int:
        return third(second(first(i)))

    DBOS.launch()
    try:
        queue = DBOS.register_queue(
            "bench", worker_concurrency=concurrency, polling_interval_sec=0.01
        )
        values: list[int] = []
        lock = threading.Lock()
        started = time.perf_counter()
        if shape == "submit-all":
            handles = [queue.enqueue(three, i) for i in range(n)]
            values = [h.get_result(polling_interval_sec=0.01) for h in handles]
        else:

            def producer(first_i: int) -> None:
                for i in range(first_i, n, concurrency):
                    value = queue.enqueue(three, i).get_result(polling_interval_sec=0.01)
                    with lock:
                        values.append(value)

            threads = [threading.Thread(target=producer, args=(k,)) for k in range(concurrency)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        seconds = time.perf_counter() - started
    finally:
        DBOS.destroy()
    if sorted(values) != [i + 3 for i in range(n)]:
        raise SystemExit(f"dbos {shape}: {len(values)} of {n} results, or wrong ones")
    if not levels or any(level != 1 for level in levels):
        raise SystemExit(f"dbos: SQLite connections not at synchronous=NORMAL: {levels}")
    with sqlite3.connect(path) as db:
        mode = db.execute("PRAGMA journal_mode").fetchone()[0]
        steps = db.execute("SELECT count(*) FROM operation_outputs").fetchone()[0]
    if mode != "wal" or steps < 3 * n:
        raise SystemExit(f"dbos: journal_mode {mode}, {steps} step records for {n} workflows")
    return seconds


def measure_here(system: str, shape: str, n: int, concurrency: int) -> float:
    with tempfile.TemporaryDirectory(prefix="blok-dbos-") as name:
        if system == "dbos":
            return run_dbos(shape, n, concurrency, Path(name))
        return asyncio.run(
            contract.run_contract("sqlite", "three", shape, n, concurrency, Path(name))
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        system, shape = args.one.split(":")
        emit({"seconds": measure_here(system, shape, args.n, args.concurrency)})
        return
    shapes = args.shapes.split(",")
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeat):
        for shape in shapes:
            for system in SYSTEMS:
                argv_one = ["--one", f"{system}:{shape}", "-n", str(args.n)]
                argv_one += ["--concurrency", str(args.concurrency)]
                seconds = run_fresh(__file__, argv_one)["seconds"]
                times.setdefault((system, shape), []).append(seconds)
                print(f"  {system} {shape}: {args.n / seconds:,.0f} jobs/s", file=sys.stderr)
    from importlib.metadata import version

    print("\nblok vs DBOS Transact on SQLite (WAL + synchronous=NORMAL): 3-step workflows/s")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(
        f"dbos {version('dbos')}, N = {args.n}, concurrency = {args.concurrency}, "
        f"median of {args.repeat} run(s) each"
    )
    head = "| shape      |   blok |   DBOS | blok/DBOS |"
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
    for shape in shapes:
        blok = args.n / statistics.median(times[("blok", shape)])
        dbos = args.n / statistics.median(times[("dbos", shape)])
        print(f"| {shape:<10} | {blok:>6,.0f} | {dbos:>6,.0f} | {blok / dbos:>8.1f}x |")
    print("(goal: blok at least 10x DBOS on the submit-all shape)")


if __name__ == "__main__":
    main()
