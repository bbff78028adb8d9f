"""Helpers shared by the tests (import as `from support import ...`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

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
