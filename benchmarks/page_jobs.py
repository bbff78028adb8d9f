"""What reading the jobs of a page of runs costs: one `get_jobs` against one `get_job` a job.

    python benchmarks/page_jobs.py                          # memory, SQLite, PostgreSQL
    python benchmarks/page_jobs.py --providers sqlite --sizes 20,100 --reads 300

The console's runs view needs the job of every failed run on its page (did the job go on?) and
of every running run (is its worker gone?). It read them one `get_job` a job, sixteen at a
time; it reads them with one `get_jobs` now. For each provider an engine runs the largest page
size's jobs to completion (not timed); then each way is timed alone, `--reads` times per page
size, the two ways alternating: `get_jobs(ids)`, and `get_job` for each id under a limit of 16
concurrent reads, as the console did. The ratio is per-job reads over one read (above 1: one
read is faster).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

import contract  # noqa: E402
from enqueue_latency import Row  # noqa: E402
from queues import engine_source, machine  # noqa: E402
from scratch_pg import DEFAULT_URL, scratch_database  # noqa: E402

from engine import Engine  # noqa: E402

READERS = 16  # the console's limit on concurrent get_job calls, before get_jobs


async def per_job(engine: Engine, ids: list[str]) -> None:
    limiter = anyio.CapacityLimiter(READERS)

    async def one(job_id: str) -> None:
        async with limiter:
            await engine.get_job(job_id)

    async with anyio.create_task_group() as group:
        for job_id in ids:
            group.start_soon(one, job_id)


async def at_once(engine: Engine, ids: list[str]) -> None:
    found = await engine.get_jobs(ids)
    assert len(found) == len(ids)


async def timed(
    way: Callable[[Engine, list[str]], Awaitable[None]],
    engine: Engine,
    ids: list[str],
    into: list[int],
) -> None:
    started = time.perf_counter_ns()
    await way(engine, ids)
    into.append(time.perf_counter_ns() - started)


async def provider_rows(
    provider: str, folder: Path, sizes: list[int], reads: int, database: str | None
) -> list[tuple[str, int, Row, Row]]:
    rows = []
    async with contract.open_engine(provider, "echo", 8, folder, database) as engine:
        ids = [await engine.enqueue(contract.QUEUE, {"i": i}) for i in range(max(sizes))]
        for job_id in ids:
            await engine.wait_for_job(job_id, timeout=60)
        for size in sizes:
            page = ids[:size]
            singles: list[int] = []
            batches: list[int] = []
            for _ in range(reads):
                await timed(per_job, engine, page, singles)
                await timed(at_once, engine, page, batches)
            rows.append((provider, size, Row("get_job a job", singles), Row("get_jobs", batches)))
    return rows


async def run(
    providers: list[str], sizes: list[int], reads: int, url: str
) -> list[tuple[str, int, Row, Row]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="blok-page-jobs-") as name:
        for provider in providers:
            if provider == "postgres":
                with scratch_database(url, "blok_page_jobs") as database:
                    rows += await provider_rows(provider, Path(name), sizes, reads, database)
            else:
                rows += await provider_rows(provider, Path(name), sizes, reads, None)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--providers", default="memory,sqlite,postgres")
    parser.add_argument("--sizes", default="20,100", help="jobs on a page")
    parser.add_argument("--reads", type=int, default=300, help="timed reads per way and size")
    parser.add_argument("--postgres-url", default=DEFAULT_URL)
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    rows = anyio.run(run, args.providers.split(","), sizes, args.reads, args.postgres_url)
    print("\nThe jobs of a page of runs: one read against one read a job, µs a page")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"each way {args.reads} times per page size, alternating")
    head = (
        "| queue    | jobs on the page | get_job a job p50 | get_jobs p50 "
        "| get_job a job p95 | get_jobs p95 | ratio (p50) |"
    )
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
    for provider, size, singles, batch in rows:
        one, many = singles.stats, batch.stats
        print(
            f"| {provider:<8} | {size:>16} | {one['p50']:>17.0f} | {many['p50']:>12.0f} "
            f"| {one['p95']:>17.0f} | {many['p95']:>12.0f} | {one['p50'] / many['p50']:>10.1f}x |"
        )


if __name__ == "__main__":
    main()
