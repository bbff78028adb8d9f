"""`enqueue` into a paused queue with a backlog, this checkout against an earlier commit, in
one invocation.

    python benchmarks/paused_enqueue.py --against faa4393             # memory, N = 5000
    python benchmarks/paused_enqueue.py --against HEAD~1 --providers memory,sqlite -n 20000

An operator pauses a queue (`p` in the console) while its producers go on enqueuing: the jobs
pile up until it is resumed. A paused queue still claims the jobs an operator forces ("run
now"), so every enqueue wakes its claim. For each provider, a fresh process enqueues N jobs one
call each into a paused queue and prints the µs an enqueue took over the first and the last
thousand; the two engines alternate, each measurement in a fresh process that imports one of
them. On PostgreSQL each has a scratch database of its own.
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

PROVIDERS = ("memory", "sqlite", "postgres")
QUEUE = "held"
BLOCK = 1000  # enqueues timed together


def one(engine: str, provider: str, n: int, url: str) -> None:
    """The child: N enqueues into a paused queue, with the engine in folder `engine`."""
    import_engine(engine)
    from engine import Engine, Step, WorkerTrigger, Workflow

    async def echo(ctx: object) -> None:
        return None

    trigger = WorkerTrigger(queue=QUEUE, concurrency=8, provider=provider)
    flows = [Workflow(name="held", trigger=trigger, steps=[Step("echo", echo)])]

    async def measure(database: str | None) -> list[float]:
        blocks: list[float] = []
        async with Engine(workflows=flows, database=database) as engine:
            await engine.pause(QUEUE)
            for first in range(0, n, BLOCK):
                started = time.perf_counter()
                for i in range(first, min(n, first + BLOCK)):
                    await engine.enqueue(QUEUE, {"i": i})
                blocks.append((time.perf_counter() - started) / BLOCK)
            stats = await engine.queue_stats(QUEUE)
            if stats.waiting != n:
                raise SystemExit(f"{stats.waiting} of {n} jobs waiting")
        return blocks

    with tempfile.TemporaryDirectory() as folder:
        database = url or (None if provider == "memory" else str(Path(folder) / "blok.db"))
        blocks = asyncio.run(measure(database))
    emit({"first": blocks[0], "last": blocks[-1], "all": sum(blocks) * BLOCK})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="the earlier commit (any git revision)")
    parser.add_argument("--providers", default="memory")
    parser.add_argument("-n", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--url", default=DEFAULT_URL, help="the PostgreSQL server (postgres)")
    parser.add_argument("--one", nargs=3, metavar=("ENGINE", "PROVIDER", "URL"))
    args = parser.parse_args(argv)
    if args.one:
        engine, provider, url = args.one
        one(engine, provider, args.n, "" if url == "-" else url)
        return
    if not args.against:
        parser.error("--against is required: the commit to measure this checkout against")
    if args.n < BLOCK:
        parser.error(f"-n must be at least {BLOCK}")
    providers = chosen(args.providers, PROVIDERS)

    def measure(engine: str, provider: str) -> dict[str, Any]:
        with database_for(provider, args.url, "blok_paused") as url:
            return run_fresh(__file__, ["--one", engine, provider, url, "-n", str(args.n)])

    results = alternate(
        args.against,
        args.repeat,
        providers,
        measure,
        lambda provider, result: (
            f"{provider:8}: {result['first'] * 1e6:,.0f} µs an enqueue at first, "
            f"{result['last'] * 1e6:,.0f} at the end"
        ),
        f"enqueue into a paused queue, one call each: µs an enqueue, N = {args.n:,}",
    )
    print(f"median of {args.repeat}, fresh processes, the two engines alternating")
    print()
    print(
        f"| queue | first {BLOCK:,}: before | this | last {BLOCK:,}: before | this "
        "| all N, s: before | this | before/this (all N) |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|")

    def median(provider: str, label: str, key: str, scale: float = 1.0) -> float:
        return statistics.median(r[key] * scale for r in results[(provider, label)])

    for provider in providers:
        old_all, new_all = median(provider, "before", "all"), median(provider, "this", "all")
        print(
            f"| {provider} | {median(provider, 'before', 'first', 1e6):,.0f} | "
            f"{median(provider, 'this', 'first', 1e6):,.0f} | "
            f"{median(provider, 'before', 'last', 1e6):,.0f} | "
            f"{median(provider, 'this', 'last', 1e6):,.0f} | {old_all:,.2f} | {new_all:,.2f} | "
            f"{old_all / new_all:,.1f}x |"
        )


if __name__ == "__main__":
    main()
