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
SIZES = {"80x24": (80, 24), "140x40": (140, 40)}  # laid out for 80x24 first


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


# The main screens at both sizes.
MAIN: dict[str, Callable[[BlokApp], Any]] = {
    "queues": lambda app: None,
    "runs": lambda app: app.run_command("runs"),
    "run-failed-attempt": lambda app: app.run_command(f"run {scene.rid(6)}"),
    "run-timeline": lambda app: app.screen.action_timeline(),
    "inject": lambda app: app.action_inject("orders"),
    "help": lambda app: app.action_help(),
    "dead-letters": lambda app: app.run_command("dlq webhooks"),
    # Failures per job: run 4 failed, then its job's second delivery (run 5) completed.
    "runs-failed": lambda app: app.run_command("runs failed"),
    "run-retried": lambda app: app.run_command(f"run {scene.rid(4)}"),
    "bulk-replay-per-job": lambda app: app.screen.action_bulk_replay(),
    "dlq-requeue-all": lambda app: app.screen.action_requeue_all(),
}
BEFORE = {
    "run-timeline": [MAIN["run-failed-attempt"]],
    "bulk-replay-per-job": [MAIN["runs-failed"]],
    "dlq-requeue-all": [MAIN["dead-letters"]],
}


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("screen", list(MAIN))
def test_main_screens(snap_compare: Any, built: tuple[Path, Path], screen: str, size: str) -> None:
    run_before = _then(*BEFORE.get(screen, []), MAIN[screen])
    assert snap_compare(scene.app(*built), terminal_size=SIZES[size], run_before=run_before)


def test_reload_error_banner(snap_compare: Any, built: tuple[Path, Path]) -> None:
    folder, database = built
    scene.break_a_workflow(folder)
    assert snap_compare(scene.app(folder, database), terminal_size=SIZE, run_before=_then())


def test_run_view_with_nested_steps(snap_compare: Any, built: tuple[Path, Path]) -> None:
    run_before = _then(lambda app: app.run_command(f"run {scene.rid(13)}"))
    assert snap_compare(scene.app(*built), terminal_size=SIZE, run_before=run_before)


def test_run_view_of_a_throttled_run(snap_compare: Any, built: tuple[Path, Path]) -> None:
    run_before = _then(lambda app: app.run_command(f"run {scene.rid(16)}"))
    assert snap_compare(scene.app(*built), terminal_size=SIZE, run_before=run_before)


def test_run_view_of_an_orphaned_run(snap_compare: Any, built: tuple[Path, Path]) -> None:
    run_before = _then(lambda app: app.run_command(f"run {scene.rid(18)}"))
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
