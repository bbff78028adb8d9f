"""Function calls a job on the contract path: blok against huey, counted, not timed.

    python benchmarks/calls.py                    # memory and SQLite, N = 1000
    python benchmarks/calls.py --providers memory -n 2000
    python benchmarks/calls.py --providers memory --shapes submit-all,producers,sequential

This machine's CPU runs faster or slower by the hour (±40 % on the same code, see the passes
in README.md), and a ratio of two timings moves with it. A count does not: each system runs
`contract.py`'s headline shape (submit-all: N jobs enqueued one call each, then each awaited;
the one-step `echo` workflow or task, concurrency 8; `--shapes` adds `contract.py`'s other
shapes) in a fresh process, with a profile hook
in every thread (`sys.setprofile`, `threading.setprofile`) that counts the calls made while
the jobs go through: Python functions, and functions built in or written in C (a dict's `get`,
a lock, SQLite's `execute`). The engine or the consumer is started before the count and stopped
after it. A coroutine counts a call each time it is resumed, as profilers see it. For blok it
also counts the turns of the event loop (`_run_once`) while the jobs go through: a turn that
runs one handle costs about what a turn that runs eight does, so fewer turns a job is less
time a job even where the calls are the same.

`--ladder` adds `floor.py`'s levels on the memory queue (`bare`, `records`, `queue`, `runner`:
blok's parts added one at a time to an engine that does nothing else), counted over their whole
run (their few hundred calls of setting up included): where blok's calls go, layer by layer.

The hook slows everything down several times, so the counts of what polls (huey's
`result.get(blocking=True)` waits by polling, with backoff; its consumer's threads poll the
queue) may run a little high. blok waits on events: what it counts is its own work.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

import contract  # noqa: E402
import floor  # noqa: E402
import huey_peer  # noqa: E402
from fresh import emit, run_fresh  # noqa: E402
from queues import engine_source, machine  # noqa: E402

SYSTEMS = ("blok", "huey")
LADDER = ("bare", "records", "queue", "runner")  # floor.py's levels, memory only
CONCURRENCY = 8


class CallCounter:
    """Counts calls in every thread while `on`; installed before the system starts so that
    the threads it starts (huey's workers, blok's SQLite threads) count too."""

    def __init__(self) -> None:
        self.on = False
        self.python = 0
        self.native = 0
        self.turns = 0  # of the event loop (blok)
        self._lock = threading.Lock()

    def count_turns(self) -> None:
        """Count the turns of every asyncio event loop of this process while `on`."""
        run_once = asyncio.base_events.BaseEventLoop._run_once  # type: ignore[attr-defined]

        def counted(loop: asyncio.AbstractEventLoop) -> None:
            if self.on:
                self.turns += 1
            run_once(loop)

        asyncio.base_events.BaseEventLoop._run_once = counted  # type: ignore[attr-defined]

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on:
            return
        if event == "call":
            with self._lock:
                self.python += 1
        elif event == "c_call":
            with self._lock:
                self.native += 1

    def install(self) -> None:
        threading.setprofile(self)
        sys.setprofile(self)

    def remove(self) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def count_blok(provider: str, shape: str, n: int, counter: CallCounter) -> None:
    drive = contract.DRIVERS[shape]
    counter.count_turns()

    async def main() -> None:
        with tempfile.TemporaryDirectory() as folder:
            async with contract.open_engine(provider, "echo", CONCURRENCY, Path(folder)) as engine:
                counter.on = True
                runs = await drive(engine, n, CONCURRENCY)
                counter.on = False
                await contract.check(engine, runs, n, "echo", f"calls {provider} {shape}")

    asyncio.run(main())


def count_huey(provider: str, shape: str, n: int, counter: CallCounter) -> None:
    # huey_peer.run_contract, with the count around its timed part only.
    with tempfile.TemporaryDirectory() as folder:
        huey = huey_peer.make_huey(provider, Path(folder), tuned=False)
        task = huey_peer.define_task(huey, "echo")
        consumer = huey_peer.start_consumer(huey, CONCURRENCY, tuned=False)
        try:
            counter.on = True
            values = huey_peer.drive(task, shape, n, CONCURRENCY)
            counter.on = False
        finally:
            counter.on = False
            consumer.stop(graceful=True)
    if sorted(values) != list(range(n)):
        raise SystemExit(f"huey {provider} {shape}: {len(values)} of {n} results")


def count_level(level: str, n: int, counter: CallCounter) -> None:
    runs = {
        "bare": lambda: floor.bare(n, with_records=False),
        "records": lambda: floor.bare(n, with_records=True),
        "queue": lambda: floor.on_blok_queue(n, with_runner=False),
        "runner": lambda: floor.on_blok_queue(n, with_runner=True),
    }[level]

    async def counted() -> list[Any]:
        counter.on = True
        try:
            return await runs()
        finally:
            counter.on = False

    floor.check(level, asyncio.run(counted()), n)


def one(system: str, provider: str, shape: str, n: int) -> dict[str, float]:
    counter = CallCounter()
    run: Callable[[str, str, int, CallCounter], None]
    if system in LADDER:
        run = lambda _provider, _shape, n, counter: count_level(system, n, counter)  # noqa: E731
    else:
        run = count_blok if system == "blok" else count_huey
    counter.install()
    try:
        run(provider, shape, n, counter)
    finally:
        counter.remove()
    return {"python": counter.python / n, "native": counter.native / n, "turns": counter.turns / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=1000)
    parser.add_argument("--providers", default="memory,sqlite")
    parser.add_argument("--shapes", default="submit-all", help=", ".join(contract.SHAPES))
    parser.add_argument("--ladder", action="store_true", help="floor.py's levels too")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # system provider shape
    args = parser.parse_args()
    if args.one:
        emit(one(args.one[0], args.one[1], args.one[2], args.n))
        return
    shapes = args.shapes.split(",")
    unknown = [shape for shape in shapes if shape not in contract.SHAPES]
    if unknown:
        parser.error(f"--shapes: no shape {unknown[0]!r}; one of {', '.join(contract.SHAPES)}")
    rows = []
    for provider in args.providers.split(","):
        for shape in shapes:
            counts = {
                system: run_fresh(__file__, ["--one", system, provider, shape, "-n", str(args.n)])
                for system in SYSTEMS
            }
            for system, found in counts.items():
                print(
                    f"  {system:5s} {provider:7s} {shape:11s} {found['python']:8.0f} Python "
                    "calls a job",
                    flush=True,
                )
            rows.append((provider, shape, counts["blok"], counts["huey"]))
    ladder = {}
    if args.ladder:
        for level in LADDER:
            child = ["--one", level, "memory", "submit-all", "-n", str(args.n)]
            ladder[level] = run_fresh(__file__, child)
            print(f"  {level:7s} memory  {ladder[level]['python']:8.0f} Python calls a job")

    print()
    print("function calls a job, contract path (echo, concurrency 8)")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"N = {args.n}, one fresh process each; huey as shipped")
    print()
    print(
        "| queue | shape | blok Python | huey Python | blok/huey | blok C | huey C | blok/huey "
        "| blok loop turns |"
    )
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|")
    for provider, shape, blok, huey in rows:
        print(
            f"| {provider} | {shape} | {blok['python']:,.0f} | {huey['python']:,.0f} "
            f"| {blok['python'] / huey['python']:.2f}x | {blok['native']:,.0f} "
            f"| {huey['native']:,.0f} | {blok['native'] / huey['native']:.2f}x "
            f"| {blok['turns']:.2f} |"
        )
    if ladder:
        memory = {p: blok for p, shape, blok, _ in rows if shape == "submit-all"}.get("memory")
        if memory is not None:
            ladder["blok"] = memory
        print()
        print("floor.py's levels on the memory queue (calls a job; added: over the level before)")
        print()
        print("| level | Python | added | C | added |")
        print("|---|--:|--:|--:|--:|")
        before: dict[str, float] | None = None
        for level, found in ladder.items():
            python_added = "" if before is None else f"+{found['python'] - before['python']:,.0f}"
            native_added = "" if before is None else f"+{found['native'] - before['native']:,.0f}"
            print(
                f"| {level} | {found['python']:,.0f} | {python_added} "
                f"| {found['native']:,.0f} | {native_added} |"
            )
            before = found


if __name__ == "__main__":
    main()
