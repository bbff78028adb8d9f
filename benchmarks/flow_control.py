"""What flow control costs: jobs per second with a concurrency-key gate, and inner steps per
second in for_each, each against a plain peer run in the same process on the same store.

Usage: python benchmarks/flow_control.py [--jobs 2000] [--items 2000] [--memory]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from engine import Engine, Step, WorkerTrigger, Workflow, for_each


def noop(ctx: Any) -> int:
    return 1


async def noop_async(ctx: Any) -> int:
    return 1


def workflows() -> list[Workflow]:
    plain = Workflow(
        name="plain",
        trigger=WorkerTrigger(queue="plain", concurrency=8),
        steps=[Step("work", noop_async)],
    )
    keyed = Workflow(
        name="keyed",
        trigger=WorkerTrigger(
            queue="keyed",
            concurrency=8,
            concurrency_key="$.body.k",
            concurrency_limit=8,  # as wide as the queue: the gate's own cost, no waiting
            on_limit="queue",
            limit_backoff="1ms",
        ),
        steps=[Step("work", noop_async)],
    )
    flat = Workflow(
        name="flat",
        trigger=WorkerTrigger(queue="flat"),
        steps=[Step("work", noop_async)],
    )
    looped = Workflow(
        name="looped",
        trigger=WorkerTrigger(queue="looped"),
        steps=[for_each("each", "$.body", steps=[Step("inner", noop_async)])],
    )
    return [plain, keyed, flat, looped]


async def jobs_per_second(engine: Engine, queue: str, n: int) -> float:
    started = time.perf_counter()
    jobs = await engine.enqueue_many(queue, [{"k": "same"}] * n)
    for job in jobs:
        await engine.wait_for_job(job, timeout=300)
    return n / (time.perf_counter() - started)


async def steps_per_second(engine: Engine, queue: str, items: int, jobs: int) -> float:
    """Inner steps per second: `items` steps in one for_each run, or `items` plain jobs."""
    started = time.perf_counter()
    if queue == "looped":
        await engine.wait_for_job(await engine.enqueue(queue, list(range(items))), 300)
    else:
        for job in await engine.enqueue_many(queue, [{}] * jobs):
            await engine.wait_for_job(job, timeout=300)
    return items / (time.perf_counter() - started)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--memory", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        database = None if args.memory else Path(folder) / "blok.db"
        async with Engine(workflows=workflows(), database=database) as engine:
            plain = await jobs_per_second(engine, "plain", args.jobs)
            keyed = await jobs_per_second(engine, "keyed", args.jobs)
            flat = await steps_per_second(engine, "flat", args.items, args.items)
            looped = await steps_per_second(engine, "looped", args.items, args.items)
    store = "memory" if args.memory else "sqlite"
    print(f"machine: {platform.machine()} {platform.processor() or ''} cpus={os.cpu_count()}")
    print(f"store: {store}")
    print(f"{'case':<44}{'N':>7}{'per s':>12}{'ratio':>8}")
    print(f"{'jobs, plain (peer)':<44}{args.jobs:>7}{plain:>12.0f}{1.0:>8.2f}")
    print(
        f"{'jobs, concurrency_key gate (limit 8)':<44}{args.jobs:>7}{keyed:>12.0f}{keyed / plain:>8.2f}"
    )
    print(f"{'steps, one job each (peer)':<44}{args.items:>7}{flat:>12.0f}{1.0:>8.2f}")
    print(
        f"{'steps, inside one for_each run':<44}{args.items:>7}{looped:>12.0f}{looped / flat:>8.2f}"
    )


if __name__ == "__main__":
    anyio.run(main)
