"""A run whose worker died says `running` until a live worker takes its job over (or, for a
memory queue's, records it crashed: its job died with the worker); the console marks it and
says why nobody runs it. A real worker process, killed with its run held."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import anyio
import pytest
from cli_helpers import blok, eventually, serve
from test_memory_orphans import LOST, MEMORY_NAPS, NONE_ALIVE
from textual.widgets import Static

from blok_tui.app import BlokApp
from blok_tui.confirm_screen import ConfirmScreen
from blok_tui.run_screen import RunScreen
from blok_tui.runs_screen import RunsScreen
from blok_tui.widgets.row_table import RowTable
from engine import Engine, RunStatus

from .helpers import column, command, settled, text_of, until

pytestmark = pytest.mark.anyio

NAPS = """
import anyio
from engine import Step, Workflow, WorkerTrigger


async def nap(ctx):
    await anyio.sleep(3600)


workflow = Workflow(name="naps", trigger=WorkerTrigger(queue="naps"), steps=[Step("nap", nap)])
"""


TAKEN_OVER = (
    "a live worker takes its job over: the run is recorded crashed and its job gets a new run"
)
# The queue's workflow file, whether the test enqueues (a memory queue's schedule does), and
# what becomes of the run.
QUEUES = {
    "sqlite": (NAPS, True, TAKEN_OVER),
    "memory": (MEMORY_NAPS, False, LOST),
}


def _running(database: Path) -> str | None:
    listed = json.loads(blok("runs", "--db", database, "--json").stdout or "[]")
    return next((run["id"] for run in listed if run["status"] == "running"), None)


@pytest.mark.parametrize("provider", QUEUES)
async def test_a_running_run_whose_worker_died_is_marked_orphaned(
    tmp_path: Path, provider: str
) -> None:
    flow, enqueue, then = QUEUES[provider]
    database, worker = serve(tmp_path, {"naps.py": flow})
    try:
        if enqueue:
            blok("enqueue", "naps", "{}", "--db", database)
        run_id = await anyio.to_thread.run_sync(lambda: eventually(lambda: _running(database)))
    finally:
        worker.process.kill()
        worker.process.wait()
    why = (
        f"⚠ nobody runs it now: its worker {worker.id} is gone (its process "
        f"{worker.process.pid} no longer runs); {then}{NONE_ALIVE}"
    )
    async with Engine(database=database, create=False, follow=True) as engine:
        assert (await engine.get_run(run_id)).status is RunStatus.RUNNING
        app = BlokApp(engine)
        async with app.run_test(size=(140, 40)) as pilot:
            await settled(pilot)
            await command(pilot, "runs")
            await until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.loaded)
            table = app.screen.query_one("#runs", RowTable)
            await until(pilot, lambda: run_id in table.keys)
            assert column(table, "then")[table.keys.index(run_id)] == "⚠ orphaned"
            table.move_cursor(row=table.keys.index(run_id))
            await until(pilot, lambda: why in _flat(app.screen.query_one("#preview", Static)))
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RunScreen))
            await until(pilot, lambda: why in _flat(app.screen.query_one("#run-header", Static)))
            # Its time stopped when its worker was last seen: it reads the same a while later.
            header = _flat(app.screen.query_one("#run-header", Static))
            took = re.search(r" ran (\S+) ", header)
            assert took is not None, header
            later = engine.now() + timedelta(seconds=1.5)
            await until(pilot, lambda: engine.now() > later)
            screen = app.screen
            assert isinstance(screen, RunScreen)
            screen.render_run()
            assert took.group(0) in _flat(screen.query_one("#run-header", Static))
            # A cancel is asked as what it is: a record written now, no code to interrupt.
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            assert _flat(app.screen.query_one(".detail", Static)) == (
                f"naps on naps, running. Nobody runs it now (its worker {worker.id} is gone (its "
                f"process {worker.process.pid} no longer runs)): it is recorded cancelled at "
                "once; the job is not retried."
            )
            await pilot.press("y")
            await until(pilot, lambda: isinstance(app.screen, RunScreen))
            cancelled = await engine.get_run(run_id)
            assert cancelled.status is RunStatus.CANCELLED, cancelled
            assert cancelled.error == "cancelled by operator (its worker was gone)"


def _flat(widget: Static) -> str:
    """The widget's text in one line (a long sentence wraps)."""
    return " ".join(text_of(widget).split())
