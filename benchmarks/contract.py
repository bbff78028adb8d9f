"""blok on the path a user of the contract takes: `enqueue` one job per call, `wait_for_job` each.

The shapes of that path, all measured with the clock started on an idle, running engine and
stopped when the last job's run has been returned by `wait_for_job`:

- `submit-all` (the headline): enqueue N jobs one call each, then `wait_for_job` each in order,
  as a script that submits a batch of work and collects the results does. The queue's C slots
  stay busy, so this is the throughput of the per-call API; the waits cost what they cost, but
  how often a waiter polls hardly matters, because most jobs are done by the time their waiter
  looks. This is the shape the issue's goals were measured on.
- `producers`: C concurrent producers, each doing enqueue → wait_for_job in a loop, as C
  request handlers of a web app do. At most C jobs are ever in flight, so this is bound by the
  round trip of one job (enqueue commit, claim wake-up, completion notice): for a system that
  polls for results it mostly measures its polling interval.
- `sequential`: one job in flight at a time: the latency of a round trip, as jobs/s.
- `bulk` is not here: it is `enqueue_many` (see `queues.py`).

Workflows: `echo` (one step returning the job's number), `sleep10` (one step awaiting 10 ms,
returning the number) and `three` (three steps, each returning its input plus one).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import anyio

from engine import Engine, Run, Step, WorkerTrigger, Workflow

SHAPES = ("submit-all", "producers", "sequential")
QUEUE = "bench"


async def echo(ctx: Any) -> int:
    return int(ctx.body["i"])


async def sleep10(ctx: Any) -> int:
    await anyio.sleep(0.01)
    return int(ctx.body["i"])


async def first(ctx: Any) -> int:
    return int(ctx.body["i"]) + 1


async def second(ctx: Any) -> int:
    return int(ctx.state["first"]) + 1


async def third(ctx: Any) -> int:
    return int(ctx.state["second"]) + 1


def workflow(body: str, concurrency: int, provider: str) -> Workflow:
    trigger = WorkerTrigger(queue=QUEUE, concurrency=concurrency, provider=provider)
    if body == "three":
        steps = [Step("first", first), Step("second", second), Step("third", third)]
    elif body == "sleep10":
        steps = [Step("sleep10", sleep10)]
    else:
        steps = [Step("echo", echo)]
    return Workflow(name=f"bench.{body}", trigger=trigger, steps=steps)


def open_engine(
    provider: str,
    body: str,
    concurrency: int,
    folder: Path,
    database: str | None = None,
    **options: Any,
) -> Engine:
    """An engine serving the one benchmark workflow: on `database` (a PostgreSQL URL) when
    given, else a fresh SQLite file under `folder` for the SQLite provider, else in memory."""
    if database is None and provider == "sqlite":
        database = str(folder / f"blok-{body}-{time.monotonic_ns()}.db")
    if provider == "postgres" and database is None:
        raise SystemExit("the postgres provider needs a database URL")
    return Engine(workflows=[workflow(body, concurrency, provider)], database=database, **options)


async def submit_all(engine: Engine, n: int, concurrency: int) -> list[Run]:
    ids = [await engine.enqueue(QUEUE, {"i": i}) for i in range(n)]
    return [await engine.wait_for_job(job_id, timeout=600) for job_id in ids]


async def producers(engine: Engine, n: int, concurrency: int) -> list[Run]:
    runs: list[Run] = []

    async def producer(first: int) -> None:
        for i in range(first, n, concurrency):
            job_id = await engine.enqueue(QUEUE, {"i": i})
            runs.append(await engine.wait_for_job(job_id, timeout=600))

    async with anyio.create_task_group() as group:
        for k in range(concurrency):
            group.start_soon(producer, k)
    return runs


def producers_in_threads(round_trip: Callable[[int], Any], n: int, concurrency: int) -> list[Any]:
    """`producers` for a peer whose calls block: `concurrency` threads, each doing
    `round_trip(i)` (enqueue job i, await its result) for its share of the N jobs, as a web
    app's request threads do. The results, in the order they came."""
    values: list[Any] = []
    lock = threading.Lock()

    def producer(first: int) -> None:
        for i in range(first, n, concurrency):
            value = round_trip(i)
            with lock:
                values.append(value)

    threads = [threading.Thread(target=producer, args=(k,)) for k in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return values


async def sequential(engine: Engine, n: int, concurrency: int) -> list[Run]:
    runs = []
    for i in range(n):
        job_id = await engine.enqueue(QUEUE, {"i": i})
        runs.append(await engine.wait_for_job(job_id, timeout=600))
    return runs


DRIVERS: dict[str, Callable[[Engine, int, int], Awaitable[list[Run]]]] = {
    "submit-all": submit_all,
    "producers": producers,
    "sequential": sequential,
}


def expected_output(body: str, i: int) -> int:
    return i + 3 if body == "three" else i


async def check(engine: Engine, runs: list[Run], n: int, body: str, label: str) -> None:
    """After the clock: every job completed with its own output, and its records are whole."""
    bad = [r for r in runs if r.status != "completed"]
    if len(runs) != n or bad:
        raise SystemExit(f"{label}: {len(runs)} runs returned, {len(bad)} not completed")
    for run in runs[:: max(1, n // 20)]:
        stored = await engine.get_run(run.id)
        steps_ok = all(s.status == "completed" and s.attempts for s in stored.steps)
        expected = len(workflow(body, 1, "memory").steps)
        if len(stored.steps) != expected or not steps_ok:
            raise SystemExit(f"{label}: run {run.id} lacks its step records")
        i = int(stored.input["i"])
        if stored.output != expected_output(body, i):  # a run's output is its last step's
            raise SystemExit(f"{label}: run {run.id} output {stored.output!r} for input {i}")


async def run_contract(
    provider: str,
    body: str,
    shape: str,
    n: int,
    concurrency: int,
    folder: Path,
    clocked: Callable[[], AbstractContextManager[object]] = nullcontext,
    database: str | None = None,
) -> float:
    """Seconds for N jobs through `shape` on a fresh engine; checks the records afterwards.
    `clocked()` is entered for the timed part alone (a measurement of what happens while the
    clock runs: not the engine's opening, nor the checks after). `database`: a PostgreSQL URL
    (see open_engine)."""
    async with open_engine(provider, body, concurrency, folder, database) as engine:
        with clocked():
            started = time.perf_counter()
            runs = await DRIVERS[shape](engine, n, concurrency)
            seconds = time.perf_counter() - started
        await check(engine, runs, n, body, f"blok {provider}/{body}/{shape}")
    return seconds
