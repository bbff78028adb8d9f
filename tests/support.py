"""Helpers shared by the tests (import as `from support import ...`)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import types
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from pg import fresh_database

from engine import Engine, Event, Run, RunStatus
from engine.backends.base import Backend, JobQueue, Pace
from engine.ledger import make_job, make_run
from engine.models import Job


async def all_tasks_blocked(timeout: float = 10) -> None:
    """`anyio.wait_all_tasks_blocked()`, checked every 2 ms instead of every 100 ms. anyio's
    check wakes every 100 ms and the SQLite backend's watcher every 50 ms (`OTHERS_POLL_S`):
    the two fire in the same turn of the loop, the watcher is then not blocked, and the check
    could fail in step with it for seconds (a claim's look every 5 s breaks the step)."""
    this = asyncio.current_task()
    with anyio.fail_after(timeout):
        while True:
            await anyio.lowlevel.checkpoint()
            waiting = (
                task is this or (task._fut_waiter is not None and not task._fut_waiter.done())  # type: ignore[attr-defined]
                for task in asyncio.all_tasks()
            )
            if all(waiting):
                return
            await anyio.sleep(0.002)


async def run_events_until(
    events: AsyncIterator[Event], run_id: str, last: type[Event], timeout: float = 20
) -> list[Event]:
    """The events of one run from `events`, up to and including the first of type `last`."""
    seen: list[Event] = []
    with anyio.fail_after(timeout):
        async for event in events:
            if getattr(event, "run_id", None) == run_id:
                seen.append(event)
                if isinstance(event, last):
                    return seen
    raise AssertionError("the event stream ended")


@asynccontextmanager
async def expect_events(
    engine: Engine,
    kind: type[Event],
    count: int = 1,
    where: Callable[[Any], bool] = lambda event: True,
    timeout: float = 10,
) -> AsyncIterator[list[Event]]:
    """Subscribe, run the block, then wait until `count` matching events arrived."""
    seen: list[Event] = []
    enough = anyio.Event()
    events = engine.events()

    async def listen() -> None:
        async with events:
            async for event in events:
                if isinstance(event, kind) and where(event):
                    seen.append(event)
                    if len(seen) >= count:
                        enough.set()
                        return

    async with anyio.create_task_group() as tg:
        tg.start_soon(listen)
        yield seen
        with anyio.fail_after(timeout):
            await enough.wait()


async def until(condition: Callable[[], Any], timeout: float = 10, every: float = 0.01) -> None:
    """Wait until `condition()` (sync or async) holds, failing after `timeout` seconds. For
    state another process (or another engine's connection) writes, where there is no event
    to await; in-process changes are awaited as events instead (`expect_events`)."""
    with anyio.fail_after(timeout):
        while True:
            held = condition()
            if hasattr(held, "__await__"):
                held = await held
            if held:
                return
            await anyio.sleep(every)


async def job_run(engine: Engine, job_id: str) -> Run:
    """The job's run now (its latest delivery's)."""
    return await engine.get_run((await engine.get_job(job_id)).run_id)


async def run_when(engine: Engine, job_id: str, status: RunStatus, timeout: float = 10) -> Run:
    """The job's run, once it has `status` (written by another engine, or another process)."""

    async def there() -> bool:
        return (await job_run(engine, job_id)).status is status

    await until(there, timeout)
    return await job_run(engine, job_id)


def _write_lock_free(database: Path) -> bool:
    """Whether a write transaction on the SQLite file can begin within a second: one that
    another process is in the middle of ends in far less; one a stopped process holds never."""
    with closing(sqlite3.connect(database, timeout=1, isolation_level=None)) as conn:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return False
        conn.execute("ROLLBACK")
        return True


async def freeze(pid: int, database: Path, holding: Callable[[], bool], tries: int = 50) -> None:
    """SIGSTOP a worker process on the SQLite file `database` while `holding()` (read while
    it is stopped: it holds the jobs the test is about), at a moment it is not inside a write
    transaction. A process stopped inside one keeps the file's write lock and no other process
    can write until it wakes (SQLite's locks belong to the process, for any program on the
    file): that is not "a worker frozen past its lease", so such a stop is undone and tried
    again at another point of its cycle."""
    for _ in range(tries):
        os.kill(pid, signal.SIGSTOP)
        if await anyio.to_thread.run_sync(_write_lock_free, database) and holding():
            return
        os.kill(pid, signal.SIGCONT)
        await anyio.sleep(random.uniform(0.005, 0.05))
    raise AssertionError(f"worker {pid}: no stop of {tries} found it holding jobs outside a write")


# The databases an engine test can run on: "memory", "sqlite", "postgres"; DURABLE are those
# that outlive an engine and that several engines (processes) can share.
DATABASES = ("memory", "sqlite", "postgres")
DURABLE = ("sqlite", "postgres")


@asynccontextmanager
async def a_database(kind: str, tmp_path: Path) -> AsyncIterator[Path | str | None]:
    """A fresh database of `kind` for `Engine(database=...)`: None (memory), a SQLite file in
    `tmp_path`, or a PostgreSQL database of its own (tests/pg.py: skipped where there is no
    server, failed where BLOK_REQUIRE_POSTGRES=1)."""
    if kind == "memory":
        yield None
    elif kind == "sqlite":
        yield tmp_path / "blok.db"
    elif kind == "postgres":
        async with fresh_database() as url:
            yield url
    else:
        raise ValueError(f"no database kind {kind!r}: one of {', '.join(DATABASES)}")


@pytest.fixture(params=DATABASES, name="database")
async def any_database(
    request: pytest.FixtureRequest, tmp_path: Path, anyio_backend: str
) -> AsyncIterator[Path | str | None]:
    """The `database` fixture: each of DATABASES in turn (None for memory). A test module
    imports it and binds it (`database = any_database`) to use it."""
    async with a_database(request.param, tmp_path) as location:
        yield location


@pytest.fixture(params=DURABLE, name="database")
async def durable_database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """The `database` fixture: each DURABLE kind in turn, as a string (a file path or a URL).
    A test module imports it and binds it (`database = durable_database`) to use it."""
    async with a_database(request.param, tmp_path) as location:
        yield str(location)


def provider_of(database: str) -> str:
    """The queue provider of jobs kept in a DURABLE `database`."""
    return "postgres" if database.startswith("postgresql://") else "sqlite"


async def add_unserved(queue: JobQueue, name: str, payloads: list[Any]) -> list[Job]:
    """Jobs of the queue `name` (for a workflow of that name), each with its first run, added
    straight through `queue`: `enqueue` does not know a queue no engine serves yet."""
    made = [
        make_job(
            queue=name,
            workflow_name=name,
            payload=payload,
            headers=None,
            priority=0,
            run_at=None,
            max_retries=0,
        )
        for payload in payloads
    ]
    await queue.add(made, [make_run(job, workflow_version="") for job in made])
    return made


@dataclass(frozen=True)
class Sleep:
    """A sleep a backend's own code asked for (`record_sleeps`)."""

    backend: Backend  # whose method slept
    where: str  # that method
    reader: str  # who called it (its qualified name)
    seconds: float
    pace: Pace | None  # the method's `pace` (wait_for_change's), None if it has none


def record_sleeps(monkeypatch: pytest.MonkeyPatch, module: types.ModuleType) -> list[Sleep]:
    """Every sleep the code of `module` (a backend's) asks of anyio from now on, as it asks
    for it: what a backend holds back or waits between its looks, seen, not timed."""
    slept: list[Sleep] = []

    async def sleep(delay: float) -> None:
        method, caller = sys._getframe(1), sys._getframe(2)
        here = method.f_locals
        where, reader = method.f_code.co_name, caller.f_code.co_qualname
        slept.append(Sleep(here["self"], where, reader, delay, here.get("pace")))
        await anyio.sleep(delay)

    class Anyio(types.ModuleType):  # anyio, but for its sleep
        def __getattr__(self, name: str) -> object:
            return sleep if name == "sleep" else getattr(anyio, name)

    monkeypatch.setattr(module, "anyio", Anyio("anyio"))
    return slept


def process_runs_here(pid: int) -> bool:
    """Whether `pid` is a process of this machine that runs (a zombie, killed and not yet
    reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def dead_pid() -> int:
    """A pid no process here has any more: a real child's, once it has ended and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def marked_line(test_file: str, marker: str) -> str:
    """`file:line` of the line of `test_file` that holds `marker` (not the line that asks), as
    a run's error or a `where` answer names it: relative to the working directory."""
    lines = Path(test_file).read_text().splitlines()
    number = next(n for n, line in enumerate(lines, 1) if marker in line and "line_of" not in line)
    return f"{Path(test_file).resolve().relative_to(Path.cwd().resolve())}:{number}"


def raised_at(function: Callable[..., Any], lines_in: int = 1) -> str:
    """`file:line` of the line `lines_in` lines below `function`'s `def` (the `raise` in a test's
    node), as a run's error names where it came from: the file relative to the working
    directory the tests run from (the repository's root)."""
    code = function.__code__
    path = Path(code.co_filename).resolve().relative_to(Path.cwd().resolve())
    return f"{path}:{code.co_firstlineno + lines_in}"


def polite_node(began: threading.Event) -> Callable[[Any], str]:
    """A plain def node that sets `began`, then watches ctx.cancelled as a plain def should,
    and returns a few ms after it is set (it tidies up first)."""

    def polite(ctx: Any) -> str:
        began.set()
        while not ctx.cancelled:
            time.sleep(0.01)
        time.sleep(0.05)
        return "stopped"

    return polite


class Turns:
    """How many times the event loop has gone round since this was made (up to 100: it keeps
    a callback ready until then, so the loop does not sleep)."""

    def __init__(self) -> None:
        self.count = 0
        self._loop = asyncio.get_running_loop()
        self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.count += 1
        if self.count < 100:
            self._loop.call_soon(self._tick)
