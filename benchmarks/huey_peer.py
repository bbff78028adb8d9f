"""huey, driven the way `contract.py` drives blok, for `peer.py`.

`huey` is huey as shipped: `MemoryHuey` / `SqliteHuey` with their defaults (the result store on;
`SqliteHuey` in WAL with SQLite's `synchronous=FULL`, an fsync per commit) and huey's own
consumer (`huey.create_consumer`) with C worker threads and its default polling (an idle worker
sleeps 0.1 s, growing to 10 s). A result is awaited with `result.get(blocking=True)`, which
polls the result store (first look at once, then sleeps from 50 ms up, x1.15 each time).

`huey-tuned` (bulk rows only, as before) is huey made as fast as it goes and matched to blok
where blok differs: polling at `initial_delay=0.001, max_delay=0.01`, `results=False`, and
WAL with `synchronous=NORMAL`, blok's own durability.

On PostgreSQL (`peer.py --providers postgres`), huey as shipped is `SqlHuey` (huey's
`huey.contrib.sql_huey`, on peewee, the `bench` extra) with the database URL: its tasks, results
and schedule are rows, claimed with `FOR UPDATE SKIP LOCKED`, each write its own transaction at
the server's durability (synchronous_commit on, as blok's). `huey-tuned` there is the same with
the fast polling and no result store (there is no `synchronous` to match).

On the contract path the task returns its number (huey stores no result for a task that returns
None, and a blocking `get` would then never return); blok's `echo` step returns the number too.
On the bulk path it returns None, as blok's `noop` step does: nothing is stored.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import contract

START_WAIT = 0.2  # the consumer's threads are up and polling, as blok's engine is


def make_huey(provider: str, folder: Path, tuned: bool, url: str | None = None) -> Any:
    """`url`: the PostgreSQL database for the postgres provider (see scratch_pg.py)."""
    from huey import MemoryHuey, SqliteHuey
    from huey.storage import SqliteStorage

    class NormalSyncStorage(SqliteStorage):  # type: ignore[misc]
        """huey's storage with blok's durability level: WAL + synchronous=NORMAL."""

        def _create_connection(self):  # type: ignore[no-untyped-def]
            conn = super()._create_connection()
            conn.execute("pragma synchronous=1")
            return conn

    options: dict[str, object] = {"results": False} if tuned else {}
    if provider == "memory":
        return MemoryHuey("bench", **options)
    if provider == "postgres":
        from huey.contrib.sql_huey import SqlHuey

        if url is None:
            raise SystemExit("huey on PostgreSQL needs a database URL")
        return SqlHuey("bench", database=url, **options)
    if tuned:
        options["storage_class"] = NormalSyncStorage
    path = str(folder / f"huey-{time.monotonic_ns()}.db")
    return SqliteHuey("bench", filename=path, **options)


def define_task(huey: Any, body: str, returns: bool = True) -> Callable[[int], Any]:
    """`returns=False`: the task returns None, so huey stores no result (the bulk rows)."""
    if body == "sleep10":

        def job(i: int) -> int | None:
            time.sleep(0.01)
            return i if returns else None
    else:

        def job(i: int) -> int | None:
            return i if returns else None

    return huey.task(name=f"bench.{body}")(job)  # type: ignore[no-any-return]


def start_consumer(huey: Any, concurrency: int, tuned: bool) -> Any:
    polling = {"initial_delay": 0.001, "max_delay": 0.01} if tuned else {}
    consumer = huey.create_consumer(
        workers=concurrency, worker_type="thread", periodic=False, **polling
    )
    consumer.start()
    time.sleep(START_WAIT)
    return consumer


def drive(task: Callable[[int], Any], shape: str, n: int, concurrency: int) -> list[int]:
    """N tasks through `shape` (see contract.py): each one's result, awaited as huey awaits."""
    if shape == "submit-all":
        results = [task(i) for i in range(n)]
        return [r.get(blocking=True, timeout=600) for r in results]
    if shape == "sequential":
        return [task(i).get(blocking=True, timeout=600) for i in range(n)]
    if shape != "producers":
        raise SystemExit(f"unknown shape {shape!r}")
    return contract.producers_in_threads(
        lambda i: task(i).get(blocking=True, timeout=600), n, concurrency
    )


def run_contract(
    provider: str,
    body: str,
    shape: str,
    n: int,
    concurrency: int,
    folder: Path,
    url: str | None = None,
) -> float:
    """Seconds for N tasks through `shape` (see contract.py), huey as shipped."""
    huey = make_huey(provider, folder, tuned=False, url=url)
    task = define_task(huey, body)
    consumer = start_consumer(huey, concurrency, tuned=False)
    try:
        started = time.perf_counter()
        values = drive(task, shape, n, concurrency)
        seconds = time.perf_counter() - started
    finally:
        consumer.stop(graceful=True)
    if sorted(values) != list(range(n)):
        raise SystemExit(f"huey {provider}/{body}/{shape}: {len(values)} of {n} results")
    return seconds


def run_bulk(
    provider: str,
    body: str,
    n: int,
    concurrency: int,
    folder: Path,
    tuned: bool,
    url: str | None = None,
) -> float:
    """Seconds from the first enqueue until huey signals the N-th task complete.

    huey has no bulk enqueue, so tasks go in one call each; completion is counted with huey's
    `SIGNAL_COMPLETE` hook, which fires right after a task ran (no result is awaited)."""
    from huey.signals import SIGNAL_COMPLETE, SIGNAL_ERROR

    huey = make_huey(provider, folder, tuned, url)
    task = define_task(huey, body, returns=False)
    done = threading.Event()
    lock = threading.Lock()
    count = 0
    errors: list[str] = []

    @huey.signal(SIGNAL_COMPLETE)  # type: ignore[untyped-decorator]
    def completed(signal: str, task: object) -> None:
        nonlocal count
        with lock:
            count += 1
            if count == n:
                done.set()

    @huey.signal(SIGNAL_ERROR)  # type: ignore[untyped-decorator]
    def failed(signal: str, task: object, exc: BaseException | None = None) -> None:
        errors.append(f"{task}: {exc!r}")
        done.set()

    consumer = start_consumer(huey, concurrency, tuned)
    try:
        started = time.perf_counter()
        for i in range(n):
            task(i)
        finished = done.wait(600)
        seconds = time.perf_counter() - started
    finally:
        consumer.stop(graceful=True)
    if errors or not finished:
        raise SystemExit(f"huey {provider}/{body}: {count} of {n} completed; {errors[:1]}")
    return seconds
