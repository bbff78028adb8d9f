"""How the console feels with 100,000 runs in a SQLite store.

Measures, over a real engine and the real app (headless):
- time to first paint of the runs view (`:runs` until the first page is on screen), and the
  app's start until the queues view is on screen;
- time for a status change to reach the screen: from the engine's RunFinished event to the
  runs table showing `completed` (median, p95);
- idle CPU of the console: process CPU over a quiet window with the runs view open, against a
  peer run of the engine alone in the same process (the ratio is the console's cost).

Usage: python benchmarks/console.py [--runs 100000] [--samples 40] [--idle 10]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
from textual.widgets import DataTable

from blok_tui.app import BlokApp
from blok_tui.runs_screen import RunsScreen
from engine import Engine, Run, RunFinished, RunStatus, Step, WorkerTrigger, Workflow


def tick(ctx: Any) -> dict:
    return {"n": ctx.body.get("n")}


WORKFLOW = Workflow(
    name="bench.tick",
    trigger=WorkerTrigger(queue="tick", concurrency=4),
    steps=[Step("tick", tick)],
)
STATUSES = [RunStatus.COMPLETED] * 8 + [RunStatus.FAILED, RunStatus.CANCELLED]


async def fill(database: Path, n: int) -> float:
    started = time.perf_counter()
    base = datetime.now(UTC) - timedelta(days=1)
    async with Engine(workflows=[WORKFLOW], database=database, consume=False) as engine:
        for start in range(0, n, 10_000):
            for i in range(start, min(n, start + 10_000)):
                created = base + timedelta(milliseconds=500 * i)
                engine.store.save_run(
                    Run.model_construct(
                        id=f"run_bench{i:09d}",
                        workflow_name=WORKFLOW.name,
                        workflow_version=WORKFLOW.version,
                        queue="tick",
                        job_id=f"job_bench{i:09d}",
                        status=STATUSES[i % len(STATUSES)],
                        input={"n": i},
                        headers={},
                        output=None,
                        error="boom" if i % 10 == 8 else None,
                        error_step=None,
                        priority=0,
                        job_attempt=1,
                        created_at=created,
                        started_at=created,
                        finished_at=created + timedelta(milliseconds=40),
                        run_at=None,
                        wait_until=None,
                        replay_of=None,
                        replay_from_step=None,
                        parent_run_id=None,
                        depth=0,
                        worker=None,
                        attempts=1,
                        failed_attempts=0,
                        cursor=[],
                        state={},
                        steps=[],
                        logs=[],
                    )
                )
            await engine.store.flush()
    return time.perf_counter() - started


async def until(pilot: Any, predicate: Any, timeout: float = 30, step: float = 0.002) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await pilot.pause(step)


async def first_paint(database: Path, repeats: int) -> tuple[list[float], list[float]]:
    starts, opens = [], []
    async with Engine(workflows=[WORKFLOW], database=database, consume=False) as engine:
        for _ in range(repeats):
            t0 = time.perf_counter()
            app = BlokApp(engine)
            async with app.run_test(size=(140, 40)) as pilot:
                await until(pilot, lambda app=app: app.ready.is_set() and app.idle)
                await pilot.pause()
                starts.append(time.perf_counter() - t0)
                t1 = time.perf_counter()
                await app.run_command("runs")
                await until(
                    pilot,
                    lambda app=app: isinstance(app.screen, RunsScreen) and app.screen.loaded,
                )
                await pilot.pause()  # the refresh that paints it
                opens.append(time.perf_counter() - t1)
                table = app.screen.query_one("#runs", DataTable)
                assert table.row_count == 100, table.row_count
    return starts, opens


async def status_latency(database: Path, samples: int) -> list[float]:
    latencies: list[float] = []
    async with Engine(workflows=[WORKFLOW], database=database) as engine:
        finished: dict[str, float] = {}

        async def watch() -> None:
            async for event in engine.events():
                if isinstance(event, RunFinished):
                    finished[event.run_id] = event.ts

        app = BlokApp(engine)
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            async with app.run_test(size=(140, 40)) as pilot:
                await until(pilot, lambda: app.ready.is_set())
                await app.run_command("runs")
                await until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.loaded)
                screen = app.screen
                table = screen.query_one("#runs", DataTable)

                def shows_completed(run_id: str) -> bool:
                    try:
                        return "completed" in str(table.get_cell(run_id, "status"))
                    except Exception:  # row not there yet
                        return False

                for n in range(samples):
                    job_id = await engine.enqueue("tick", {"n": n})
                    run_id = (await engine.get_job(job_id)).run_id
                    await until(pilot, lambda run_id=run_id: shows_completed(run_id))
                    seen = time.time()
                    latencies.append(seen - finished[run_id])
                    await pilot.pause(0.05)
            tg.cancel_scope.cancel()
    return latencies


async def idle_cpu(database: Path, seconds: float, with_console: bool) -> float:
    async with Engine(workflows=[WORKFLOW], database=database) as engine:
        if not with_console:
            await anyio.sleep(1)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            await anyio.sleep(seconds)
            return (time.process_time() - cpu0) / (time.perf_counter() - wall0)
        app = BlokApp(engine)
        async with app.run_test(size=(140, 40)) as pilot:
            await until(pilot, lambda: app.ready.is_set())
            await app.run_command("runs")
            await until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.loaded)
            await pilot.pause(1)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            await pilot.pause(seconds)
            return (time.process_time() - cpu0) / (time.perf_counter() - wall0)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--idle", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        database = Path(tmp) / "blok.db"
        fill_s = await fill(database, args.runs)
        starts, opens = await first_paint(database, repeats=5)
        latencies = await status_latency(database, args.samples)
        engine_cpu = await idle_cpu(database, args.idle, with_console=False)
        console_cpu = await idle_cpu(database, args.idle, with_console=True)
    ms = 1000
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"machine: {machine} ({platform.system()} {platform.release()})")
    print(f"N = {args.runs:,} runs in SQLite (filled in {fill_s:.1f} s)\n")
    rows = [
        (
            "app start → queues view on screen",
            statistics.median(starts) * ms,
            max(starts) * ms,
            "ms",
        ),
        (
            ":runs → first page of runs painted",
            statistics.median(opens) * ms,
            max(opens) * ms,
            "ms",
        ),
        (
            f"status change → on screen (n={len(latencies)})",
            statistics.median(latencies) * ms,
            p95(latencies) * ms,
            "ms",
        ),
    ]
    print(f"{'measure':<44} {'median':>9} {'p95/max':>9}")
    for name, median, high, unit in rows:
        print(f"{name:<44} {median:>7.1f}{unit} {high:>7.1f}{unit}")
    print(f"\nidle CPU over {args.idle:.0f} s, runs view open (engine idle, no jobs):")
    print(f"  engine alone (peer)     {engine_cpu * 100:6.2f} % of one core")
    print(f"  engine + console        {console_cpu * 100:6.2f} % of one core")
    ratio = console_cpu / engine_cpu if engine_cpu else float("inf")
    print(
        f"  console's own share     {(console_cpu - engine_cpu) * 100:6.2f} %  (ratio {ratio:.1f}x)"
    )


if __name__ == "__main__":
    anyio.run(main)
