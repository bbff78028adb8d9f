"""How long a caller's loop of awaits holds the event loop: the longest gap of a ticking task
while a script waits for N jobs that have ended, this checkout against an earlier commit.

    python benchmarks/held_loop.py --against faa4393                 # memory and SQLite
    python benchmarks/held_loop.py --against HEAD~1 -n 100000 --repeat 1

The script is `contract.py`'s headline shape (N jobs enqueued one call each, then
`wait_for_job` each in order), with a task beside it that ticks every 10 ms. Most jobs have
ended by the time they are awaited, and a wait for an ended job finds it at once: the longest
time between two ticks is how long the waits held the loop, during which no other task of the
process (a worker's slots, its lease renewals, a console) ran. Each measurement runs in a fresh
process that imports one of the two engines, alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fresh import emit, run_fresh  # noqa: E402
from versus import alternate, chosen, import_engine  # noqa: E402

PROVIDERS = ("memory", "sqlite")
TICK_S = 0.01


def one(engine: str, provider: str, n: int) -> None:
    """The child: the waits' longest hold of the loop, with the engine in folder `engine`."""
    import_engine(engine, "benchmarks")
    import contract  # that engine's own

    async def measure(folder: Path) -> dict[str, float]:
        gaps: list[float] = []
        async with contract.open_engine(provider, "echo", 8, folder) as engine:
            ids = [await engine.enqueue(contract.QUEUE, {"i": i}) for i in range(n)]
            last = time.monotonic()

            async def ticker() -> None:
                nonlocal last
                while True:
                    await asyncio.sleep(TICK_S)
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now

            ticking = asyncio.get_running_loop().create_task(ticker())
            started = time.monotonic()
            for job_id in ids:
                await engine.wait_for_job(job_id, timeout=600)
            waited = time.monotonic() - started
            gaps.append(time.monotonic() - last)  # the gap still open when the waits end
            ticking.cancel()
        return {"longest": max(gaps), "waits": waited}

    with tempfile.TemporaryDirectory() as folder:
        emit(asyncio.run(measure(Path(folder))))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="the earlier commit (any git revision)")
    parser.add_argument("--providers", default="memory,sqlite")
    parser.add_argument("-n", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--one", nargs=2, metavar=("ENGINE", "PROVIDER"))
    args = parser.parse_args(argv)
    if args.one:
        engine, provider = args.one
        one(engine, provider, args.n)
        return
    if not args.against:
        parser.error("--against is required: the commit to measure this checkout against")
    providers = chosen(args.providers, PROVIDERS)
    results = alternate(
        args.against,
        args.repeat,
        providers,
        lambda engine, provider: run_fresh(
            __file__, ["--one", engine, provider, "-n", str(args.n)]
        ),
        lambda provider, result: (
            f"{provider:8}: loop held {result['longest'] * 1000:,.0f} ms at most, waits "
            f"{result['waits']:.2f} s"
        ),
        f"the longest hold of the event loop while waiting for N = {args.n:,} jobs: ms",
    )
    print(f"median of {args.repeat}, fresh processes, the two engines alternating")
    print()
    print("| queue | longest hold, ms: before | this | the waits, s: before | this |")
    print("|---|--:|--:|--:|--:|")

    def median(provider: str, label: str, key: str) -> float:
        return statistics.median(r[key] for r in results[(provider, label)])

    for provider in providers:
        print(
            f"| {provider} | {median(provider, 'before', 'longest') * 1000:,.0f} | "
            f"{median(provider, 'this', 'longest') * 1000:,.0f} | "
            f"{median(provider, 'before', 'waits'):.2f} | {median(provider, 'this', 'waits'):.2f} |"
        )


if __name__ == "__main__":
    main()
