"""Jobs while the janitor purges a large history on SQLite.

    python benchmarks/purge_stall.py --runs 20000

A worker's own jobs wait for the database while the janitor deletes: on SQLite there is one
writer. The history: N runs of a three-step workflow that logs a line a step, and their jobs,
all finished, older than the retention. The probe: one job at a time (enqueue, then
`wait_for_job`), the path a user takes, for as long as `Engine.purge()` runs; each job's time
is a sample. Three rows, each on its own copy of the same database, in one invocation:

- no purge: the probe alone, for as many jobs as the chunked purge's probe ran;
- chunked: the janitor as shipped (PURGE_CHUNK runs, JOBS_PURGE_CHUNK jobs a transaction,
  resting PURGE_REST times as long as each chunk took);
- one go: the janitor of before (the chunks of runs back to back, the finished jobs in one
  DELETE).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

from queues import engine_source, machine  # noqa: E402

from engine import Engine, Step, WorkerTrigger, Workflow, chores  # noqa: E402


def logs(ctx: Any) -> dict[str, int]:
    ctx.logger.info("a line, as a step of an ordinary workflow writes")
    return {"n": 1}


HISTORY = Workflow(
    name="history",
    trigger=WorkerTrigger(queue="history", concurrency=8),
    steps=[Step("one", logs), Step("two", logs), Step("three", logs)],
)


async def probe_node(ctx: Any) -> int:
    return 1


PROBE = Workflow(
    name="probe", trigger=WorkerTrigger(queue="probe"), steps=[Step("one", probe_node)]
)


async def make_history(path: Path, runs: int) -> None:
    async with Engine(workflows=[HISTORY], database=path) as engine:
        for start in range(0, runs, 1000):
            ids = await engine.enqueue_many(
                "history", [{"i": i} for i in range(start, start + 1000)]
            )
            for job_id in ids:
                await engine.wait_for_job(job_id, timeout=120)


async def one_job(engine: Engine) -> int:
    started = time.perf_counter_ns()
    await engine.wait_for_job(await engine.enqueue("probe", {}), timeout=120)
    return time.perf_counter_ns() - started


async def measure(path: Path, purge: bool, jobs: int) -> tuple[float, int, list[int]]:
    """(seconds the purge took, runs purged, each probe job's ns)."""
    samples: list[int] = []
    async with Engine(
        workflows=[HISTORY, PROBE], database=path, retention="1s", janitor_interval=3600
    ) as engine:
        for _ in range(20):  # warm: the engine's first jobs are not the purge's doing
            await one_job(engine)
        if not purge:
            samples = [await one_job(engine) for _ in range(jobs)]
            return 0.0, 0, samples
        done = anyio.Event()

        async def probe() -> None:
            while not done.is_set():
                samples.append(await one_job(engine))

        async with anyio.create_task_group() as tg:
            tg.start_soon(probe)
            started = time.perf_counter()
            purged = await engine.purge()
            took = time.perf_counter() - started
            done.set()
    return took, purged, samples


def ms(samples: list[int], q: float) -> str:
    ordered = sorted(samples)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6:,.1f}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20_000)
    args = parser.parse_args()
    print("jobs while the janitor purges a large history (SQLite)")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"N = {args.runs:,} old runs of 3 steps (a log line a step) and their jobs")
    with tempfile.TemporaryDirectory() as folder:
        origin = Path(folder) / "history.db"
        began = time.perf_counter()
        await make_history(origin, args.runs)
        print(f"(history made in {time.perf_counter() - began:.1f} s)")
        await anyio.sleep(1.1)  # older than the retention of 1 s
        shipped = (chores.PURGE_REST, chores.JOBS_PURGE_CHUNK)
        rows = []
        for name, rest, jobs_chunk in (
            ("chunked", shipped[0], shipped[1]),
            ("one go", 0.0, 10**9),
        ):
            copy = Path(folder) / f"{name.replace(' ', '-')}.db"
            shutil.copy(origin, copy)
            chores.PURGE_REST, chores.JOBS_PURGE_CHUNK = rest, jobs_chunk
            try:
                rows.append((name, *await measure(copy, True, 0)))
            finally:
                chores.PURGE_REST, chores.JOBS_PURGE_CHUNK = shipped
        copy = Path(folder) / "none.db"
        shutil.copy(origin, copy)
        rows.insert(0, ("no purge", *await measure(copy, False, len(rows[0][3]))))
    print()
    print("| janitor | purge s | runs purged | probe jobs | p50 ms | p99 ms | max ms |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for name, took, purged, samples in rows:
        print(
            f"| {name} | {took:.2f} | {purged:,} | {len(samples):,} | {ms(samples, 0.5)} |"
            f" {ms(samples, 0.99)} | {max(samples) / 1e6:,.1f} |"
        )
    chunked, one_go = rows[1][3], rows[2][3]
    print()
    print(f"worst probe job, one go / chunked: {max(one_go) / max(chunked):.1f}x")


if __name__ == "__main__":
    anyio.run(main)
