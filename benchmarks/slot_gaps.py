"""Where a 10 ms job's cycle goes: the sleep itself, and the gap blok leaves between two jobs.

    python benchmarks/slot_gaps.py                 # memory and SQLite, N = 2000, 3 runs each
    python benchmarks/slot_gaps.py -n 1000 --repeat 1 --providers sqlite
    python benchmarks/slot_gaps.py --providers sqlite,postgres --bulk [--url postgresql://...]

Issue 14 asks 10 ms jobs at concurrency 8 to reach 90 % of the 800 jobs/s ceiling. A slot's
cycle is its job's `anyio.sleep(0.01)` plus what the engine does between the end of one job's
sleep and the start of the next one's in the same slot (settle the job, take the next, start
its run): the gap. Each job notes when its sleep began and ended and in which task (a slot runs
its jobs in one task), so both are measured inside the real runs: submit-all, N jobs enqueued
one call each, then `wait_for_job` each (`contract.py`'s shape, its `sleep10` body timed).

The peer is the event loop alone: 8 tasks that each sleep 10 ms in a loop, the same N sleeps
in all, with nothing between them. asyncio wakes for a timer on whole milliseconds (its `epoll`
wait is rounded up), so its sleeps run long too: that much of the cycle is the loop's, not
blok's. Every measurement runs in a fresh process; the median of `--repeat` by jobs/s.

`--busy-us 50,100` adds the loop alone with that much CPU work a job after each sleep, done in
the slot's task as blok's slot does its settle and its next start, twice: its slots spread over
the 10 ms, and its slots started together. Slots whose timers fall due in one wake of the loop
run one after the other, so a slot's sleep ends late by the work of the slots ahead of it; and
slots that start together stay together, as long as their work fits in the millisecond the
loop rounds its wait up to. The column "other slots waking within 0.5 ms" tells the two apart
(about 0 spread, 7 for 8 slots in step). This shows how much of blok's cycle beyond the loop's
is that wait, for a job that costs blok's CPU.

`--bulk` enqueues the N jobs with one `enqueue_many` instead (the bulk path's row): on
PostgreSQL one enqueue a call is a commit each, which can bound the run before the slots do.
`postgres` runs on a fresh database of the server at `--url`, dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

from fresh import emit, run_fresh  # noqa: E402
from queues import engine_source, machine  # noqa: E402
from scratch_pg import DEFAULT_URL, scratch_database  # noqa: E402

SLOTS = 8
SLEEP_S = 0.01
CEILING = SLOTS / SLEEP_S


def summary(wall: float, n: int, marks: list[tuple[object, float, float]]) -> dict[str, Any]:
    """jobs/s, the sleeps' lengths and the gaps of each slot between two sleeps, ms. A slot is
    known by its task (or the loop-alone task's number); the task itself is the key, not its
    `id`, which a task started after another one ended may get again."""
    sleeps = [(end - begin) * 1e3 for _, begin, end in marks]
    by_slot: dict[object, list[tuple[float, float]]] = {}
    for slot, begin, end in marks:
        by_slot.setdefault(slot, []).append((begin, end))
    gaps = [
        (later[0] - earlier[1]) * 1e3
        for spans in by_slot.values()
        for earlier, later in itertools.pairwise(spans)
    ]
    # How many other slots' sleeps end within half a millisecond of each one (the middle half
    # of the run): about 0 for slots spread over the 10 ms, 7 for 8 slots in step.
    ends = sorted(end for _, _, end in marks)
    middle = ends[len(ends) // 4 : 3 * len(ends) // 4]
    near = [
        bisect.bisect_right(ends, end + 0.0005) - bisect.bisect_left(ends, end - 0.0005) - 1
        for end in middle
    ]
    return {
        "rate": n / wall,
        "in_step": statistics.mean(near) if near else 0.0,
        "slots": len(by_slot),
        "sleep_mean": statistics.mean(sleeps),
        "sleep_p90": statistics.quantiles(sleeps, n=10)[-1],
        "gap_mean": statistics.mean(gaps),
        "gap_p90": statistics.quantiles(gaps, n=10)[-1],
    }


async def loop_alone(n: int, busy_s: float = 0.0, together: bool = False) -> dict[str, Any]:
    marks: list[tuple[object, float, float]] = []
    left = n

    async def slot(number: int) -> None:
        nonlocal left
        # Spread over the 10 ms (each slot takes its first job at its own moment), or all at
        # once (`together`): then the timers fall due together and share one wake of the loop.
        if not together:
            await asyncio.sleep(number * SLEEP_S / SLOTS)
        while left > 0:
            left -= 1
            begin = time.perf_counter()
            await asyncio.sleep(SLEEP_S)
            ended = time.perf_counter()
            marks.append((number, begin, ended))
            while time.perf_counter() - ended < busy_s:
                pass  # the work between two sleeps (--busy-us), in the event loop's thread

    wall = time.perf_counter()
    await asyncio.gather(*(slot(i) for i in range(SLOTS)))
    return summary(time.perf_counter() - wall, n, marks)


async def blok(provider: str, n: int, bulk: bool, database: str | None) -> dict[str, Any]:
    import anyio
    import contract

    from engine import Engine, Step, WorkerTrigger, Workflow

    marks: list[tuple[object, float, float]] = []

    async def sleep10(ctx: Any) -> int:  # contract.py's sleep10, timed
        begin = time.perf_counter()
        await anyio.sleep(SLEEP_S)
        marks.append((asyncio.current_task(), begin, time.perf_counter()))
        return int(ctx.body["i"])

    trigger = WorkerTrigger(queue=contract.QUEUE, concurrency=SLOTS, provider=provider)
    workflow = Workflow(name="bench.sleep10", trigger=trigger, steps=[Step("sleep10", sleep10)])
    with tempfile.TemporaryDirectory() as folder:
        location = Path(folder) / "blok.db" if provider == "sqlite" else database
        async with Engine(workflows=[workflow], database=location) as engine:
            wall = time.perf_counter()
            if bulk:
                ids = await engine.enqueue_many(contract.QUEUE, [{"i": i} for i in range(n)])
                runs = [await engine.wait_for_job(job_id, timeout=600) for job_id in ids]
            else:
                runs = await contract.submit_all(engine, n, SLOTS)
            wall = time.perf_counter() - wall
            await contract.check(engine, runs, n, "sleep10", f"slot gaps {provider}")
    return summary(wall, n, marks)


def one(system: str, n: int, bulk: bool, database: str | None) -> None:
    if system.startswith("asyncio"):
        _, busy_us, together = f"{system}::".split(":")[:3]
        measure = loop_alone(n, float(busy_us or 0) / 1e6, together == "together")
    else:
        measure = blok(system, n, bulk, database)
    emit(asyncio.run(measure))


def label(system: str) -> str:
    if system == "asyncio":
        return "asyncio alone (8 tasks, sleep in a loop)"
    if system.startswith("asyncio:"):
        _, busy_us, together = f"{system}::".split(":")[:3]
        started = ", the slots started together" if together else ""
        return f"asyncio alone, {busy_us} µs of work a job after its sleep{started}"
    return system


def micros_list(text: str) -> list[int]:
    """`--busy-us`: whole µs, comma-separated."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"whole µs, comma-separated (50,100), not {text!r}"
        ) from None
    if any(value < 0 for value in values):
        raise argparse.ArgumentTypeError(f"µs of work cannot be negative: {text!r}")
    return values


