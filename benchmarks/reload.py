"""Hot reload: from saving a workflow file to its new version serving.

Over a real engine (SQLite database, real watchfiles events) it saves a new version of one
workflow file N times and measures, per save:
- save → WorkflowReloaded on the event stream (the new version is what the queue claims with);
- save → the first job enqueued after the save completes, and its output proves it ran the new
  version;
- the reload alone: `reload_paths` called directly (import, swap, apply, event), no watcher.
The peer is what the seed does instead of a hot reload: stop the engine, start a new one on the
edited file and run the first job, with nothing in flight (a run in flight would hold the stop
for up to the grace period; a hot reload does not wait for it). The ratio column is restart
time / this row's time. Saves are timed from the write, so the watcher's quiet window (50 ms)
and its polling are in the first two rows; a restart is timed from someone deciding to restart.

Usage: python benchmarks/reload.py [--edits 50] [--restarts 10]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import tempfile
import textwrap
import time
from pathlib import Path

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from engine import Engine
from engine.events import Event, WorkflowReloaded
from engine.reload import reload_paths, wait_until_watching


def source(label: str) -> str:
    return textwrap.dedent(
        f"""\
        from engine import Step, WorkerTrigger, Workflow

        LABEL = {label!r}


        def work(ctx):
            return {{"label": LABEL}}


        workflow = Workflow(
            name="bench.reload",
            trigger=WorkerTrigger(queue="reload", concurrency=4),
            steps=[Step("work", work)],
        )
        """
    )


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def hot_reloads(
    folder: Path, database: Path, edits: int
) -> tuple[list[float], list[float], list[float]]:
    file = folder / "bench.py"
    file.write_text(source("start"))
    to_event: list[float] = []
    to_job: list[float] = []
    swap_only: list[float] = []
    async with Engine(workflows=folder, database=database, watch=True) as engine:
        send, receive = anyio.create_memory_object_stream[Event](10_000)

        async def pump() -> None:
            async for event in engine.events():
                await send.send(event)

        async with anyio.create_task_group() as tg:
            tg.start_soon(pump)
            while not engine.bus.active:
                await anyio.lowlevel.checkpoint()
            await wait_until_watching(engine)
            for n in range(edits):
                label = f"edit-{n}"
                # A user saves at any moment, not in step with the watcher's 50 ms polls.
                await anyio.sleep(random.uniform(0, 0.1))
                started = time.perf_counter()
                file.write_text(source(label))
                await next_reload(receive, file)
                to_event.append(time.perf_counter() - started)
                job_id = await engine.enqueue("reload", {})
                run = await engine.wait_for_job(job_id, timeout=30)
                to_job.append(time.perf_counter() - started)
                if run.output != {"label": label}:
                    raise SystemExit(f"edit {n}: the first job after the save ran {run.output}")
            # The engine's own part, without the watcher: import, swap, apply, event.
            for n in range(edits):
                label = f"direct-{n}"
                file.write_text(source(label))
                started = time.perf_counter()
                await reload_paths(engine, folder, {file})
                await next_reload(receive, file)
                swap_only.append(time.perf_counter() - started)
                await next_reload(receive, file)  # the watcher's own reload of the same save
            tg.cancel_scope.cancel()
    return to_event, to_job, swap_only


async def next_reload(receive: MemoryObjectReceiveStream[Event], file: Path) -> None:
    with anyio.fail_after(30):
        async for event in receive:
            if isinstance(event, WorkflowReloaded) and event.path == str(file):
                return


async def restarts(folder: Path, database: Path, count: int) -> list[float]:
    """The seed's way: stop the engine that serves the old version, start a new one."""
    file = folder / "bench.py"
    file.write_text(source("restart-start"))
    samples = []
    engine = Engine(workflows=folder, database=database)
    await engine.__aenter__()
    try:
        for n in range(count):
            label = f"restart-{n}"
            file.write_text(source(label))
            started = time.perf_counter()
            await engine.__aexit__(None, None, None)
            engine = Engine(workflows=folder, database=database)
            await engine.__aenter__()
            run = await engine.wait_for_job(await engine.enqueue("reload", {}), timeout=30)
            samples.append(time.perf_counter() - started)
            if run.output != {"label": label}:
                raise SystemExit(f"restart {n}: the first job ran {run.output}")
    finally:
        await engine.__aexit__(None, None, None)
    return samples


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
        f"{platform.node()} · {cpu} · {os.cpu_count()} cores · {platform.system()} "
        f"{platform.release()} · Python {platform.python_version()}"
    )


async def main(edits: int, restart_count: int) -> None:
    with tempfile.TemporaryDirectory(prefix="blok-reload-bench-") as tmp:
        root = Path(tmp).resolve()
        folder = root / "workflows"
        folder.mkdir()
        to_event, to_job, swap_only = await hot_reloads(folder, root / "hot.db", edits)
        cold = await restarts(folder, root / "cold.db", restart_count)

    cold_median = statistics.median(cold)
    rows = [
        ("save → WorkflowReloaded", len(to_event), to_event),
        ("save → first job done on new version", len(to_job), to_job),
        ("reload alone (import+swap, no watcher)", len(swap_only), swap_only),
        ("peer: stop+start engine → first job", len(cold), cold),
    ]
    print(f"machine: {machine()}")
    print(
        f"watchfiles step 50 ms (quiet time before a reload), import timeout 5 s; N edits = {edits}"
    )
    print()
    print(f"{'measure':<40} {'N':>4} {'median ms':>10} {'p95 ms':>9} {'restart/this':>13}")
    for name, n, samples in rows:
        median = statistics.median(samples)
        print(
            f"{name:<40} {n:>4} {median * 1000:>10.1f} {percentile(samples, 0.95) * 1000:>9.1f}"
            f" {cold_median / median:>12.2f}x"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edits", type=int, default=50)
    parser.add_argument("--restarts", type=int, default=10)
    args = parser.parse_args()
    anyio.run(main, args.edits, args.restarts)
