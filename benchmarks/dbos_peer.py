"""blok against DBOS Transact on SQLite or PostgreSQL: workflows/s and the ratio blok/DBOS.

    pip install -e '.[bench]'          # DBOS is in the bench extra
    python benchmarks/dbos_peer.py                     # N = 2000, both shapes, on SQLite
    python benchmarks/dbos_peer.py -n 500 --shapes submit-all --repeat 3
    python benchmarks/dbos_peer.py --database postgres --workflows three,echo

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

On PostgreSQL (`--database postgres`, the server at `--url`), both systems keep everything on
the server, each measurement in a database of its own (dropped afterwards): DBOS with
`system_database_url` set to it (its tables in the `dbos` schema, reached through SQLAlchemy
and psycopg), blok with `Engine(database=<url>)`; both commit at the server's durability
(synchronous_commit on). No tuning on either side.

Workflows (`--workflows`): `three` (the issue's goal, three steps) and `echo` (one step returning
its input: a DBOS workflow awaited with `get_result` is DBOS's contract path, a job and its
result).

Shapes (see contract.py): `submit-all` (the headline: enqueue N one call each, then await each
in order) and `producers` (8 producer threads / tasks, each enqueue → await in a loop). Every
measurement runs in a fresh subprocess, systems interleaved, median of `--repeat`. After the
clock: every result is the input plus three (`echo`: the input); DBOS has a step record per
step in its `operation_outputs` table, blok a step record per step of each run.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

import contract  # noqa: E402
from fresh import emit, run_fresh  # noqa: E402
from queues import engine_source, machine  # noqa: E402
from scratch_pg import DEFAULT_URL, scratch_database  # noqa: E402

SYSTEMS = ("blok", "dbos")
SHAPES = ("submit-all", "producers")
DATABASES = ("sqlite", "postgres")
WORKFLOWS = ("three", "echo")
STEPS = {"three": 3, "echo": 1}


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


def run_dbos(
    shape: str, body: str, n: int, concurrency: int, database: str, postgres: bool
) -> float:
    """`database`: a SQLite file's path, or a PostgreSQL URL (`postgres`)."""
    from dbos import DBOS

    levels = [] if postgres else tune_sqlite()
    DBOS(
        config={
            "name": "blok-bench",
            "system_database_url": database if postgres else f"sqlite:///{database}",
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

    @DBOS.step()
    def echo(i: int) -> int:
        return i

    @DBOS.workflow()
    def three(i: int) -> int:
        return third(second(first(i)))

    @DBOS.workflow()
    def one(i: int) -> int:
        return echo(i)

    workflow = three if body == "three" else one
    DBOS.launch()
    try:
        queue = DBOS.register_queue(
            "bench", worker_concurrency=concurrency, polling_interval_sec=0.01
        )
        started = time.perf_counter()
        if shape == "submit-all":
            handles = [queue.enqueue(workflow, i) for i in range(n)]
            values = [h.get_result(polling_interval_sec=0.01) for h in handles]
        else:
            values = contract.producers_in_threads(
                lambda i: queue.enqueue(workflow, i).get_result(polling_interval_sec=0.01),
                n,
                concurrency,
            )
        seconds = time.perf_counter() - started
    finally:
        DBOS.destroy()
    if sorted(values) != [contract.expected_output(body, i) for i in range(n)]:
        raise SystemExit(f"dbos {shape}: {len(values)} of {n} results, or wrong ones")
    steps = count_dbos_steps(database) if postgres else check_dbos_sqlite(database, levels)
    if steps < STEPS[body] * n:
        raise SystemExit(f"dbos: {steps} step records for {n} {body} workflows")
    return seconds


def check_dbos_sqlite(path: str, levels: list[int]) -> int:
    """The SQLite tuning took (WAL, synchronous=NORMAL on every connection); DBOS's step
    records."""
    if not levels or any(level != 1 for level in levels):
        raise SystemExit(f"dbos: SQLite connections not at synchronous=NORMAL: {levels}")
    with sqlite3.connect(path) as db:
        mode = db.execute("PRAGMA journal_mode").fetchone()[0]
        steps: int = db.execute("SELECT count(*) FROM operation_outputs").fetchone()[0]
    if mode != "wal":
        raise SystemExit(f"dbos: journal_mode {mode}")
    return steps


def count_dbos_steps(url: str) -> int:
    import psycopg

    with psycopg.connect(url) as db:
        row = db.execute("SELECT count(*) FROM dbos.operation_outputs").fetchone()
    return int(row[0]) if row else 0


def measure_here(
    system: str, shape: str, body: str, n: int, concurrency: int, database: str, url: str
) -> float:
    """One measurement in this (fresh) process, on a fresh SQLite file or PostgreSQL database."""
    with tempfile.TemporaryDirectory(prefix="blok-dbos-") as name:
        if database == "sqlite":
            if system == "dbos":
                path = Path(name) / f"dbos-{time.monotonic_ns()}.sqlite"
                return run_dbos(shape, body, n, concurrency, str(path), postgres=False)
            blok = contract.run_contract("sqlite", body, shape, n, concurrency, Path(name))
            return asyncio.run(blok)
        with scratch_database(url, f"blok_dbos_{system}") as scratch:
            if system == "dbos":
                return run_dbos(shape, body, n, concurrency, scratch, postgres=True)
            blok = contract.run_contract(
                "postgres", body, shape, n, concurrency, Path(name), database=scratch
            )
            return asyncio.run(blok)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--database", choices=DATABASES, default="sqlite")
    parser.add_argument("--url", default=DEFAULT_URL, help="the PostgreSQL server (postgres)")
    parser.add_argument("--workflows", default="three", help=",".join(WORKFLOWS))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        system, shape, body = args.one.split(":")
        seconds = measure_here(
            system, shape, body, args.n, args.concurrency, args.database, args.url
        )
        emit({"seconds": seconds})
        return
    shapes = args.shapes.split(",")
    bodies = args.workflows.split(",")
    for body in bodies:
        if body not in WORKFLOWS:
            raise SystemExit(f"unknown workflow {body!r}; choose from {WORKFLOWS}")
    cases = [(body, shape) for body in bodies for shape in shapes]
    times: dict[tuple[str, str, str], list[float]] = {}
    for _ in range(args.repeat):
        for body, shape in cases:
            for system in SYSTEMS:
                argv_one = ["--one", f"{system}:{shape}:{body}", "-n", str(args.n)]
                argv_one += ["--concurrency", str(args.concurrency)]
                argv_one += ["--database", args.database, "--url", args.url]
                seconds = run_fresh(__file__, argv_one)["seconds"]
                times.setdefault((system, body, shape), []).append(seconds)
                rate = args.n / seconds
                print(f"  {system} {body} {shape}: {rate:,.0f} workflows/s", file=sys.stderr)
    from importlib.metadata import version

    where = {
        "sqlite": "SQLite (WAL + synchronous=NORMAL)",
        "postgres": "PostgreSQL (synchronous_commit on)",
    }[args.database]
    print(f"\nblok vs DBOS Transact on {where}: workflows/s")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(
        f"dbos {version('dbos')}, N = {args.n}, concurrency = {args.concurrency}, "
        f"median of {args.repeat} run(s) each"
    )
    head = "| workflow | shape      |   blok |   DBOS | blok/DBOS |"
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
    for body, shape in cases:
        blok = args.n / statistics.median(times[("blok", body, shape)])
        dbos = args.n / statistics.median(times[("dbos", body, shape)])
        print(f"| {body:<8} | {shape:<10} | {blok:>6,.0f} | {dbos:>6,.0f} | {blok / dbos:>8.1f}x |")
    print("(goal: blok at least 10x DBOS with three steps, submit-all, on SQLite)")


if __name__ == "__main__":
    main()
