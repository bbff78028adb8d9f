"""Where a memory job's time goes: blok's parts added one at a time to an engine that does
nothing else, against blok itself and MemoryHuey, on the contract path's headline shape.

    python benchmarks/floor.py                   # N = 5000, median of 3
    python benchmarks/floor.py -n 2000 --repeat 5

Every level runs `submit-all` (N jobs enqueued one call each, each call a turn of the event
loop, then each awaited in order) with 8 worker tasks and the one-step `echo` workflow of
`contract.py`, in its own fresh process, the levels interleaved within each repetition:

- `bare`: an `asyncio.Queue`, 8 worker tasks, a future a job that the waiter awaits; the
  worker calls the step function and resolves the future. No record at all.
- `records`: the same, building the records blok keeps for a job with the engine's own
  builders (`make_job`, `make_run`, `pending_step`, an `Attempt`) and setting their fields as
  the runner does (the run, its step and its attempt: running, then completed with the output).
- `queue`: the jobs go through blok's `MemoryQueue` instead (its `add`, `claim` and
  `claim_nowait`, and the settle as a fenced `Transition` through `submit`), with the records
  of `records`.
- `runner`: blok's `Runner.run` runs the step (its records, its checks of the step's input and
  output, its context) instead of the hand-made step and attempt records.
- `blok`: the engine itself: `Engine.enqueue` and `Engine.wait_for_job`.
- `MemoryHuey`: huey as shipped, as `peer.py` runs it (`huey_peer.py`).

Each run also times the cyclic garbage collector (`gc.callbacks`): its µs a job are part of the
level's, and grow with what the level keeps alive (every level keeps its records to the end).
For `blok` and `MemoryHuey` they also hold what starting and stopping the engine or the
consumer collected (a few ms at most, against a run of a second or more).

`--collector-off` runs every level a second time with the collector disabled (`gc.disable()`)
and adds what that saves a job: the collector's whole cost, including the slower allocations
its passes leave behind (its `gc.callbacks` time is the passes alone).

The difference between two levels is what the added part costs a job; between `runner` and
`blok`, the engine's machinery around a job (the operator and its checks, the ledger, the
worker's slot, claim and settle, the run's handle and cancel scope, the hooks, the waiters).
Each level checks its results after the clock stops.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

import contract  # noqa: E402
import huey_peer  # noqa: E402
from fresh import emit, run_fresh  # noqa: E402
from queues import engine_source, machine  # noqa: E402

from engine.backends.base import JobUpdate, Transition  # noqa: E402
from engine.backends.memory import MemoryQueue  # noqa: E402
from engine.context import Context  # noqa: E402
from engine.events import EventBus  # noqa: E402
from engine.ledger import make_job, make_run  # noqa: E402
from engine.models import (  # noqa: E402
    AttemptStatus,
    Job,
    JobState,
    Run,
    RunStatus,
    StepStatus,
)
from engine.records import assign  # noqa: E402
from engine.runner import Runner, pending_step, running_attempt  # noqa: E402

LEVELS = ("bare", "records", "queue", "runner", "blok", "MemoryHuey")
CONCURRENCY = 8
LEASE_S = 30.0


def new_job(i: int) -> tuple[Job, Run]:
    job = make_job(
        queue=contract.QUEUE,
        workflow_name="bench.echo",
        payload={"i": i},
        headers=None,
        priority=0,
        run_at=None,
        max_retries=0,
    )
    return job, make_run(job, workflow_version="v1")


def hand_made_step(run: Run, output: Any) -> None:
    """The run's step and attempt records, as the runner sets them for a one-step run."""
    assign(run, status=RunStatus.RUNNING, started_at=datetime.now(UTC))
    step = pending_step(0, "echo", "step")
    attempt = running_attempt(1, datetime.now(UTC))
    step.attempts.append(attempt)
    assign(step, status=StepStatus.RUNNING, started_at=attempt.started_at, max_attempts=1)
    run.steps.append(step)
    run.attempts += 1
    now = datetime.now(UTC)
    assign(attempt, status=AttemptStatus.COMPLETED, finished_at=now)
    assign(step, status=StepStatus.COMPLETED, output=output, finished_at=now)


def finished(run: Run, output: Any) -> None:
    assign(run, status=RunStatus.COMPLETED, output=output, finished_at=datetime.now(UTC))


