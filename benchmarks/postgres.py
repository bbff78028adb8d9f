"""No-op jobs per second end to end on PostgreSQL: blok, pgqueuer and procrastinate.

One invocation, one server: each system gets a fresh database on it and runs in a fresh Python
process (so no system inherits another's heap, imports or connections), in a scratch folder.
One measurement: the clock starts, N jobs with a small JSON payload are enqueued in one batch
(each system's batch call), a worker with concurrency C runs them all, and the clock stops when
the last one is done; then the script checks in the database that N were done.

Each system is set up as its documentation recommends:

- pgqueuer (docs "Quick Start", "Performance Tuning", "Concurrency Control"): schema by
  `Queries.install()`, a `PgQueuer` on a dedicated asyncpg connection (their driver of choice, and
  the docs' tip for the LISTEN connection), `entrypoint("noop")`, `run(mode=drain,
  max_concurrent_tasks=C, batch_size=C / 2)`: C jobs at once in one worker, the cap the docs
  give for a process (it must be at least twice the batch size). (`entrypoint(...,
  concurrency_limit=C)` is not used: it is a fleet-wide limit checked in the dequeue query, and
  below the batch size it stalls on the 0.1 s flush of the status buffer: ~80 jobs/s here.)
  A second row runs it the way its own
  `tools/benchmark.py --strategy drain --dequeue C` does: C queue managers, each on its own
  connection with batches of 10, no limit: pgqueuer's best case, up to 10·C jobs in flight.
  pgqueuer deletes a finished job and appends one line to `pgqueuer_log`: it keeps no record of
  the job's input or result.
- procrastinate (docs "Quickstart", "Batch defer", "Execute multiple jobs at the same time"):
  `App(connector=PsycopgConnector(...))`, schema by `schema_manager.apply_schema_async()`, an
  async task on queue "bench", `batch_defer_async`, `run_worker_async(concurrency=C,
  wait=False)`. It keeps each job row (`delete_jobs="never"`, its default) with its status.
- blok: `Engine(database="postgresql://...")` with one `WorkerTrigger(queue="bench",
  concurrency=C)` workflow of one no-op step, `enqueue_many`, then until the last run is
  completed; checked afterwards: N completed runs, each with its step and attempt records.

    python benchmarks/postgres.py [--url postgresql://postgres@127.0.0.1:5432/test] [-n 5000]
        [--concurrency 8] [--repeat 1] [--systems blok,pgqueuer,pgqueuer-8,procrastinate]

Two more measurements of blok on PostgreSQL, each next to blok on a SQLite file in the same
invocation (the same machine, at the same time), every case in a fresh process and database:

- `--contract`: the contract path (benchmarks/contract.py), one `enqueue` call per job and
  `wait_for_job` for each: `submit-all` (N jobs, then every result), `producers` (C concurrent
  producers, enqueue then wait, N jobs) and `sequential` (one job at a time, N / 10 jobs); the
  `echo` workflow, concurrency C.
- `--attach N`: a `blok-tui worker` process serves the database; an Engine with no workflows
  (what `blok-tui attach` runs) enqueues N short jobs one after the other and measures, from
  the worker's own timestamps of each run's start and end (written just before the commit that
  carries them), to the RunStarted / RunFinished event arriving here; then N / 10 times how long
  `cancel` of a running step takes until the worker has cancelled and stored it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
from scratch_pg import DEFAULT_URL, database_url

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("blok", "pgqueuer", "pgqueuer-8", "procrastinate")
LABELS = {
    "blok": "blok (runs, steps, attempts recorded)",
    "pgqueuer": "pgqueuer, 1 worker, max_concurrent_tasks=C",
    "pgqueuer-8": "pgqueuer, C workers x batch 10 (its benchmark)",
    "procrastinate": "procrastinate, worker concurrency=C",
}


class Skip(Exception):
    """This system cannot be measured here; the message says why."""


# ---- each system, run in a child process -------------------------------------------------------


async def run_pgqueuer(url: str, n: int, concurrency: int, workers: int) -> float:
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    setup = await asyncpg.connect(url)
    await Queries(AsyncpgDriver(setup)).install()
    connections = [await asyncpg.connect(url) for _ in range(max(1, workers))]
    done = 0
    queues = []
    for conn in connections:
        pgq = PgQueuer.from_asyncpg_connection(conn)

        @pgq.entrypoint("noop")
        async def noop(job: Job) -> None:
            nonlocal done
            done += 1

        queues.append(pgq)

    producer = Queries(AsyncpgDriver(setup))
    payload: list[bytes | None] = [json.dumps({"i": i}).encode() for i in range(n)]
    started = time.perf_counter()
    await producer.enqueue(["noop"] * n, payload, [0] * n)
    if workers == 0:
        # One worker, at most C jobs at once: `max_concurrent_tasks` is the per-process cap and
        # must be at least twice the batch size, so batches of C / 2.
        runs = [
            queues[0].run(
                mode=QueueExecutionMode.drain,
                batch_size=max(1, concurrency // 2),
                max_concurrent_tasks=concurrency,
            )
        ]
    else:
        runs = [pgq.run(mode=QueueExecutionMode.drain) for pgq in queues]
    await asyncio.gather(*runs)
    seconds = time.perf_counter() - started
    left = await setup.fetchval("SELECT count(*) FROM pgqueuer")
    if done != n or left != 0:
        raise SystemExit(f"pgqueuer: {done} of {n} jobs ran, {left} left in the queue")
    return seconds


async def run_procrastinate(url: str, n: int, concurrency: int) -> float:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(queue="bench")
    async def noop(i: int) -> None:
        return None

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        started = time.perf_counter()
        jobs: list[dict[str, Any]] = [{"i": i} for i in range(n)]
        await noop.batch_defer_async(*jobs)
        await app.run_worker_async(
            queues=["bench"], concurrency=concurrency, wait=False, install_signal_handlers=False
        )
        seconds = time.perf_counter() - started
    conn = await asyncpg.connect(url)
    succeeded = await conn.fetchval(
        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
    )
    await conn.close()
    if succeeded != n:
        raise SystemExit(f"procrastinate: {succeeded} of {n} jobs succeeded")
    return seconds


# ==== THE BLOK ROW ==============================================================================
# An Engine on the database URL (engine/backends/postgres). The check below refuses to time
# anything else: if no blok tables appeared in the PostgreSQL database, the URL was not used.
async def run_blok(url: str, n: int, concurrency: int) -> float:
    sys.path.insert(0, str(ROOT))
    import anyio

    from engine import Engine, Step, WorkerTrigger, Workflow

    async def noop(ctx: Any) -> None:
        return None

    workflow = Workflow(
        name="bench.noop",
        trigger=WorkerTrigger(queue="bench", concurrency=concurrency),
        steps=[Step("noop", noop)],
    )
    try:
        engine = Engine(workflows=[workflow], database=url)
    except Exception as error:  # the rejection is what this row reports
        raise Skip(f"Engine rejects the URL: {type(error).__name__}: {error}") from error
    try:
        async with engine:
            conn = await asyncpg.connect(url)
            blok_tables = await conn.fetchval(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'blok'"
                " AND tablename IN ('runs', 'jobs')"
            )
            await conn.close()
            if blok_tables != 2:
                taken = sorted(p.name for p in Path.cwd().iterdir())
                raise Skip(
                    "Engine did not open the PostgreSQL database (no blok tables in it; it"
                    f" created {taken} in its folder: it took the URL for a SQLite file name)"
                )
            payloads = [{"i": i} for i in range(n)]
            started = time.perf_counter()
            ids = await engine.enqueue_many("bench", payloads)
            await engine.wait_for_job(ids[-1], timeout=600)
            # The last job enqueued ends among the last C: poll the few ms until all N have.
            while (await engine.queue_stats("bench")).completed < n:  # noqa: ASYNC110
                await anyio.sleep(0.001)
            seconds = time.perf_counter() - started
            runs = await engine.runs(status="completed", queue="bench", limit=n + 1)
            if len(runs) != n:
                raise SystemExit(f"blok: {len(runs)} of {n} runs completed")
            sample = await engine.get_run(runs[n // 2].id)
            if not (sample.steps and sample.steps[0].attempts):
                raise SystemExit(f"blok: run {sample.id} lacks its step and attempt records")
    except Skip:
        raise
    except Exception as error:
        leaf: BaseException = error
        while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
            leaf = leaf.exceptions[0]
        if isinstance(leaf, Skip):
            raise leaf from error
        raise Skip(f"Engine failed on the URL: {type(leaf).__name__}: {leaf}") from error
    return seconds


# ==== end of the blok row =======================================================================


# ---- the contract path and attach latency, blok on PostgreSQL and on SQLite ---------------------
CONTRACT_SHAPES = ("submit-all", "producers", "sequential")
KINDS = ("postgres", "sqlite")


def blok_database(kind: str, url: str) -> str:
    """Where a child's blok engine keeps its data: the URL, or a file in its scratch folder."""
    return url if kind == "postgres" else str(Path.cwd() / "blok.db")


