"""Attach latency: how long from a change a worker process commits to the event in an attached
client. Not a test (timings are printed, never asserted); run it by hand:

    python benchmarks/attach.py [N]

A `blok-tui worker` subprocess serves a temp database; an AttachedEngine in this process enqueues
N short jobs one after another and, for each, measures the wall-clock gap between the worker's
own timestamps (the run's `started_at` and `finished_at`, written by the worker) and the arrival
of RunStarted / RunFinished here (both processes share the host clock); then N/10 times, how long
`cancel` of a running 30 s step takes until the worker has cancelled and stored it.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))  # its worker helpers

from cli_helpers import start_worker, write_workflows

from engine import Engine, RunFinished, RunStarted, StepStarted


async def measure(database: Path, n: int) -> dict[str, list[float]]:
    started: list[float] = []
    finished: list[float] = []
    async with Engine(database=database, create=False) as engine:
        events = engine.events()
        for _ in range(n):
            job_id = await engine.enqueue("naps", {"seconds": 0.05})
            run_id = (await engine.get_job(job_id)).run_id
            seen: dict[type, float] = {}
            with anyio.fail_after(10):
                async for event in events:
                    if getattr(event, "run_id", None) != run_id:
                        continue
                    if isinstance(event, RunStarted | RunFinished):
                        seen[type(event)] = time.time()
                    if isinstance(event, RunFinished):
                        break
            run = await engine.get_run(run_id)
            assert run.started_at is not None and run.finished_at is not None
            started.append(seen[RunStarted] - run.started_at.timestamp())
            finished.append(seen[RunFinished] - run.finished_at.timestamp())
        # Cancel: from the call to the worker's step being cancelled and stored.
        cancels: list[float] = []
        for _ in range(max(1, n // 10)):
            job_id = await engine.enqueue("naps", {"seconds": 30})
            run_id = (await engine.get_job(job_id)).run_id
            with anyio.fail_after(10):
                async for event in events:
                    if isinstance(event, StepStarted) and event.run_id == run_id:
                        break
            began = time.monotonic()
            run = await engine.cancel(run_id)
            cancels.append(time.monotonic() - began)
            assert run.status == "cancelled" and run.steps[0].status == "cancelled"
        # Idle: only the worker's heartbeat (every 2 s) writes; the poller should read rarely.
        feed = engine._follower  # the attached engine's change feed counts its checks
        assert feed is not None
        polls, reads = feed.polls, feed.reads
        await anyio.sleep(5)
        idle_polls, idle_reads = feed.polls - polls, feed.reads - reads
    return {
        "started": started,
        "finished": finished,
        "cancel": cancels,
        "polls": [polls, idle_polls],
        "reads": [reads, idle_reads],
    }


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        database = root / "blok.db"
        worker = start_worker(database, write_workflows(root / "workflows"))
        try:
            result = anyio.run(measure, database, n)
        finally:
            worker.stop()
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, N={n}")
    print(f"{'event':<12}{'median ms':>12}{'p95 ms':>10}{'max ms':>10}")
    for name in ("started", "finished", "cancel"):
        values = sorted(v * 1000 for v in result[name])
        p95 = values[min(len(values) - 1, int(0.95 * len(values)))]
        print(f"{name:<12}{statistics.median(values):>12.1f}{p95:>10.1f}{values[-1]:>10.1f}")
    polls, reads = result["polls"], result["reads"]
    print(f"busy: {polls[0]} data_version polls, {reads[0]} of them read changes")
    print(f"idle 5 s: {polls[1]} data_version polls, {reads[1]} of them read changes")


if __name__ == "__main__":
    main()