class Body:
    """What `ctx.body` gives the step function outside blok."""

    def __init__(self, payload: Any) -> None:
        self.body = payload


async def bare(n: int, with_records: bool) -> list[Any]:
    loop = asyncio.get_running_loop()
    jobs: asyncio.Queue[tuple[Job | dict[str, Any], Run | None]] = asyncio.Queue()
    done: dict[int, asyncio.Future[Any]] = {}

    async def worker() -> None:
        try:
            await work()
        except Exception as error:
            failing(done, error)
            raise

    async def work() -> None:
        while True:
            job, run = await jobs.get()
            if run is None:
                assert isinstance(job, dict)
                done[job["i"]].set_result(await contract.echo(Body(job)))
                continue
            assert isinstance(job, Job)
            output = await contract.echo(Body(job.payload))
            hand_made_step(run, output)
            finished(run, output)
            done[job.payload["i"]].set_result(run)

    workers = [asyncio.create_task(worker()) for _ in range(CONCURRENCY)]

    async def enqueue(i: int) -> int:
        done[i] = loop.create_future()
        jobs.put_nowait(new_job(i) if with_records else ({"i": i}, None))
        await asyncio.sleep(0)  # a turn of the loop, as every enqueue of blok is
        return i

    ids = [await enqueue(i) for i in range(n)]
    results = [await done[i] for i in ids]
    for task in workers:
        task.cancel()
    return results


async def on_blok_queue(n: int, with_runner: bool) -> list[Any]:
    loop = asyncio.get_running_loop()
    queue = MemoryQueue()
    done: dict[str, asyncio.Future[Run]] = {}
    workflow = contract.workflow("echo", CONCURRENCY, "memory")
    runner = Runner(services=None, bus=EventBus())  # type: ignore[arg-type]  # a plain step needs none

    async def run_one(job: Job, run: Run) -> None:
        if with_runner:
            assign(run, status=RunStatus.RUNNING, started_at=datetime.now(UTC))
            outcome = await runner.run(workflow, run, Context.for_job(run, job))
            assert outcome.status is RunStatus.COMPLETED, outcome
            output = outcome.output
        else:
            output = await contract.echo(Body(job.payload))
            hand_made_step(run, output)
        finished(run, output)
        update = JobUpdate(state=JobState.COMPLETED)
        queue.submit(Transition(job.id, job.epoch, update, (run,)))
        done[job.id].set_result(run)

    async def worker(name: str) -> None:
        try:
            await work(name)
        except Exception as error:
            failing(done, error)
            raise

    async def work(name: str) -> None:
        while True:
            claims = await queue.claim(contract.QUEUE, 1, name, LEASE_S, timeout=60)
            while claims:
                job = claims[0].job
                # A fresh run record for the delivery, as the worker makes one (`_run_for`).
                await run_one(job, make_run(job, workflow_version="v1"))
                await asyncio.sleep(0)
                claim = queue.claim_nowait(contract.QUEUE, name, LEASE_S)
                claims = [claim] if claim is not None else []

    workers = [asyncio.create_task(worker(f"w{k}")) for k in range(CONCURRENCY)]

    async def enqueue(i: int) -> str:
        job, run = new_job(i)
        done[job.id] = loop.create_future()
        await queue.add([job], [run])
        return job.id

    ids = [await enqueue(i) for i in range(n)]
    results = [await done[job_id] for job_id in ids]
    for task in workers:
        task.cancel()
    return results


async def on_blok(n: int) -> list[Any]:
    with tempfile.TemporaryDirectory() as folder:
        async with contract.open_engine("memory", "echo", CONCURRENCY, Path(folder)) as engine:
            started = time.perf_counter()
            runs = await contract.submit_all(engine, n, CONCURRENCY)
            seconds = time.perf_counter() - started
            await contract.check(engine, runs, n, "echo", "floor blok")
    return [seconds]


def failing(done: dict[Any, asyncio.Future[Any]], error: BaseException) -> None:
    """A worker's failure reaches the waiter (instead of a wait for ever)."""
    for future in done.values():
        if not future.done():
            future.set_exception(error)


