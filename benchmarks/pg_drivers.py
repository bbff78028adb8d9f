"""asyncpg against psycopg 3 (async), on the statements blok's PostgreSQL backend sends.

Each driver runs the same four workloads on a fresh database with blok's schema
(`engine/backends/postgres/schema.py`) and its statements (`sql.py`):

- enqueue: one job row INSERTed and committed per call (autocommit), latency per call.
- group commit: one transaction of 500 fenced upserts, 167 runs, 167 steps and 166 attempts, half
  of them new rows and half rewrites of the previous batch's (`executemany` per statement, as the
  writer does), latency per transaction.
- claim: 8 claimers, each on its own connection, take batches of 10 with the claim statement
  (`UPDATE … FROM (SELECT … FOR UPDATE SKIP LOCKED) … RETURNING`) until the queue is empty;
  jobs/s and latency per claim; checks that no job was taken twice.
- notify: from `pg_notify` sent on one connection to the listener's callback on another.

psycopg uses `AsyncRawCursor` (the server's `$n` placeholders, so both send the same SQL) and
prepares statements after its default threshold; its `executemany` pipelines. asyncpg prepares
every statement and pipelines `executemany` too. The drivers alternate, `--rounds` times, on a
fresh database each; the table gives the median of the rounds.

    python benchmarks/pg_drivers.py [--url postgresql://postgres@127.0.0.1:5432/test] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import asyncpg
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.backends import rows
from engine.backends.base import Fence
from engine.backends.postgres import schema, sql
from engine.backends.postgres.batch import run_rows
from engine.backends.rows import JOB_COLUMNS
from engine.ledger import make_job, make_run
from engine.models import AttemptStatus, Job, RunStatus, StepStatus
from engine.records import assign
from engine.runner import pending_step, running_attempt

ENQUEUE_N = 1000
GROUP_BATCHES = 30
GROUP_ROWS = 500
CLAIM_JOBS = 8000
CLAIMERS = 8
CLAIM_BATCH = 10
NOTIFY_N = 300


class Driver(Protocol):
    name: str

    async def execute(self, query: str, *args: Any) -> None: ...
    async def fetch(self, query: str, *args: Any) -> list[tuple[Any, ...]]: ...
    async def executemany(self, query: str, rows: Sequence[Sequence[Any]]) -> None: ...
    async def transaction(self, body: Callable[[], Awaitable[None]]) -> None: ...
    async def listen(self, channel: str, callback: Callable[[str], None]) -> None: ...
    async def close(self) -> None: ...


class Asyncpg:
    name = "asyncpg"

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    @classmethod
    async def connect(cls, url: str) -> Asyncpg:
        return cls(await asyncpg.connect(url, server_settings={"search_path": schema.SCHEMA}))

    async def execute(self, query: str, *args: Any) -> None:
        await self.conn.execute(query, *args)

    async def fetch(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in await self.conn.fetch(query, *args)]

    async def executemany(self, query: str, rows: Sequence[Sequence[Any]]) -> None:
        await self.conn.executemany(query, rows)

    async def transaction(self, body: Callable[[], Awaitable[None]]) -> None:
        async with self.conn.transaction():
            await body()

    async def listen(self, channel: str, callback: Callable[[str], None]) -> None:
        await self.conn.add_listener(channel, lambda _c, _pid, _ch, payload: callback(payload))

    async def close(self) -> None:
        await self.conn.close()


class Psycopg:
    name = "psycopg"

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self._listener: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, url: str) -> Psycopg:
        conn = await psycopg.AsyncConnection.connect(
            url,
            autocommit=True,
            cursor_factory=psycopg.AsyncRawCursor,
            options=f"-c search_path={schema.SCHEMA}",
        )
        return cls(conn)

    async def execute(self, query: str, *args: Any) -> None:
        await self.conn.execute(query, args)

    async def fetch(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        cursor = await self.conn.execute(query, args)
        return list(await cursor.fetchall())

    async def executemany(self, query: str, rows: Sequence[Sequence[Any]]) -> None:
        async with self.conn.cursor() as cursor:
            await cursor.executemany(query, rows)

    async def transaction(self, body: Callable[[], Awaitable[None]]) -> None:
        async with self.conn.transaction():
            await body()

    async def listen(self, channel: str, callback: Callable[[str], None]) -> None:
        await self.conn.execute(f"LISTEN {channel}")

        async def pump() -> None:
            async for notify in self.conn.notifies():
                callback(notify.payload)

        self._listener = asyncio.create_task(pump())

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
        await self.conn.close()


DRIVERS: dict[str, Callable[[str], Awaitable[Driver]]] = {
    "asyncpg": Asyncpg.connect,
    "psycopg": Psycopg.connect,
}


@dataclass
class Measure:
    latencies: list[float] = field(default_factory=list)  # seconds
    count: int = 0
    seconds: float = 0.0
    cpu: float = 0.0  # this process's CPU seconds over the workload (the driver's client side)

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    @property
    def rate(self) -> float:
        return self.count / self.seconds

    @property
    def cpu_us(self) -> float:
        return self.cpu / self.count * 1e6


# The rows are the backend's own: the engine's records (`make_job`, `make_run`, the runner's
# step and attempt) through its row codecs (`backends/rows.py`, `batch.run_rows`), so the
# statements get what the writer sends them however the schema grows.
INSERT_JOB = (
    f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)})"
    f" VALUES ({', '.join(f'${n}' for n in range(1, len(JOB_COLUMNS) + 1))})"
)
NOTIFY = "SELECT pg_notify($1, $2)"


def bench_job(i: int, queue: str = "bench") -> Job:
    return make_job(
        queue=queue,
        workflow_name="bench.noop",
        payload={"n": i, "order": "A1"},
        headers=None,
        priority=0,
        run_at=None,
        max_retries=0,
        job_id=f"job-{i}",
    )


def job_row(i: int, queue: str = "bench") -> tuple[Any, ...]:
    return rows.job_row(bench_job(i, queue))


def run_records(i: int, status: str) -> tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]:
    """The run, step and attempt rows of job `i`'s one-step run, `running` or `completed`,
    each with its fence (the job at epoch 1) after it, as the writer's batch sends them."""
    now = datetime.now(UTC)
    done = status != "running"
    job = bench_job(i)
    run = make_run(job, workflow_version="v1", status=RunStatus(status))
    step = pending_step(0, "charge", "step", max_attempts=3)
    attempt = running_attempt(1, now)
    assign(step, status=StepStatus(status), started_at=now, input={"order_id": "A1"})
    assign(run, started_at=now, state={"charge": {"charged": 5}} if done else {})
    if done:
        assign(attempt, status=AttemptStatus.COMPLETED, finished_at=now)
        assign(step, finished_at=now, output={"charged": 5})
        assign(run, finished_at=now, output={"ok": True})
    step.attempts.append(attempt)
    run.steps.append(step)
    [run_row], [step_row], [attempt_row] = run_rows([(run, Fence(job.id, 1))])
    return run_row, step_row, attempt_row


