"""What flow control costs: jobs per second with a concurrency-key gate, and inner steps per
second in for_each, each against a plain peer run in the same process on the same store.

The contended pair: `--keys` keys at a limit of 1 each, `--per-key` jobs of each enqueued at
once (one `enqueue` a call) and awaited, every job a 10 ms sleep, against the same jobs on a
queue of concurrency `--keys` with no key (its ceiling: each key's jobs one after another at
best). Held jobs go as a slot of their key frees; before that, each waited out its own backoff
(1 s, 2 s, 4 s … 30 s).

Usage: python benchmarks/flow_control.py [--jobs 2000] [--items 2000] [--keys 4] [--per-key 25]
       [--memory]
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


def workflows(keys: int) -> list[Workflow]:
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
    return [plain, keyed, flat, looped, *contended(keys)]


def contended(keys: int) -> list[Workflow]:
    """`--keys` slots of a queue with no key, and a queue whose key allows 1 run each."""
    lane = Workflow(
        name="lanes",
        trigger=WorkerTrigger(queue="lanes", concurrency=keys),
        steps=[Step("work", sleep_10ms)],
    )
    held = Workflow(
        name="held",
        trigger=WorkerTrigger(
            queue="held",
            concurrency=keys * 2,
            concurrency_key="$.body.k",
            concurrency_limit=1,
            on_limit="queue",
        ),
        steps=[Step("work", sleep_10ms)],
    )
    return [lane, held]


async def sleep_10ms(ctx: Any) -> None:
    await anyio.sleep(0.01)


async def contended_seconds(engine: Engine, queue: str, keys: int, per_key: int) -> float:
    """Wall time for `per_key` jobs of each of `keys` keys, enqueued one a call, awaited."""
    started = time.perf_counter()
    jobs = [await engine.enqueue(queue, {"k": n % keys}) for n in range(keys * per_key)]
    for job in jobs:
        await engine.wait_for_job(job, timeout=600)
    return time.perf_counter() - started


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
    parser.add_argument("--keys", type=int, default=4)
    parser.add_argument("--per-key", type=int, default=25)
    parser.add_argument("--memory", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        database = None if args.memory else Path(folder) / "blok.db"
        async with Engine(workflows=workflows(args.keys), database=database) as engine:
            plain = await jobs_per_second(engine, "plain", args.jobs)
            keyed = await jobs_per_second(engine, "keyed", args.jobs)
            flat = await steps_per_second(engine, "flat", args.items, args.items)
            looped = await steps_per_second(engine, "looped", args.items, args.items)
            lanes = await contended_seconds(engine, "lanes", args.keys, args.per_key)
            held = await contended_seconds(engine, "held", args.keys, args.per_key)
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
    n = args.keys * args.per_key
    print(
        f"{f'{args.keys} lanes, no key, 10 ms jobs (peer)':<44}{n:>7}{n / lanes:>12.0f}{1.0:>8.2f}"
    )
    print(
        f"{f'{args.keys} keys at limit 1, 10 ms jobs':<44}{n:>7}{n / held:>12.0f}"
        f"{lanes / held:>8.2f}"
    )
    print(
        f"(wall time: lanes {lanes:.2f} s, keys {held:.2f} s; no wait at all: {args.per_key / 100:.2f} s)"
    )


if __name__ == "__main__":
    anyio.run(main)
