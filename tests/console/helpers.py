"""Waiting on the console without sleeping for fixed times, and reading what it shows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
from rich.console import Console
from textual.geometry import Region
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import Input, Static

from blok_tui.app import BlokApp
from blok_tui.widgets.row_table import RowTable


async def until(pilot: Pilot[Any], predicate: Callable[[], bool], timeout: float = 10) -> None:
    """Let the app process messages until `predicate()` holds."""
    with anyio.fail_after(timeout):
        while not predicate():
            await pilot.pause(0.02)


async def settled(pilot: Pilot[Any]) -> None:
    """Until the app has shown every engine change it noted and no view is reading."""
    app = pilot.app
    assert isinstance(app, BlokApp)
    await until(pilot, lambda: app.ready.is_set())
    await pilot.pause()
    await until(pilot, lambda: app.idle)
    await pilot.pause()


async def command(pilot: Pilot[Any], line: str) -> None:
    """Open the `:` command line with its key, fill it in, and press enter. (Typing each
    character through the pilot costs ~0.1 s a key, so the text is set in one go.)"""
    await pilot.press("colon")
    await until(pilot, lambda: bool(pilot.app.screen.query("#command")))
    pilot.app.screen.query_one("#command", Input).value = line
    await pilot.press("enter")
    await settled(pilot)


def column(table: RowTable, key: str) -> list[str]:
    return [str(table.cell(row, key)) for row in table.keys]


def text_of(widget: Static, width: int = 160) -> str:
    console = Console(width=width, record=True, file=None, force_terminal=False)
    with console.capture() as capture:
        console.print(widget.content)
    return capture.get()


def shown_lines(widget: Widget) -> list[str]:
    """The lines `widget` draws at its size, as they are on screen: wrapped where it wraps
    them, and cut where its height ends (`text_of` wraps at a width of its own)."""
    region = Region(0, 0, *widget.outer_size)  # with its padding and border
    return [strip.text.rstrip() for strip in widget.render_lines(region)]
