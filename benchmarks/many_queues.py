"""The contract path on an engine that serves many queues: does a job cost more when the
engine serves more workflows?

    python benchmarks/many_queues.py                  # W = 1, 10, 50, 200; N = 2000, median of 3
    python benchmarks/many_queues.py --ws 1,50 -n 5000

Each W runs in a fresh process: an in-memory engine serving `contract.py`'s `echo` workflow on
the measured queue and W - 1 other one-step workflows, each on a queue of its own (idle, with a
worker slot waiting). The headline shape (submit-all: N jobs enqueued one call each, then each
awaited) runs twice: timed (jobs/s), then with a profile hook counting the Python calls
(`calls.py`'s counter; calls a job). The ratio is to W = 1, measured in the same
invocation. The idle queues' claim loops wake now and then while the jobs run (their claims
time out): that is part of what serving them costs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

import contract  # noqa: E402
from calls import CallCounter  # noqa: E402
from fresh import emit, run_fresh  # noqa: E402
from queues import engine_source, machine  # noqa: E402

from engine import Engine, Step, WorkerTrigger, Workflow  # noqa: E402

CONCURRENCY = 8


def workflows(w: int) -> list[Workflow]:
    others = [
        Workflow(
            name=f"other{k}",
            steps=[Step("echo", contract.echo)],
            trigger=WorkerTrigger(queue=f"other{k}", concurrency=1, provider="memory"),
        )
        for k in range(w - 1)
    ]
    return [contract.workflow("echo", CONCURRENCY, "memory"), *others]


async def measure(w: int, n: int) -> dict[str, float]:
    async with Engine(workflows=workflows(w)) as engine:
        started = time.perf_counter()
        runs = await contract.submit_all(engine, n, CONCURRENCY)
        seconds = time.perf_counter() - started
        await contract.check(engine, runs, n, "echo", f"many queues W={w}")
        calls = CallCounter()
        calls.install()
        try:
            calls.on = True
            runs = await contract.submit_all(engine, n, CONCURRENCY)
        finally:
            calls.on = False
            calls.remove()
        await contract.check(engine, runs, n, "echo", f"many queues W={w}, counted")
    return {"jobs_s": n / seconds, "calls": calls.python / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--ws", default="1,10,50,200")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        emit(asyncio.run(measure(args.one, args.n)))
        return
    ws = [int(w) for w in args.ws.split(",")]
    found: dict[int, list[dict[str, float]]] = {w: [] for w in ws}
    for _ in range(args.repeat):  # the W interleaved within each repetition
        for w in ws:
            result = run_fresh(__file__, ["--one", str(w), "-n", str(args.n)])
            found[w].append(result)
            print(
                f"  W={w:4d}: {result['jobs_s']:8,.0f} jobs/s, {result['calls']:6.0f} calls a job"
            )

    print()
    print("contract path (submit-all, echo, memory) on an engine serving W workflows")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"N = {args.n}, concurrency {CONCURRENCY}, median of {args.repeat} fresh processes")
    print()
    print("| W | jobs/s | vs W = 1 | Python calls a job | vs W = 1 | range (jobs/s) |")
    print("|--:|--:|--:|--:|--:|---|")
    base: tuple[float, float] | None = None
    for w in ws:
        rates = [r["jobs_s"] for r in found[w]]
        rate = statistics.median(rates)
        calls = statistics.median(r["calls"] for r in found[w])
        if base is None:
            base = (rate, calls)
        print(
            f"| {w} | {rate:,.0f} | {rate / base[0]:.2f}x | {calls:,.0f} | {calls / base[1]:.2f}x "
            f"| {min(rates):,.0f}–{max(rates):,.0f} |"
        )


if __name__ == "__main__":
    main()
