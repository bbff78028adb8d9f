"""What an idle engine costs, by the number of workflows it serves: CPU time and database looks
while no job runs.

    python benchmarks/idle.py                           # memory, SQLite, PostgreSQL; W = 1, 50, 200
    python benchmarks/idle.py --providers sqlite --ws 1,200 --seconds 10
    python benchmarks/idle.py --url postgresql://postgres@127.0.0.1:5432/test

Each (queue, W) runs in a fresh process: an engine serving W one-step workflows, each on a
queue of its own with one worker slot, and no job anywhere. After SETTLE_S it measures, over
`--seconds`, the process's CPU time (user + system, `getrusage`) as a share of one core, the
claims its claim loops made (each a wake-up of an idle queue's loop) and the looks those
claims made in the database (SQLite: claim transactions, PostgreSQL: claim statements). On
PostgreSQL it also reads the CPU time of the server sessions it opened (`/proc/<pid>/stat` of
its backends in `pg_stat_activity`), as the database's share of the cost. Then how long the
engine takes to stop (leaving `async with Engine(...)`).

`--busy` measures the same engine next to another process that keeps the database busy (it
enqueues 100 one-step jobs at a time on a queue of its own and waits for them, for the whole
measurement): what its commits cost the idle engine (SQLite's watcher of the file's
`data_version`, PostgreSQL's NOTIFY), and how many jobs the busy process got through meanwhile.

The peer, measured the same way in the same invocation: an idle huey consumer as shipped (8
worker threads) on the same storage (MemoryHuey, SqliteHuey, SqlHuey on PostgreSQL). huey's
tasks all share one queue, so it serves any number of them for the cost of one; its consumer
polls with a backoff (0.1 s up to 10 s). Each PostgreSQL measurement has a database of its own
(`scratch_pg.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

import contract  # noqa: E402
import huey_peer  # noqa: E402
from fresh import emit, run_fresh  # noqa: E402
from queues import engine_source, machine  # noqa: E402
from scratch_pg import DEFAULT_URL, scratch_database  # noqa: E402

from engine import Engine, Step, WorkerTrigger, Workflow  # noqa: E402
from engine.backends.database_queue import DatabaseQueue  # noqa: E402
from engine.backends.memory import MemoryQueue  # noqa: E402
from engine.backends.postgres.queue import PostgresQueue  # noqa: E402
from engine.backends.sqlite import queue as sqlite_queue  # noqa: E402

SETTLE_S = 2.0  # after the engine started: its first claims and declarations are done
PROVIDERS = ("memory", "sqlite", "postgres")


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def server_cpu_s(url: str | None) -> float:
    """CPU seconds the PostgreSQL server's sessions on this measurement's database used so far
    (0 without PostgreSQL). The server runs on this machine: its backends' /proc entries."""
    if url is None:
        return 0.0
    import psycopg

    name = url.rsplit("/", 1)[1].split("?")[0]
    with psycopg.connect(url, autocommit=True) as conn:
        pids = [
            row[0]
            for row in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
        ]
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a session that ended meanwhile
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


@contextmanager
def counting(counts: dict[str, int]) -> Iterator[None]:
    """Count the claims of every queue and the looks of the database queues."""
    patched: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, wrapper: Callable[[Any], Any]) -> None:
        original = owner.__dict__[name]
        patched.append((owner, name, original))
        setattr(owner, name, wrapper(original))

    def claims(original: Any) -> Any:
        async def claim(*args: Any, **kwargs: Any) -> Any:
            counts["claims"] += 1
            return await original(*args, **kwargs)

        return claim

    def sqlite_looks(original: Any) -> Any:
        def look(*args: Any, **kwargs: Any) -> Any:
            counts["looks"] += 1
            return original(*args, **kwargs)

        return look

    def postgres_looks(original: Any) -> Any:
        async def look(*args: Any) -> Any:
            counts["looks"] += 1
            return await original.__func__(*args)

        return staticmethod(look)

    patch(MemoryQueue, "claim", claims)
    patch(DatabaseQueue, "claim", claims)
    patch(sqlite_queue, "_claim", sqlite_looks)
    patch(PostgresQueue, "_claim", postgres_looks)
    try:
        yield
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)


def workflows(w: int, provider: str) -> list[Workflow]:
    return [
        Workflow(
            name=f"idle{k}",
            steps=[Step("echo", contract.echo)],
            trigger=WorkerTrigger(queue=f"idle{k}", concurrency=1, provider=provider),
        )
        for k in range(w)
    ]


async def keep_busy(provider: str, database: str, seconds: float) -> dict[str, float]:
    """`--busy`'s other process: 100 jobs enqueued, then awaited, again and again."""
    workflow = contract.workflow("echo", 8, provider)
    done = 0
    async with Engine(workflows=[workflow], database=database) as engine:
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            ids = [await engine.enqueue(contract.QUEUE, {"i": i}) for i in range(100)]
            for job_id in ids:
                await engine.wait_for_job(job_id, timeout=60)
            done += len(ids)
        took = time.perf_counter() - started
    return {"jobs_s": done / took}


