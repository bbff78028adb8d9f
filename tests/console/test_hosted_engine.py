"""A console that opens its own engine (`BlokApp(open_engine=...)`, as the snapshot tests and
the screenshot script do) closes it before the app returns, while its event loop still runs.

Textual cancels an app's workers at exit without waiting for them. The engine's close (its
database connections' threads) then finished after the app had returned, or not at all once the
loop was closed: an aiosqlite thread reported "Event loop is closed"."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from textual.widgets import Input

from blok_tui.app import BlokApp
from engine import Engine

from .flows import ALL
from .helpers import command, settled, until

pytestmark = pytest.mark.anyio


async def test_the_engine_is_closed_when_the_app_returns(tmp_path: Path) -> None:
    phases: list[str] = []

    @asynccontextmanager
    async def open_engine() -> AsyncIterator[Engine]:
        try:
            async with Engine(workflows=ALL, database=tmp_path / "blok.db") as engine:
                phases.append("open")
                yield engine
        finally:  # Textual ends the app's workers with a cancel
            phases.append("closed")

    app = BlokApp(open_engine=open_engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(pilot)
        job_id = await app.engine.enqueue("quick", {"order_id": "H1"})
        await command(pilot, f"run {(await app.engine.get_job(job_id)).run_id}")
    assert phases == ["open", "closed"]


async def test_keys_pressed_before_the_engine_is_open_wait_for_it(tmp_path: Path) -> None:
    # The app opens its engine in a worker after mounting, and its keys and command line answer
    # from the first frame. A view asked for before the engine was open (the live log, the
    # workers, a run, the inject modal) read from no engine at all and ended the app with an
    # AttributeError; now each says the engine is still opening, and works once it is.
    release = anyio.Event()

    @asynccontextmanager
    async def open_engine() -> AsyncIterator[Engine]:
        await release.wait()
        async with Engine(workflows=ALL, database=tmp_path / "blok.db") as engine:
            yield engine

    app = BlokApp(open_engine=open_engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        for key in ("L", "i"):
            await pilot.press(key)
            await pilot.pause()
        for line in ("workers", "run run_123"):
            await pilot.press("colon")
            await until(pilot, lambda: bool(pilot.app.screen.query("#command")))
            pilot.app.screen.query_one("#command", Input).value = line
            await pilot.press("enter")
            await pilot.pause()
        warned = [n.message for n in app._notifications if "still opening" in n.message]
        assert len(warned) == 4, [n.message for n in app._notifications]
        assert app.engine is None
        release.set()
        await settled(pilot)
        await pilot.press("L")
        await until(pilot, lambda: type(app.screen).__name__ == "LogsScreen")
