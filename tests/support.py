"""Helpers shared by the tests (import as `from support import ...`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from pg import fresh_database

from engine import Engine, Event


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