async def measure_blok(
    provider: str, w: int, seconds: float, url: str | None, busy: bool
) -> dict[str, float]:
    counts = {"claims": 0, "looks": 0}
    busy_jobs_s = 0.0
    with tempfile.TemporaryDirectory() as folder:
        database: str | None = None
        if provider == "sqlite":
            database = str(Path(folder) / "idle.db")
        elif provider == "postgres":
            database = url
        with counting(counts):
            async with Engine(workflows=workflows(w, provider), database=database):
                other = None
                if busy and database is not None:
                    argv = ["--keep-busy", provider, database, str(seconds + SETTLE_S)]
                    other = await asyncio.create_subprocess_exec(
                        sys.executable, __file__, *argv, stdout=asyncio.subprocess.PIPE
                    )
                await asyncio.sleep(SETTLE_S)
                for key in counts:
                    counts[key] = 0
                cpu, server, started = cpu_s(), server_cpu_s(url), time.perf_counter()
                await asyncio.sleep(seconds)
                took = time.perf_counter() - started
                cpu, server = cpu_s() - cpu, server_cpu_s(url) - server
                if other is not None:
                    out, _ = await other.communicate()
                    if other.returncode != 0:
                        raise SystemExit(f"the busy process failed (exit {other.returncode})")
                    busy_jobs_s = json.loads(out.decode().strip().splitlines()[-1])["jobs_s"]
                stopping = time.perf_counter()
            stop = time.perf_counter() - stopping
    return {
        "cpu": cpu / took,
        "server": server / took,
        "claims": counts["claims"] / took,
        "looks": counts["looks"] / took,
        "stop": stop,
        "busy_jobs_s": busy_jobs_s,
    }


def measure_huey(provider: str, seconds: float, url: str | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        huey = huey_peer.make_huey(provider, Path(folder), tuned=False, url=url)
        huey_peer.define_task(huey, "echo")
        consumer = huey_peer.start_consumer(huey, 8, tuned=False)
        try:
            time.sleep(SETTLE_S)
            cpu, server, started = cpu_s(), server_cpu_s(url), time.perf_counter()
            time.sleep(seconds)
            took = time.perf_counter() - started
            cpu, server = cpu_s() - cpu, server_cpu_s(url) - server
        finally:
            stopping = time.perf_counter()
            consumer.stop(graceful=True)
            stop = time.perf_counter() - stopping
    return {"cpu": cpu / took, "server": server / took, "claims": 0.0, "looks": 0.0, "stop": stop}


def one(
    system: str, provider: str, w: int, seconds: float, url: str, busy: bool
) -> dict[str, float]:
    if provider != "postgres":
        if system == "huey":
            return measure_huey(provider, seconds, None)
        return asyncio.run(measure_blok(provider, w, seconds, None, busy))
    with scratch_database(url, "blok_idle") as scratch:
        if system == "huey":
            return measure_huey(provider, seconds, scratch)
        return asyncio.run(measure_blok(provider, w, seconds, scratch, busy))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--providers", default=",".join(PROVIDERS))
    parser.add_argument("--ws", default="1,50,200")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--url", default=DEFAULT_URL, help="PostgreSQL server (admin database)")
    parser.add_argument("--busy", action="store_true", help="next to a busy process")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # system provider W
    parser.add_argument("--keep-busy", nargs=3, help=argparse.SUPPRESS)  # provider db seconds
    args = parser.parse_args()
    if args.keep_busy:
        provider, database, seconds = args.keep_busy
        emit(asyncio.run(keep_busy(provider, database, float(seconds))))
        return
    if args.one:
        system, provider, w = args.one
        emit(one(system, provider, int(w), args.seconds, args.url, args.busy))
        return
    if args.busy and "memory" in args.providers.split(","):
        raise SystemExit("--busy: a database is shared with another process; not memory")
    ws = [int(w) for w in args.ws.split(",")]
    rows: list[tuple[str, str, dict[str, float]]] = []
    for provider in args.providers.split(","):
        extra = ["--seconds", str(args.seconds), "--url", args.url, *(["--busy"] * args.busy)]
        huey = run_fresh(__file__, ["--one", "huey", provider, "1", *extra])
        rows.append((provider, "huey", huey))
        print(f"  huey     {provider:8s}: {huey['cpu']:6.1%} of a core", flush=True)
        for w in ws:
            found = run_fresh(__file__, ["--one", "blok", provider, str(w), *extra])
            rows.append((provider, f"blok W={w}", found))
            print(
                f"  blok W={w:<4d}{provider:8s}: {found['cpu']:6.1%} of a core, "
                f"{found['claims']:7.1f} claims/s, {found['looks']:7.1f} looks/s, "
                f"stopped in {found['stop'] * 1000:.0f} ms"
                + (f", the busy process {found['busy_jobs_s']:,.0f} jobs/s" if args.busy else ""),
                flush=True,
            )

    print()
    print("an idle engine: W one-step workflows served, each on its own queue, no job")
    if args.busy:
        print("next to another process keeping the database busy (100 jobs at a time)")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"measured over {args.seconds:g} s after {SETTLE_S:g} s, one fresh process each")
    print()
    print(
        "| queue | system | CPU, share of a core | vs huey | server CPU | claims/s | looks/s "
        "| stop |"
    )
    print("|---|---|--:|--:|--:|--:|--:|--:|")
    peer: dict[str, float] = {}
    for provider, system, found in rows:
        if system == "huey":
            peer[provider] = found["cpu"]
        ratio = found["cpu"] / peer[provider] if peer.get(provider) else float("nan")
        server = f"{found['server']:.1%}" if provider == "postgres" else ""
        print(
            f"| {provider} | {system} | {found['cpu']:.1%} | {ratio:.1f}x | {server} "
            f"| {found['claims']:,.1f} | {found['looks']:,.1f} | {found['stop'] * 1000:,.0f} ms |"
        )


if __name__ == "__main__":
    main()