async def enqueue(db: Driver) -> Measure:
    measure = Measure()
    cpu = time.process_time()
    start = time.perf_counter()
    for i in range(ENQUEUE_N):
        t0 = time.perf_counter()
        await db.execute(INSERT_JOB, *job_row(i))
        measure.latencies.append(time.perf_counter() - t0)
    measure.seconds = time.perf_counter() - start
    measure.cpu = time.process_time() - cpu
    measure.count = ENQUEUE_N
    return measure


async def group_commit(db: Driver) -> Measure:
    per = GROUP_ROWS // 3 + 1  # 167 runs, 167 steps, 166 attempts
    fresh_n = per // 2 + 1
    # The jobs the fenced upserts name, held at epoch 1.
    await db.executemany(INSERT_JOB, [job_row(i) for i in range(per * (GROUP_BATCHES + 1))])
    await db.execute("UPDATE jobs SET epoch = 1")
    measure = Measure()
    for batch in range(GROUP_BATCHES + 1):  # batch 0 warms up: it has nothing to rewrite
        # Half new rows (runs that started), half rewrites of the last batch's (they finished).
        fresh = range(batch * per, batch * per + fresh_n)
        again = range((batch - 1) * per, (batch - 1) * per + per - fresh_n) if batch else ()
        made = [run_records(i, "running") for i in fresh]
        made += [run_records(i, "completed") for i in again]
        runs = [run for run, _, _ in made]
        steps = [step for _, step, _ in made]
        attempts = [attempt for _, _, attempt in made][: GROUP_ROWS - 2 * per]

        async def body(
            runs: list[tuple[Any, ...]] = runs,
            steps: list[tuple[Any, ...]] = steps,
            attempts: list[tuple[Any, ...]] = attempts,
        ) -> None:
            await db.executemany(sql.UPSERT_RUN, runs)
            await db.executemany(sql.UPSERT_STEP, steps)
            await db.executemany(sql.UPSERT_ATTEMPT, attempts)

        cpu = time.process_time()
        t0 = time.perf_counter()
        await db.transaction(body)
        if batch:
            measure.cpu += time.process_time() - cpu
            measure.latencies.append(time.perf_counter() - t0)
            measure.count += len(runs) + len(steps) + len(attempts)
            measure.seconds += time.perf_counter() - t0
    rows = await db.fetch("SELECT count(*) FROM runs")
    assert rows[0][0] > 0, "the fenced upserts wrote nothing"
    return measure


async def claim(db: Driver, url: str, connect: Callable[[str], Awaitable[Driver]]) -> Measure:
    await db.executemany(INSERT_JOB, [job_row(i) for i in range(CLAIM_JOBS)])
    claimers = [await connect(url) for _ in range(CLAIMERS)]
    measure = Measure()
    taken: list[str] = []

    async def claimer(conn: Driver, worker: str) -> None:
        while True:
            t0 = time.perf_counter()
            rows = await conn.fetch(sql.CLAIM, "bench", CLAIM_BATCH, worker, 30.0, 0)
            measure.latencies.append(time.perf_counter() - t0)
            if not rows:
                return
            taken.extend(row[0] for row in rows)

    cpu = time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(claimer(c, f"w{n}") for n, c in enumerate(claimers)))
    measure.seconds = time.perf_counter() - start
    measure.cpu = time.process_time() - cpu
    for conn in claimers:
        await conn.close()
    if len(taken) != CLAIM_JOBS or len(set(taken)) != CLAIM_JOBS:
        raise SystemExit(f"claim: {len(taken)} claims of {len(set(taken))} jobs, {CLAIM_JOBS} made")
    measure.count = CLAIM_JOBS
    return measure


