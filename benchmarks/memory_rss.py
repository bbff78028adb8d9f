"""Does the memory provider forget finished jobs? RSS over many jobs with a short retention.

    python benchmarks/memory_rss.py                    # 100,000 jobs, a sample every 10,000
    python benchmarks/memory_rss.py -n 20000 --every 2000

An in-memory engine (`database=None`) with `retention="1s"` and `janitor_interval=1.0` runs N
one-step jobs on the contract path (in rounds of 1,000: enqueue one call each, then
`wait_for_job` each). Every `--every` jobs it prints the process's resident set size (VmRSS
from /proc), the runs the engine still lists (`count_runs()`), and the queue's completed
count (`queue_stats`). With finished jobs purged after the retention, RSS should level off
after the first samples (goal: flat) and the runs listed should stay near what ~1 s of jobs
makes, not grow with N.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

import contract  # noqa: E402
from queues import engine_source, machine  # noqa: E402

from engine import Engine  # noqa: E402

ROUND = 1000


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("no VmRSS in /proc/self/status (Linux only)")


async def run(args: argparse.Namespace) -> None:
    print("\nmemory provider: RSS over jobs, retention 1 s")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"N = {args.n}, rounds of {ROUND} (enqueue each, then wait_for_job each)")
    print("|    jobs | seconds | RSS MB | runs listed | stats completed |")
    print("|---------|---------|--------|-------------|-----------------|")
    async with Engine(
        workflows=[contract.workflow("echo", 8, "memory")],
        database=None,
        retention="1s",
        janitor_interval=1.0,
    ) as engine:
        started = time.perf_counter()
        first_rss = rss_mb()
        print(f"| {0:>7,} | {0:>7.1f} | {first_rss:>6.0f} | {0:>11,} | {0:>15,} |")
        done = 0
        while done < args.n:
            ids = [await engine.enqueue(contract.QUEUE, {"i": done + i}) for i in range(ROUND)]
            for job_id in ids:
                await engine.wait_for_job(job_id, timeout=60)
            done += ROUND
            if done % args.every == 0:
                listed = await engine.count_runs()
                completed = (await engine.queue_stats(contract.QUEUE)).completed
                print(
                    f"| {done:>7,} | {time.perf_counter() - started:>7.1f} | {rss_mb():>6.0f} "
                    f"| {listed:>11,} | {completed:>15,} |",
                    flush=True,
                )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=10_000)
    args = parser.parse_args(argv)
    if args.every % ROUND or args.n % ROUND:
        raise SystemExit(f"-n and --every must be multiples of {ROUND}")
    anyio.run(run, args)


if __name__ == "__main__":
    main()