async def run_contract_shape(kind: str, url: str, shape: str, n: int, concurrency: int) -> float:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import contract

    from engine import Engine

    provider = "postgres" if kind == "postgres" else "sqlite"
    flow = contract.workflow("echo", concurrency, provider)
    async with Engine(workflows=[flow], database=blok_database(kind, url)) as engine:
        started = time.perf_counter()
        runs = await contract.DRIVERS[shape](engine, n, concurrency)
        seconds = time.perf_counter() - started
        await contract.check(engine, runs, n, "echo", f"blok {kind}/{shape}")
    return seconds


ATTACH_FLOW = """
import anyio
from engine import Step, Workflow, WorkerTrigger


async def nap(ctx, seconds: float):
    await anyio.sleep(seconds)
    return {"slept": seconds}


workflow = Workflow(
    name="bench.nap",
    trigger=WorkerTrigger(queue="naps", concurrency=4),
    steps=[Step("nap", nap, inputs={"seconds": "$.body.seconds"})],
)
"""


def start_attach_worker(database: str) -> subprocess.Popen[bytes]:
    """`blok-tui worker` on the database, once it says it is ready."""
    folder = Path.cwd() / "workflows"
    folder.mkdir()
    (folder / "naps.py").write_text(ATTACH_FLOW)
    with open("worker.log", "wb") as log:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "blok_tui", "worker", "--db", database),
                *("--workflows", str(folder), "--no-watch"),
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=ROOT,
        )
    assert worker.stdout is not None
    ready = worker.stdout.readline().decode()
    if not ready.startswith("blok worker "):
        raise SystemExit(f"attach: the worker did not start: {Path('worker.log').read_text()}")
    return worker


