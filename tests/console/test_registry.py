"""One registry feeds the keys, the palette, the `:` commands and the help screen."""

from __future__ import annotations

from rich.console import Console

from blok_tui import actions
from blok_tui.app import BlokApp
from blok_tui.dead_letters_screen import DeadLettersScreen
from blok_tui.diff_screen import DiffScreen
from blok_tui.help_screen import help_text
from blok_tui.logs_screen import LogsScreen
from blok_tui.queues_screen import QueuesScreen
from blok_tui.run_screen import RunScreen
from blok_tui.runs_screen import RunsScreen
from blok_tui.schedules_screen import SchedulesScreen
from blok_tui.timeline_screen import TimelineScreen
from blok_tui.workers_screen import WorkersScreen

SCREENS = {
    actions.QUEUES: QueuesScreen,
    actions.RUNS: RunsScreen,
    actions.RUN: RunScreen,
    actions.DEAD_LETTERS: DeadLettersScreen,
    actions.WORKERS: WorkersScreen,
    actions.TIMELINE: TimelineScreen,
    actions.LOGS: LogsScreen,
    actions.DIFF: DiffScreen,
    actions.SCHEDULES: SchedulesScreen,
}


def _keys(bindings: list) -> dict[str, str]:
    return {b.key: b.action for b in bindings}


def test_every_registry_key_is_bound_on_the_screen_that_owns_it() -> None:
    for entry in actions.ACTIONS:
        if entry.key is None:
            continue
        owner = BlokApp if entry.scope == actions.APP else SCREENS[entry.scope]
        assert _keys(owner.BINDINGS).get(entry.key) == entry.action, entry
        target = owner.__dict__.get(f"action_{entry.action.split('(')[0]}") or getattr(
            owner, f"action_{entry.action.split('(')[0]}", None
        )
        assert target is not None, f"{owner.__name__} has no action for {entry}"


def test_the_help_lists_every_key_and_command() -> None:
    console = Console(width=120, record=True)
    with console.capture() as capture:
        console.print(help_text())
    text = capture.get()
    for entry in actions.ACTIONS:
        if entry.key and not entry.action.startswith("status("):
            assert entry.title in text, entry
        if entry.command:
            assert f":{entry.command}" in text, entry
    assert (
        "Show runs by status: all running waiting queued failed completed cancelled; "
        "or retrying, stuck" in text
    )