def check(level: str, results: list[Any], n: int) -> None:
    if level == "bare":
        assert results == list(range(n)), level
        return
    for i, run in enumerate(results):
        assert run.status is RunStatus.COMPLETED and run.output == i, (level, i, run)
        assert [(s.status, len(s.attempts)) for s in run.steps] == [(StepStatus.COMPLETED, 1)]


class CollectorClock:
    """Seconds the cyclic garbage collector ran (all generations) while it is on."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began

    def __enter__(self) -> CollectorClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def one(level: str, n: int, collector_on: bool = True) -> dict[str, float]:
    """One measurement, in this (fresh) process: jobs/s, and the collector's µs a job."""
    if not collector_on:
        gc.disable()
    with CollectorClock() as collector:
        rate = _rate(level, n)
    return {"jobs_s": rate, "gc_us": collector.seconds / n * 1e6}


def _rate(level: str, n: int) -> float:
    if level == "MemoryHuey":
        with tempfile.TemporaryDirectory() as folder:
            seconds = huey_peer.run_contract(
                "memory", "echo", "submit-all", n, CONCURRENCY, Path(folder)
            )
        return n / seconds
    if level == "blok":
        (seconds,) = asyncio.run(on_blok(n))
        return n / seconds
    runs = {
        "bare": lambda: bare(n, with_records=False),
        "records": lambda: bare(n, with_records=True),
        "queue": lambda: on_blok_queue(n, with_runner=False),
        "runner": lambda: on_blok_queue(n, with_runner=True),
    }[level]

    async def timed() -> tuple[float, list[Any]]:
        started = time.perf_counter()
        results = await runs()
        return time.perf_counter() - started, results

    seconds, results = asyncio.run(timed())
    check(level, results, n)
    return n / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--levels", default=",".join(LEVELS))
    parser.add_argument(
        "--collector-off",
        action="store_true",
        help="also run each level with the cyclic collector disabled, and print what it saves",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        emit(one(args.one, args.n, collector_on=not args.collector_off))
        return
    levels = [level for level in args.levels.split(",") if level]
    unknown = set(levels) - set(LEVELS)
    if unknown:
        raise SystemExit(
            f"unknown level(s) {', '.join(sorted(unknown))}; known: {', '.join(LEVELS)}"
        )
    seen: dict[str, list[float]] = {level: [] for level in levels}
    collected: dict[str, list[float]] = {level: [] for level in levels}
    without: dict[str, list[float]] = {level: [] for level in levels}
    for _ in range(args.repeat):
        for level in levels:
            result = run_fresh(__file__, ["--one", level, "-n", str(args.n)])
            seen[level].append(result["jobs_s"])
            collected[level].append(result["gc_us"])
            if args.collector_off:
                result = run_fresh(__file__, ["--one", level, "-n", str(args.n), "--collector-off"])
                without[level].append(result["jobs_s"])
    print("a memory job, part by part: jobs/s end to end (submit-all, concurrency 8)")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(f"N = {args.n}, median of {args.repeat} run(s) each, each in a fresh process\n")
    huey = statistics.median(seen["MemoryHuey"]) if "MemoryHuey" in seen else None
    off_heading = " µs a job, collector off | saved a job |" if args.collector_off else ""
    print(
        "| level | jobs/s | µs a job | added by this level | the collector, µs a job | vs MemoryHuey "
        f"| range (jobs/s) |{off_heading}"
    )
    print("|---|--:|--:|--:|--:|--:|---|" + ("--:|--:|" if args.collector_off else ""))
    before: float | None = None
    for level in levels:
        rate = statistics.median(seen[level])
        micros = 1e6 / rate
        added = "" if before is None or level == "MemoryHuey" else f"{micros - before:+.0f}"
        ratio = f"{rate / huey:.2f}x" if huey else ""
        spread = f"{min(seen[level]):,.0f}-{max(seen[level]):,.0f}"
        collector = statistics.median(collected[level])
        off = ""
        if args.collector_off:
            micros_off = 1e6 / statistics.median(without[level])
            off = f" {micros_off:.0f} | {micros - micros_off:.0f} |"
        print(
            f"| {level} | {rate:,.0f} | {micros:.0f} | {added} | {collector:.0f} | {ratio} "
            f"| {spread} |{off}"
        )
        if level != "MemoryHuey":
            before = micros


if __name__ == "__main__":
    main()