async def run_attach(kind: str, url: str, n: int) -> dict[str, list[float]]:
    sys.path.insert(0, str(ROOT))
    import anyio

    from engine import Engine, RunFinished, RunStarted, StepStarted

    database = blok_database(kind, url)
    worker = start_attach_worker(database)
    started: list[float] = []
    finished: list[float] = []
    cancels: list[float] = []
    try:
        async with Engine(database=database, create=False) as engine:
            events = engine.events()
            for _ in range(n):
                job_id = await engine.enqueue("naps", {"seconds": 0.05})
                run_id = (await engine.get_job(job_id)).run_id
                seen: dict[type, float] = {}
                with anyio.fail_after(10):
                    async for event in events:
                        if getattr(event, "run_id", None) != run_id:
                            continue
                        if isinstance(event, RunStarted | RunFinished):
                            seen[type(event)] = time.time()
                        if isinstance(event, RunFinished):
                            break
                run = await engine.get_run(run_id)
                assert run.started_at is not None and run.finished_at is not None
                started.append(seen[RunStarted] - run.started_at.timestamp())
                finished.append(seen[RunFinished] - run.finished_at.timestamp())
            for _ in range(max(1, n // 10)):
                job_id = await engine.enqueue("naps", {"seconds": 30})
                run_id = (await engine.get_job(job_id)).run_id
                with anyio.fail_after(10):
                    async for event in events:
                        if isinstance(event, StepStarted) and event.run_id == run_id:
                            break
                began = time.monotonic()
                run = await engine.cancel(run_id)
                cancels.append(time.monotonic() - began)
                assert run.status == "cancelled" and run.steps[0].status == "cancelled"
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    return {"started": started, "finished": finished, "cancel": cancels}


async def measure_blok(kind: str, url: str, mode: str, *extra: str) -> dict[str, Any]:
    """One blok measurement in a fresh process, on a fresh PostgreSQL database or SQLite file."""
    name = f"blok_bench_{mode.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(url)
    if kind == "postgres":
        await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        with tempfile.TemporaryDirectory(prefix="blok-pg-bench-") as folder:
            command = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--child",
                f"{mode}:{kind}",
                "--url",
                database_url(url, name),
                *extra,
            ]
            result = await asyncio.to_thread(
                subprocess.run, command, cwd=folder, capture_output=True, text=True, timeout=900
            )
        if result.returncode != 0:
            raise SystemExit(f"{mode} {kind}: exit {result.returncode}\n{result.stderr[-3000:]}")
        return dict(json.loads(result.stdout.strip().splitlines()[-1]))
    finally:
        if kind == "postgres":
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def contract_table(args: argparse.Namespace) -> None:
    sizes = {"submit-all": args.n, "producers": args.n, "sequential": max(1, args.n // 10)}
    seconds: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeat):
        for shape in CONTRACT_SHAPES:
            for kind in KINDS:
                extra = ["--shape", shape, "-n", str(sizes[shape])]
                extra += ["--concurrency", str(args.concurrency)]
                outcome = await measure_blok(kind, args.url, "contract", *extra)
                seconds.setdefault((shape, kind), []).append(outcome["seconds"])
    await header(args, f"contract path, echo workflow, C = {args.concurrency}")
    print("| shape      |     N | blok on PostgreSQL, jobs/s | blok on SQLite, jobs/s |")
    print("|------------|------:|---------------------------:|-----------------------:|")
    for shape in CONTRACT_SHAPES:
        rates = [sizes[shape] / statistics.median(seconds[(shape, k)]) for k in KINDS]
        print(f"| {shape:<10} | {sizes[shape]:>5} | {rates[0]:>26,.0f} | {rates[1]:>22,.0f} |")


async def attach_table(args: argparse.Namespace) -> None:
    results = {
        kind: await measure_blok(kind, args.url, "attach", "-n", str(args.attach)) for kind in KINDS
    }
    await header(
        args, f"attach latency, N = {args.attach} runs ({max(1, args.attach // 10)} cancels)"
    )
    print(
        "| from the worker's ... to the event here | PostgreSQL median / p95 ms | SQLite median / p95 ms |"
    )
    print(
        "|-----------------------------------------|---------------------------:|-----------------------:|"
    )
    labels = {"started": "run start", "finished": "run end", "cancel": "cancel call (to stored)"}
    for name, label in labels.items():
        cells = []
        for kind in KINDS:
            values = sorted(v * 1000 for v in results[kind][name])
            p95 = values[min(len(values) - 1, int(0.95 * len(values)))]
            cells.append(f"{statistics.median(values):.1f} / {p95:.1f}")
        print(f"| {label:<39} | {cells[0]:>26} | {cells[1]:>22} |")


async def header(args: argparse.Namespace, what: str) -> None:
    admin = await asyncpg.connect(args.url)
    server = str(await admin.fetchval("SHOW server_version")).split()[0]
    await admin.close()
    print(f"machine: {machine()}")
    print(f"server: PostgreSQL {server} on {args.url.split('@')[-1].split('/')[0]}")
    print(
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {what}; median of {args.repeat}"
    )
    print()


async def child(system: str, url: str, n: int, concurrency: int) -> dict[str, Any]:
    mode, _, kind = system.partition(":")
    if mode == "contract":
        return {"seconds": await run_contract_shape(kind, url, CHILD_SHAPE[0], n, concurrency)}
    if mode == "attach":
        return await run_attach(kind, url, n)
    try:
        if system == "blok":
            seconds = await run_blok(url, n, concurrency)
        elif system == "pgqueuer":
            seconds = await run_pgqueuer(url, n, concurrency, workers=0)
        elif system == "pgqueuer-8":
            seconds = await run_pgqueuer(url, n, concurrency, workers=concurrency)
        else:
            seconds = await run_procrastinate(url, n, concurrency)
    except Skip as skip:
        return {"skipped": str(skip)}
    return {"seconds": seconds}


# ---- the parent: databases, processes, the table -------------------------------------------


@dataclass
class Row:
    system: str
    seconds: list[float]
    skipped: str | None = None

    @property
    def rate(self) -> float:
        return 0.0 if not self.seconds else 1 / statistics.median(self.seconds)


async def measure_once(url: str, system: str, n: int, concurrency: int) -> dict[str, Any]:
    name = f"blok_bench_{system.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        with tempfile.TemporaryDirectory(prefix="blok-pg-bench-") as folder:
            command = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--child",
                system,
                "--url",
                database_url(url, name),
                "-n",
                str(n),
                "--concurrency",
                str(concurrency),
            ]
            result = await asyncio.to_thread(
                subprocess.run, command, cwd=folder, capture_output=True, text=True, timeout=900
            )
        if result.returncode != 0:
            raise SystemExit(f"{system}: exit {result.returncode}\n{result.stderr[-3000:]}")
        return dict(json.loads(result.stdout.strip().splitlines()[-1]))
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


async def parent(args: argparse.Namespace) -> None:
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"--systems: unknown {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
    rows = {system: Row(system, []) for system in systems}
    for _ in range(args.repeat):
        for system in systems:  # interleaved: each repeat runs every system once
            if rows[system].skipped:
                continue
            outcome = await measure_once(args.url, system, args.n, args.concurrency)
            if "skipped" in outcome:
                rows[system].skipped = outcome["skipped"]
            else:
                rows[system].seconds.append(outcome["seconds"] / args.n)

    admin = await asyncpg.connect(args.url)
    server = str(await admin.fetchval("SHOW server_version")).split()[0]
    await admin.close()
    versions = []
    for package in ("asyncpg", "pgqueuer", "procrastinate", "psycopg"):
        try:
            from importlib.metadata import version

            versions.append(f"{package} {version(package)}")
        except Exception:
            versions.append(f"{package} (not installed)")
    print(f"machine: {machine()}")
    print(f"server: PostgreSQL {server} on {args.url.split('@')[-1].split('/')[0]}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {', '.join(versions)}")
    print(f"N = {args.n} no-op jobs, concurrency C = {args.concurrency}, median of {args.repeat}")
    print()
    width = max(len(LABELS[s]) for s in systems)
    print(f"| {'system':<{width}} | {'jobs/s':>8} | {'seconds':>7} |")
    print(f"|{'-' * (width + 2)}|{'-' * 9}:|{'-' * 8}:|")
    for system in systems:
        row = rows[system]
        if row.skipped:
            print(f"| {LABELS[system]:<{width}} | {'skipped':>8} | {'':>7} |")
        else:
            seconds = statistics.median(row.seconds) * args.n
            print(f"| {LABELS[system]:<{width}} | {row.rate:>8,.0f} | {seconds:>7.2f} |")
    for system in systems:
        if rows[system].skipped:
            print(f"\n{system}: skipped: {rows[system].skipped}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("-n", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--contract", action="store_true", help="the contract path instead")
    parser.add_argument("--attach", type=int, metavar="N", help="attach latency instead")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--shape", choices=CONTRACT_SHAPES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        CHILD_SHAPE[0] = args.shape or ""
        print(json.dumps(asyncio.run(child(args.child, args.url, args.n, args.concurrency))))
    elif args.contract:
        asyncio.run(contract_table(args))
    elif args.attach:
        asyncio.run(attach_table(args))
    else:
        asyncio.run(parent(args))


CHILD_SHAPE = [""]  # the contract shape a child runs (set from --shape)


if __name__ == "__main__":
    main()
