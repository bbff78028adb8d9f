"""How the console feels with 100,000 runs in a SQLite store.

Measures, over a real engine and the real app (headless):
- time to first paint of the runs view (`:runs` until the first page is on screen), and the
  app's start until the queues view is on screen;
- time for a status change to reach the screen: from the engine's RunFinished event to the
  runs table showing `completed` (median, p95);
- idle CPU of the console: process CPU over a quiet window with the runs view open, against a
  peer run of the engine alone in the same process (the ratio is the console's cost);
- under the running demo (`--demo`): the real console in a pseudo-terminal, its screen read back
  with a terminal emulator (pyte), the bundled demo workflows fed by the demo producer (seeded):
  CPU of the console process with the runs view open against the same engine and producer
  without the console, and keystroke latency, from writing a key to the pty until the terminal
  shows it in the runs view's `/` filter (each key of a word typed at a person's pace, then
  erased).

Usage: python benchmarks/console.py [--runs 100000] [--samples 40] [--idle 10]
       python benchmarks/console.py --demo [--window 20] [--keys 60] [--size 140x40]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import platform
import pty
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio

from blok_tui.app import BlokApp
from blok_tui.runs_screen import RunsScreen
from blok_tui.widgets.row_table import RowTable
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
                engine.backend.runs.save_run(
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
            await engine.backend.runs.flush()
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
                table = app.screen.query_one("#runs", RowTable)
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
                table = screen.query_one("#runs", RowTable)

                def shows_completed(run_id: str) -> bool:
                    try:
                        return "completed" in str(table.cell(run_id, "status"))
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
            cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    return cpu


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


# ---- under the running demo, in a real terminal ------------------------------------------------
async def demo_child(kind: str, database: Path, seed: int) -> None:
    """What the measured process runs: the demo's engine and producer, with the console on this
    terminal (kind "console") or without it (kind "engine", the peer)."""
    import logging

    import examples
    from blok_tui.app import run_console

    logging.getLogger().addHandler(logging.NullHandler())  # log lines would tear the screen
    from blok_tui.demo import demo_producer

    folder = Path(examples.__file__).parent
    async with (
        Engine(workflows=folder, database=database) as engine,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(lambda: demo_producer(engine, seed=seed))
        if kind == "console":
            await run_console(engine, title="blok-tui · bench")
        else:
            await anyio.sleep_forever()
        tg.cancel_scope.cancel()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Terminal:
    """A child process on a pseudo-terminal, its output fed to a pyte screen by a thread."""

    def __init__(self, argv: list[str], columns: int, lines: int) -> None:
        import pyte

        self.screen = pyte.Screen(columns, lines)
        self.stream = pyte.ByteStream(self.screen)
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLORTERM": "truecolor"}
        self.process = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
        )
        os.close(slave)
        self.master = master
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            with self.changed:
                self.stream.feed(data)
                self.changed.notify_all()

    def write(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def lines(self) -> list[str]:
        with self.lock:
            return list(self.screen.display)

    def wait(self, predicate: Any, timeout: float = 30.0) -> float:
        """Until predicate(lines) holds; returns the moment (perf_counter) it first did."""
        deadline = time.perf_counter() + timeout
        with self.changed:
            while not predicate(self.screen.display):
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise TimeoutError("\n".join(self.screen.display))
                self.changed.wait(left)
            return time.perf_counter()

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        os.close(self.master)


def _child(kind: str, database: Path, seed: int) -> list[str]:
    return [sys.executable, __file__, "--child", kind, "--db", str(database), "--seed", str(seed)]


def demo_engine_cpu(database: Path, seed: int, warmup: float, window: float) -> float:
    """The peer: the same engine and producer, no console."""
    process = subprocess.Popen(_child("engine", database, seed), stdout=subprocess.DEVNULL)
    try:
        time.sleep(warmup)
        cpu0, wall0 = cpu_seconds(process.pid), time.perf_counter()
        time.sleep(window)
        return (cpu_seconds(process.pid) - cpu0) / (time.perf_counter() - wall0)
    finally:
        process.terminate()
        process.wait(10)


def demo_console(
    database: Path, seed: int, size: tuple[int, int], warmup: float, window: float, keys: int
) -> tuple[float, list[float]]:
    """CPU of the console process with the runs view open, then keystroke latencies."""
    term = Terminal(_child("console", database, seed), *size)
    try:
        term.wait(lambda lines: any("jobs/s" in line for line in lines))
        term.write(":")
        term.wait(lambda lines: any(line.startswith(" :") for line in lines))
        term.write("runs\r")
        # The runs view is up once it counts its rows ("1–27 of 27").
        term.wait(lambda lines: "runs" in lines[0] and any(" of " in line for line in lines))
        time.sleep(warmup)
        cpu0, wall0 = cpu_seconds(term.process.pid), time.perf_counter()
        time.sleep(window)
        cpu = (cpu_seconds(term.process.pid) - cpu0) / (time.perf_counter() - wall0)
        term.write("/")
        term.wait(lambda lines: any("filter runs" in line for line in lines))
        row = next(n for n, line in enumerate(term.lines()) if "filter runs" in line)
        latencies: list[float] = []
        word = "orders"
        typed = ""
        while len(latencies) < keys:
            for key in [*word, *["\x7f"] * len(word)]:
                typed = typed[:-1] if key == "\x7f" else typed + key
                expected = typed or "filter runs"
                sent = time.perf_counter()
                term.write(key)
                shown = term.wait(
                    lambda lines, expected=expected: lines[row].strip().startswith(expected)
                )
                latencies.append(shown - sent)
                time.sleep(0.15)  # a brisk typist: about seven keys a second
        term.write("\x1b")
        return cpu, latencies[:keys]
    finally:
        term.close()


def run_demo(args: argparse.Namespace) -> None:
    columns, lines = (int(n) for n in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        engine_cpu = demo_engine_cpu(Path(tmp) / "peer.db", args.seed, args.warmup, args.window)
        cpu, latencies = demo_console(
            Path(tmp) / "console.db",
            args.seed,
            (columns, lines),
            args.warmup,
            args.window,
            args.keys,
        )
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"machine: {machine} ({platform.system()} {platform.release()})")
    print(
        f"the bundled demo running (producer seed {args.seed}), terminal {columns}x{lines}, "
        f"after {args.warmup:.0f} s of warm-up\n"
    )
    print(f"CPU over {args.window:.0f} s, runs view open:")
    print(f"  engine + demo alone (peer)   {engine_cpu * 100:6.1f} % of one core")
    print(f"  engine + demo + console      {cpu * 100:6.1f} % of one core")
    print(f"  the console's own share      {(cpu - engine_cpu) * 100:6.1f} %")
    ms = 1000
    print(
        f"\nkeystroke → on screen (n={len(latencies)}, typed into the runs filter): "
        f"median {statistics.median(latencies) * ms:.1f} ms, p95 {p95(latencies) * ms:.1f} ms, "
        f"max {max(latencies) * ms:.1f} ms"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--demo", action="store_true", help="measure under the running demo")
    parser.add_argument("--window", type=float, default=20.0, help="CPU window (s), --demo")
    parser.add_argument("--warmup", type=float, default=15.0, help="before measuring, --demo")
    parser.add_argument("--keys", type=int, default=60, help="keystrokes timed, --demo")
    parser.add_argument("--size", default="140x40", help="terminal size, --demo")
    parser.add_argument("--seed", type=int, default=1, help="demo producer seed, --demo")
    parser.add_argument("--child", choices=("console", "engine"), help=argparse.SUPPRESS)
    parser.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        await demo_child(args.child, args.db, args.seed)
        return
    if args.demo:
        run_demo(args)
        return
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
