"""Hot reload is visible: a real file saved in a watched folder, seen by the console."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from textual.app import App, ComposeResult

from blok_tui.app import BlokApp
from blok_tui.widgets import ReloadBanner
from engine import Engine
from engine.reload import wait_until_watching

from .helpers import settled, shown_lines, text_of, until

pytestmark = pytest.mark.anyio

GOOD = """
from engine import Step, WorkerTrigger, Workflow


def ping(ctx):
    return {"pong": True}


workflow = Workflow(name="pings.ping", trigger=WorkerTrigger(queue="pings"), steps=[Step("ping", ping)])
"""
BROKEN = GOOD.replace('Step("ping", ping)', 'Step("ping", pong)')


@asynccontextmanager
async def watching(folder: Path) -> AsyncIterator[BlokApp]:
    """The console on an engine that serves `folder` (its database beside it), once the
    engine watches the folder: a file saved from then on is seen."""
    database = folder.parent / "blok.db"
    async with Engine(workflows=folder, database=database, watch=True) as engine:
        with anyio.fail_after(10):
            await wait_until_watching(engine)
        yield BlokApp(engine)


async def test_a_broken_save_shows_a_banner_with_file_and_line_until_fixed(tmp_path: Path) -> None:
    folder = tmp_path / "workflows"
    folder.mkdir()
    path = folder / "pings.py"
    path.write_text(GOOD)
    async with watching(folder) as app, app.run_test(size=(140, 40)) as pilot:
        await settled(pilot)
        banner = app.screen.query_one(ReloadBanner)
        assert not banner.has_class("-failing")
        path.write_text(BROKEN)
        # A save is a truncate then a write: the watcher may see the empty file first.
        await until(pilot, lambda: "pong" in text_of(banner))
        assert banner.has_class("-failing")
        shown = text_of(banner)
        assert "workflows/pings.py:9" in shown
        assert "NameError: name 'pong' is not defined" in shown
        path.write_text(GOOD)
        await until(pilot, lambda: not banner.has_class("-failing"))
        # The notice is a message of its own, handled after the banner was cleared.
        await until(pilot, lambda: "Reload fixed" in [n.title for n in app._notifications])


async def test_a_folder_with_no_workflow_yet_says_what_to_add_even_at_80_columns(
    tmp_path: Path,
) -> None:
    """A newcomer's first screen on an empty folder: the one thing to do, not a row of zeros
    that pushes it off the screen; the queue appears once its file is saved."""
    folder = tmp_path / "workflows"
    folder.mkdir()
    async with watching(folder) as app, app.run_test(size=(80, 24)) as pilot:
        await settled(pilot)
        summary = app.screen.query_one("#summary")
        assert text_of(summary, width=80).strip() == (
            "no queues: add a workflow with a WorkerTrigger to the workflows folder"
        )
        (folder / "pings.py").write_text(GOOD)
        await until(pilot, lambda: text_of(summary, width=80).startswith("1 queue   0 queued"))


async def test_every_failing_file_is_named_when_more_fail_than_the_banner_holds(
    tmp_path: Path,
) -> None:
    """Six broken files: the banner listed what fitted its six lines (a long error took two)
    and said nothing of the others."""
    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "pings.py").write_text(GOOD)
    long_name = "pong_" + "x" * 200  # an error wider than any terminal
    for n in range(6):
        (folder / f"broken{n}.py").write_text(BROKEN.replace("pong", long_name))
    async with watching(folder) as app, app.run_test(size=(100, 30)) as pilot:
        await settled(pilot)
        banner = app.screen.query_one(ReloadBanner)
        lines = [line for line in shown_lines(banner) if line.strip()]
        assert "⚠ 6 workflow files failed to load" in lines[0]
        assert len(lines) == 6  # one line a file shown, then the rest by name
        assert (
            lines[-1].strip().endswith("… and 2 more: workflows/broken4.py, workflows/broken5.py")
        )
        for n in range(4):
            assert f"workflows/broken{n}.py:9" in lines[n + 1]


async def test_a_broken_file_deleted_is_not_said_to_load_again(tmp_path: Path) -> None:
    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "pings.py").write_text(GOOD)
    broken = folder / "broken.py"
    broken.write_text(BROKEN)
    async with watching(folder) as app, app.run_test(size=(140, 40)) as pilot:
        await settled(pilot)
        banner = app.screen.query_one(ReloadBanner)
        assert banner.has_class("-failing")
        broken.unlink()
        await until(pilot, lambda: not banner.has_class("-failing"))

        def said() -> list[tuple[str, str]]:  # the event may come after a refresh cleared it
            return [(n.title, n.message) for n in app._notifications]

        await until(pilot, lambda: ("Reload error gone", "broken.py removed") in said())
        assert not any("loads again" in message for _, message in said()), said()


async def test_the_banner_tells_apart_one_file_broken_in_two_checkouts() -> None:
    # Two machines' folders, each with a broken orders.py: the banner read
    # "workflows/orders.py:5" twice, and nothing said which checkout was which.
    class Shown(App[None]):
        def compose(self) -> ComposeResult:
            yield ReloadBanner()

    app = Shown()
    async with app.run_test(size=(100, 10)) as pilot:
        banner = app.query_one(ReloadBanner)
        banner.show_errors(
            {
                f"/srv/{host}/workflows/orders.py": (
                    f"/srv/{host}/workflows/orders.py:5: SyntaxError: invalid syntax"
                )
                for host in ("m1", "m2")
            }
        )
        await pilot.pause()
        lines = [line.split() for line in shown_lines(banner) if line.strip()]
        assert [line[1] for line in lines[1:]] == [  # after its border
            "m1/workflows/orders.py:5",
            "m2/workflows/orders.py:5",
        ]
