"""One job now and then, the worker in another process: how long from `enqueue` to its result
when both sides were idle before it.

    python benchmarks/hand_off.py                          # SQLite and PostgreSQL, 40 jobs
    python benchmarks/hand_off.py --providers sqlite -n 60 --gap 0.5

A web app that sends a job now and then and awaits its result: each job is enqueued after `--gap`
seconds in which nothing happened, so the worker waits for work and the producer for nothing
when it comes. The workers are split.py's, each as it ships: blok's `blok-tui worker` serving
the one-step `echo` workflow at concurrency 8, and here an `Engine(database=...)` that
`enqueue`s and `wait_for_job`s; huey's `huey_consumer -k thread -w 8`, and here the task's call
and `result.get(blocking=True)`. A fresh database and worker for each system, the systems one
after the other; the table gives each one's latency, median and 95th percentile, and blok/huey
of the medians (below 1: blok answers sooner).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

import anyio  # noqa: E402
import contract  # noqa: E402
import split  # noqa: E402
from queues import engine_source, machine  # noqa: E402
from scratch_pg import DEFAULT_URL  # noqa: E402


def blok_latencies(database: str, folder: Path, n: int, gap: float) -> list[float]:
    with split.blok_worker(database, folder):
        return anyio.run(_blok_producer, database, n, gap)


async def _blok_producer(database: str, n: int, gap: float) -> list[float]:
    from engine import Engine

    latencies = []
    async with Engine(database=database, create=False) as engine:
        await engine.wait_for_job(await engine.enqueue(contract.QUEUE, {"i": -1}), timeout=60)
        for i in range(n):
            await anyio.sleep(gap)
            started = time.perf_counter()
            job_id = await engine.enqueue(contract.QUEUE, {"i": i})
            run = await engine.wait_for_job(job_id, timeout=60)
            latencies.append(time.perf_counter() - started)
            if run.output != i:
                raise SystemExit(f"blok: job {i} gave {run.output!r}")
    return latencies


def huey_latencies(database: str, folder: Path, n: int, gap: float) -> list[float]:
    (folder / "hueybench.py").write_text(split.HUEY_MODULE)
    env = split.environment(path=str(folder), SPLIT_HUEY_DATABASE=database)
    command = [sys.executable, "-m", "huey.bin.huey_consumer", "hueybench.huey"]
    command += ["-k", "thread", "-w", str(split.CONCURRENCY)]
    os.environ["SPLIT_HUEY_DATABASE"] = database
    sys.path.insert(0, str(folder))
    latencies = []
    try:
        sys.modules.pop("hueybench", None)
        import hueybench  # the producer's side of the same huey

        with split.process(command, env, folder, "consumer started"):
            echo: Callable[[int], Any] = hueybench.echo
            echo(-1).get(blocking=True, timeout=60)
            for i in range(n):
                time.sleep(gap)
                started = time.perf_counter()
                value = echo(i).get(blocking=True, timeout=60)
                latencies.append(time.perf_counter() - started)
                if value != i:
                    raise SystemExit(f"huey: job {i} gave {value!r}")
    finally:
        sys.path.remove(str(folder))
    return latencies


SYSTEMS: dict[str, Callable[[str, Path, int, float], list[float]]] = {
    "blok": blok_latencies,
    "huey": huey_latencies,
}


def measure(system: str, provider: str, n: int, gap: float, url: str) -> list[float]:
    return split.in_scratch(
        system, provider, url, lambda database, folder: SYSTEMS[system](database, folder, n, gap)
    )


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--providers", default="sqlite,postgres")
    parser.add_argument("-n", type=int, default=40)
    parser.add_argument("--gap", type=float, default=0.2, help="seconds of quiet before a job")
    parser.add_argument("--url", default=DEFAULT_URL, help="the PostgreSQL server (postgres)")
    args = parser.parse_args()
    rows = []
    for provider in args.providers.split(","):
        found = {}
        for system in SYSTEMS:
            found[system] = sorted(measure(system, provider, args.n, args.gap, args.url))
            p50 = statistics.median(found[system])
            print(f"  {system:5} {provider}: median {ms(p50)} ms", flush=True)
        rows.append((provider, found))
    print()
    print("one job now and then, the worker in another process: ms from enqueue to its result")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"N = {args.n} jobs each, {args.gap} s of quiet before each")
    print()
    print("| queue | blok median | blok p95 | huey median | huey p95 | blok/huey (medians) |")
    print("|---|--:|--:|--:|--:|--:|")
    for provider, found in rows:
        blok, huey = found["blok"], found["huey"]
        p95 = [ordered[math.ceil(0.95 * len(ordered)) - 1] for ordered in (blok, huey)]
        b50, h50 = statistics.median(blok), statistics.median(huey)
        print(
            f"| {provider} | {ms(b50)} | {ms(p95[0])} | {ms(h50)} | {ms(p95[1])} | "
            f"{b50 / h50:.2f}x |"
        )


if __name__ == "__main__":
    main()
