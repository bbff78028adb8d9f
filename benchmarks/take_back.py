"""How long a worker's start takes to take back a memory queue's pending runs, this checkout
against an earlier commit, in one invocation.

    python benchmarks/take_back.py --against faa4393                # SQLite and PostgreSQL
    python benchmarks/take_back.py --against HEAD~2 --ns 1000,10000 --repeat 5

A memory queue on a database keeps its jobs in the memory of the worker serving it, and their
runs in the database. When that worker is gone, the next worker serving the queue takes its
pending runs back (engine/memory_runs.py) before it serves anything. For each N, a fresh
process sets up N queued runs of a memory queue whose worker has stopped (an engine that
enqueued them on a paused queue), then times a new engine's start, until its queue holds the N
jobs again. Both engines run alternately, each measurement in a fresh process that imports one
of the two engines; on PostgreSQL each has a scratch database of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fresh import emit, run_fresh  # noqa: E402
from scratch_pg import DEFAULT_URL, database_for  # noqa: E402
from versus import alternate, chosen, import_engine  # noqa: E402

PROVIDERS = ("sqlite", "postgres")
QUEUE = "naps"


def one(engine: str, n: int, url: str) -> None:
    """The child: set up N pending runs of a gone worker, then time the start that takes
    them back, with the engine in folder `engine`."""
    import_engine(engine)
    from engine import Engine, Step, WorkerTrigger, Workflow

    async def nap(ctx: object) -> None:
        return None

    trigger = WorkerTrigger(queue=QUEUE, concurrency=2, provider="memory")
    flows = [Workflow(name="naps", trigger=trigger, steps=[Step("nap", nap)])]

    async def measure(database: str) -> float:
        async with Engine(workflows=flows, database=database) as first:
            await first.pause(QUEUE)  # kept in the database: the next engine starts paused
            await first.enqueue_many(QUEUE, [{"i": i} for i in range(n)])
        started = time.perf_counter()
        async with Engine(workflows=flows, database=database) as second:
            took = time.perf_counter() - started
            stats = await second.queue_stats(QUEUE)
            if stats.waiting != n:
                raise SystemExit(f"{stats.waiting} of {n} runs taken back")
        return took

    with tempfile.TemporaryDirectory() as folder:
        seconds = asyncio.run(measure(url or str(Path(folder) / "blok.db")))
    emit({"seconds": seconds})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="the earlier commit (any git revision)")
    parser.add_argument("--providers", default="sqlite,postgres")
    parser.add_argument("--ns", default="1000,5000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--url", default=DEFAULT_URL, help="the PostgreSQL server (postgres)")
    parser.add_argument("--one", nargs=3, metavar=("ENGINE", "N", "URL"))
    args = parser.parse_args(argv)
    if args.one:
        engine, n, url = args.one
        one(engine, int(n), "" if url == "-" else url)
        return
    if not args.against:
        parser.error("--against is required: the commit to measure this checkout against")
    providers = chosen(args.providers, PROVIDERS)
    ns = [int(n) for n in args.ns.split(",") if n]

    def measure(engine: str, case: tuple[str, int]) -> dict[str, Any]:
        provider, n = case
        with database_for(provider, args.url, "blok_take_back") as url:
            return run_fresh(__file__, ["--one", engine, str(n), url])

    results = alternate(
        args.against,
        args.repeat,
        [(provider, n) for provider in providers for n in ns],
        measure,
        lambda case, result: f"{case[0]:8} N={case[1]}: {result['seconds'] * 1000:,.0f} ms",
        "a worker's start that takes back N pending runs of a memory queue: ms",
    )
    print(f"median of {args.repeat}, fresh processes, the two engines alternating")
    print()
    print("| database | N | ms before | this | before/this | range of ms (before; this) |")
    print("|---|--:|--:|--:|--:|---|")
    for provider in providers:
        for n in ns:
            old = [r["seconds"] * 1000 for r in results[((provider, n), "before")]]
            new = [r["seconds"] * 1000 for r in results[((provider, n), "this")]]
            print(
                f"| {provider} | {n:,} | {statistics.median(old):,.0f} | "
                f"{statistics.median(new):,.0f} | "
                f"{statistics.median(old) / statistics.median(new):.1f}x | "
                f"{min(old):,.0f}-{max(old):,.0f}; {min(new):,.0f}-{max(new):,.0f} |"
            )


if __name__ == "__main__":
    main()
