"""A console that opens its own engine (`BlokApp(open_engine=...)`, as the snapshot tests and
the screenshot script do) closes it before the app returns, while its event loop still runs.

Textual cancels an app's workers at exit without waiting for them. The engine's close (its
database connections' threads) then finished after the app had returned, or not at all once the
loop was closed: an aiosqlite thread reported "Event loop is closed"."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from blok_tui.app import BlokApp
from engine import Engine

from .flows import ALL
from .helpers import command, settled

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