def measure(system: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run in a fresh process; on a fresh PostgreSQL database of its own for `postgres`."""
    argv = ["--one", system, "-n", str(args.n), *(["--bulk"] if args.bulk else [])]
    if system != "postgres":
        return run_fresh(__file__, argv)
    with scratch_database(args.url, "blok_slot_gaps") as url:
        return run_fresh(__file__, [*argv, "--database", url])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--providers", default="memory,sqlite")
    parser.add_argument("--bulk", action="store_true", help="one enqueue_many for the N jobs")
    parser.add_argument(
        "--busy-us",
        type=micros_list,
        default=[],
        help="rows of the loop alone with this CPU work a job, in µs: 50,100",
    )
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--database", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.one, args.n, args.bulk, args.database)
        return
    busy = [f"asyncio:{us}{together}" for us in args.busy_us for together in ("", ":together")]
    systems = ["asyncio", *busy, *args.providers.split(",")]
    results: dict[str, list[dict[str, Any]]] = {system: [] for system in systems}
    for _ in range(args.repeat):  # interleaved
        for system in systems:
            results[system].append(measure(system, args))
    median = {
        system: sorted(runs, key=lambda r: r["rate"])[len(runs) // 2]
        for system, runs in results.items()
    }
    print("10 ms jobs at concurrency 8: each slot's cycle, the sleep and the gap between two")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    enqueued = "one enqueue_many" if args.bulk else "one enqueue a job (submit-all)"
    print(f"N = {args.n} ({enqueued}), {SLOTS} slots, median of {args.repeat} run(s) by jobs/s\n")
    print(
        "| system | jobs/s | % of ceiling | sleep ms, mean / p90 | gap ms, mean / p90 "
        "| cycle ms | other slots waking within 0.5 ms | jobs/s vs loop alone |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    alone = median["asyncio"]["rate"]
    for system in systems:
        r = median[system]
        print(
            f"| {label(system)} | {r['rate']:,.0f} | {r['rate'] / CEILING:.0%} "
            f"| {r['sleep_mean']:.2f} / {r['sleep_p90']:.2f} "
            f"| {r['gap_mean']:.2f} / {r['gap_p90']:.2f} "
            f"| {r['sleep_mean'] + r['gap_mean']:.2f} | {r['in_step']:.1f} "
            f"| {r['rate'] / alone:.2f}x |"
        )


if __name__ == "__main__":
    main()
