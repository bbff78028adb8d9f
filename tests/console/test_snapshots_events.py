"""Snapshots of the views for events, schedules and rate limits, at 80x24 and 140x40, over a
frozen scene (tests/console/events_scene.py). Update with `--snapshot-update`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from textual.pilot import Pilot

from blok_tui.app import BlokApp

from . import events_scene
from .helpers import settled, until
from .scene import rid

SIZES = {"80x24": (80, 24), "140x40": (140, 40)}


@pytest.fixture
def built(tmp_path: Path) -> tuple[Path, Path]:
    return anyio.run(events_scene.build, tmp_path)


async def _open(pilot: Pilot[Any], line: str) -> None:
    await settled(pilot)
    app: BlokApp = pilot.app  # type: ignore[assignment]
    await app.run_command(line)
    await settled(pilot)


def _send_modal() -> Callable[[Pilot[Any]], Any]:
    async def steps(pilot: Pilot[Any]) -> None:
        await _open(pilot, f"run {rid(20)}")
        await pilot.press("s")
        await until(pilot, lambda: pilot.app.screen.query("#event"))
        await pilot.pause()

    return steps


SCREENS: dict[str, Callable[[Pilot[Any]], Any]] = {
    "schedules": lambda pilot: _open(pilot, "schedules"),
    "run-waiting-for-event": lambda pilot: _open(pilot, f"run {rid(20)}"),
    "send-event": _send_modal(),
    "run-rate-limited": lambda pilot: _open(pilot, f"run {rid(19)}"),
}


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("screen", list(SCREENS))
def test_event_screens(snap_compare: Any, built: tuple[Path, Path], screen: str, size: str) -> None:
    assert snap_compare(
        events_scene.app(*built), terminal_size=SIZES[size], run_before=SCREENS[screen]
    )
