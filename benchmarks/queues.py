"""Jobs per second through blok's queues, end to end, on both providers.

What one measurement is: an Engine is started with one workflow (one step) on one queue, then
the clock starts; N jobs are enqueued with `enqueue_many` (one transaction on SQLite), and the
clock stops once the queue's stats say all N completed. On SQLite a job's acknowledgement and
its run's final record commit in one transaction, so at that moment every run, step and attempt
record is on disk; after the clock stops the script checks that N runs are `completed` in the
store, each with its step and attempt records.

Job bodies: `noop` (an async node returning None) and `sleep10` (an async node awaiting 10 ms).

    python benchmarks/queues.py                      # both providers, both bodies, N=5000
    python benchmarks/queues.py --provider memory --body noop -n 20000
    python -m pyinstrument benchmarks/queues.py --provider sqlite --body noop
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's engine
from engine import Engine, RunFilter, Step, WorkerTrigger, Workflow

BODIES = ("noop", "sleep10")
PROVIDERS = ("memory", "sqlite")


async def noop(ctx: Any) -> None:
    return None


async def sleep10(ctx: Any) -> None:
    await anyio.sleep(0.01)


NODES: dict[str, Callable[..., Any]] = {"noop": noop, "sleep10": sleep10}


@dataclass
class Result:
    system: str
    provider: str
    body: str
    n: int
    concurrency: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.n / self.seconds


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


def engine_source() -> str:
    """Which engine is measured: its folder and the checkout's commit."""
    import subprocess

    import engine

    folder = Path(engine.__file__).parent
    commit = subprocess.run(
        ["git", "-C", str(folder), "log", "-1", "--format=%h %s"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"{folder} at {commit[:60] or 'unknown commit'}"


async def run_blok(
    provider: str, body: str, n: int, concurrency: int, folder: Path, url: str | None = None
) -> Result:
    """`url`: the PostgreSQL database for the postgres provider (see scratch_pg.py)."""
    workflow = Workflow(
        name=f"bench.{body}",
        trigger=WorkerTrigger(queue="bench", concurrency=concurrency, provider=provider),
        steps=[Step(body, NODES[body])],
    )
    database = url  # PostgreSQL's, or None: in memory
    if provider == "sqlite":
        database = str(folder / f"blok-{provider}-{body}-{time.monotonic_ns()}.db")
    async with Engine(workflows=[workflow], database=database) as engine:
        payloads = [{"i": i} for i in range(n)]
        started = time.perf_counter()
        ids = await engine.enqueue_many("bench", payloads)
        await engine.wait_for_job(ids[-1], timeout=600)
        # The last job enqueued ends among the last C: poll the few ms until all N have.
        while (await engine.queue_stats("bench")).completed < n:  # noqa: ASYNC110
            await anyio.sleep(0.001)
        seconds = time.perf_counter() - started
        done = await engine.count_runs(RunFilter.of(status="completed", queue="bench"))
        if done != n:
            raise SystemExit(f"blok {provider}/{body}: {done} of {n} runs completed")
        sample = await engine.get_run((await engine.get_job(ids[n // 2])).run_id)
        if not (
            sample.steps and sample.steps[0].attempts and sample.steps[0].status == "completed"
        ):
            raise SystemExit(f"blok {provider}/{body}: run {sample.id} lacks its step records")
    return Result("blok", provider, body, n, concurrency, seconds)


def print_table(results: list[Result], n: int, concurrency: int, title: str) -> None:
    print(f"\n{title}")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"N = {n}, concurrency = {concurrency}")
    print(f"{'system':<8} {'provider':<9} {'body':<8} {'seconds':>8} {'jobs/s':>9}")
    for r in results:
        print(f"{r.system:<8} {r.provider:<9} {r.body:<8} {r.seconds:>8.2f} {r.rate:>9,.0f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", choices=[*PROVIDERS, "all"], default="all")
    parser.add_argument("--body", choices=[*BODIES, "all"], default="all")
    parser.add_argument("-n", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    providers = PROVIDERS if args.provider == "all" else (args.provider,)
    bodies = BODIES if args.body == "all" else (args.body,)
    results = []
    with tempfile.TemporaryDirectory(prefix="blok-bench-") as folder:
        for provider in providers:
            for body in bodies:
                results.append(
                    asyncio.run(run_blok(provider, body, args.n, args.concurrency, Path(folder)))
                )
    print_table(results, args.n, args.concurrency, "blok queues: end-to-end jobs/s")


if __name__ == "__main__":
    main()
