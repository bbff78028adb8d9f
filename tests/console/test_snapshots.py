"""Snapshots of the console's main screens over a frozen scene (fixed ids, times and clock).

These run the app in pytest-textual-snapshot's own event loop, so the app enters its engine
itself (BlokApp(open_engine=...)). Update with `pytest tests/console --snapshot-update`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from textual.pilot import Pilot

from blok_tui.app import BlokApp

from . import scene
from .helpers import settled

SIZE = (140, 40)


@pytest.fixture
def built(tmp_path: Path) -> tuple[Path, Path]:
    return anyio.run(scene.build, tmp_path)


def _then(*steps: Callable[[BlokApp], Any]) -> Callable[[Pilot[Any]], Any]:
    async def run_before(pilot: Pilot[Any]) -> None:
        await settled(pilot)
        for step in steps:
            result = step(pilot.app)  # type: ignore[arg-type]
            if hasattr(result, "__await__"):
                await result
            await settled(pilot)

    return run_before


def test_queues_view(snap_compare: Any, built: tuple[Path, Path]) -> None:
    assert snap_compare(scene.app(*built), terminal_size=SIZE, run_before=_then())


def test_runs_view(snap_compare: Any, built: tuple[Path, Path]) -> None:
    run_before = _then(lambda app: app.run_command("runs"))
    assert snap_compare(scene.app(*built), terminal_size=SIZE, run_before=run_before)


def test_run_view_with_a_failed_attempt(snap_compare: Any, built: tuple[Path, Path]) -> None:
    run_before = _then(lambda app: app.run_command("run run_0000showcase0006"))
    assert snap_compare(scene.app(*built), terminal_size=SIZE, run_before=run_before)


def test_inject_modal(snap_compare: Any, built: tuple[Path, Path]) -> None:
    run_before = _then(lambda app: app.action_inject("orders"))
    assert snap_compare(scene.app(*built), terminal_size=SIZE, run_before=run_before)


def test_reload_error_banner(snap_compare: Any, built: tuple[Path, Path]) -> None:
    folder, database = built
    scene.break_a_workflow(folder)
    assert snap_compare(scene.app(folder, database), terminal_size=SIZE, run_before=_then())


def test_run_view_with_nested_steps(snap_compare: Any, built: tuple[Path, Path]) -> None:
    run_before = _then(lambda app: app.run_command("run run_0000showcase0013"))
    assert snap_compare(scene.app(*built), terminal_size=SIZE, run_before=run_before)


def test_run_view_of_a_throttled_run(snap_compare: Any, built: tuple[Path, Path]) -> None:
    run_before = _then(lambda app: app.run_command("run run_0000showcase0016"))
    assert snap_compare(scene.app(*built), terminal_size=SIZE, run_before=run_before)


def test_workers_view(snap_compare: Any, built: tuple[Path, Path]) -> None:
    run_before = _then(lambda app: app.run_command("workers"))
    assert snap_compare(scene.app(*built), terminal_size=SIZE, run_before=run_before)


def test_bulk_confirmation_over_marked_rows(snap_compare: Any, built: tuple[Path, Path]) -> None:
    async def mark_two_and_ask(pilot: Pilot[Any]) -> None:
        await _then(lambda app: app.run_command("runs failed"))(pilot)
        await pilot.press("space", "space", "R")
        await settled(pilot)

    assert snap_compare(scene.app(*built), terminal_size=SIZE, run_before=mark_two_and_ask)