async def notify(db: Driver, url: str, connect: Callable[[str], Awaitable[Driver]]) -> Measure:
    listener = await connect(url)
    woken: asyncio.Queue[float] = asyncio.Queue()
    await listener.listen("blok_bench", lambda _payload: woken.put_nowait(time.perf_counter()))
    measure = Measure()
    cpu = time.process_time()
    start = time.perf_counter()
    for _ in range(NOTIFY_N):
        t0 = time.perf_counter()
        await db.execute(NOTIFY, "blok_bench", "q")
        t1 = await asyncio.wait_for(woken.get(), timeout=5)
        measure.latencies.append(t1 - t0)
    measure.seconds = time.perf_counter() - start
    measure.cpu = time.process_time() - cpu
    measure.count = NOTIFY_N
    await listener.close()
    return measure


WORKLOADS = ("enqueue", "group commit", "claim", "notify")


async def one_round(url: str, driver: str) -> dict[str, Measure]:
    name = f"blok_drivers_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        db_url = url.rsplit("/", 1)[0] + f"/{name}"
        setup = await asyncpg.connect(db_url)
        await schema.migrate(setup)
        await setup.close()
        connect = DRIVERS[driver]
        results: dict[str, Measure] = {}
        for workload in WORKLOADS:
            db = await connect(db_url)
            await db.execute("TRUNCATE jobs, runs, steps, attempts")
            if workload == "enqueue":
                results[workload] = await enqueue(db)
            elif workload == "group commit":
                results[workload] = await group_commit(db)
            elif workload == "claim":
                results[workload] = await claim(db, db_url, connect)
            else:
                results[workload] = await notify(db, db_url, connect)
            await db.close()
        return results
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    rounds: dict[str, list[dict[str, Measure]]] = {name: [] for name in DRIVERS}
    for _ in range(args.rounds):
        for driver in DRIVERS:
            rounds[driver].append(await one_round(args.url, driver))

    admin = await asyncpg.connect(args.url)
    server = str(await admin.fetchval("SHOW server_version")).split()[0]
    await admin.close()
    print(f"{machine()}, PostgreSQL {server} on the same host, asyncpg {asyncpg.__version__},")
    print(f"psycopg {psycopg.__version__}; median of {args.rounds} rounds, drivers alternating")
    print()
    units = {
        "enqueue": (f"{ENQUEUE_N} calls", "call"),
        "group commit": (f"{GROUP_BATCHES} x {GROUP_ROWS} rows", "transaction"),
        "claim": (f"{CLAIM_JOBS} jobs, {CLAIMERS} claimers x {CLAIM_BATCH}", "claim"),
        "notify": (f"{NOTIFY_N} notifications", "wake-up"),
    }
    rate_unit = {"group commit": "rows/s", "claim": "jobs/s"}
    cpu_unit = {"group commit": "row", "claim": "job"}
    rows: list[tuple[str, ...]] = []
    for workload in WORKLOADS:
        n, unit = units[workload]
        med: dict[str, dict[str, float]] = {}
        for driver in DRIVERS:
            ms = [r[workload] for r in rounds[driver]]
            med[driver] = {
                "p50": statistics.median(m.pct(0.5) for m in ms),
                "p95": statistics.median(m.pct(0.95) for m in ms),
                "rate": statistics.median(m.rate for m in ms),
                "cpu": statistics.median(m.cpu_us for m in ms),
            }
        a, p = med["asyncpg"], med["psycopg"]
        rows.append(
            (
                workload,
                n,
                f"ms p50 / p95 per {unit}",
                f"{a['p50']:.3f} / {a['p95']:.3f}",
                f"{p['p50']:.3f} / {p['p95']:.3f}",
                f"{p['p50'] / a['p50']:.2f}x",
            )
        )
        if workload in rate_unit:
            rows.append(
                (
                    "",
                    "",
                    rate_unit[workload],
                    f"{a['rate']:,.0f}",
                    f"{p['rate']:,.0f}",
                    f"{a['rate'] / p['rate']:.2f}x",
                )
            )
        per = cpu_unit.get(workload, unit)
        rows.append(
            (
                "",
                "",
                f"client CPU µs per {per}",
                f"{a['cpu']:.1f}",
                f"{p['cpu']:.1f}",
                f"{p['cpu'] / a['cpu']:.2f}x",
            )
        )
    header = ("workload", "N", "measure", "asyncpg", "psycopg", "asyncpg better by")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print(
        "|" + "|".join("-" * (w + 1) + (":" if i > 2 else "-") for i, w in enumerate(widths)) + "|"
    )
    for row in rows:
        cells = [
            c.ljust(w) if i < 3 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    asyncio.run(main())
