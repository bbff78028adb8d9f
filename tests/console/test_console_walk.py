"""What a new user met in the console's walk-through (/tmp/walk/console.md): a crash that
exited 0, short ids cut by their column, ctrl+c, keys typed right after `:`, a quiet quit,
null placeholders called ready, `:inject` of an unknown queue, `:` typos, a 60x20 terminal,
and wording. Over a real engine on a real SQLite file, driven with Textual's pilot."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import Terminal, eventually, quit_with_a_run_going, write_workflows
from textual import events
from textual.keys import _character_to_key
from textual.pilot import Pilot
from textual.widgets import Button, Static, TextArea
from textual.widgets.text_area import Selection

from blok_tui.app import BlokApp, stopping_line
from blok_tui.confirm_screen import ConfirmScreen
from blok_tui.inject_screen import InjectScreen
from blok_tui.queues_screen import QueuesScreen
from blok_tui.runs_screen import RunsScreen
from blok_tui.widgets.key_bar import KeyBar
from blok_tui.widgets.row_table import RowTable
from engine import Engine, Step, WorkerTrigger, Workflow

from .flows import ALL
from .helpers import column, command, settled, shown_lines, text_of, until

pytestmark = pytest.mark.anyio
WIDE = (140, 40)
SMALL = (60, 20)
ISO_TIME = re.compile(r"\d{2}:\d{2}:\d{2}")


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    async with Engine(workflows=ALL, database=tmp_path / "blok.db", grace_period=0.5) as engine:
        yield engine


# ---- 1 and 9: how the console process ends --------------------------------------------------
CRASHING = """
import sys
from blok_tui import app, cli

def crash(self):
    raise RuntimeError("the console broke")

app.BlokApp.on_mount = crash  # an unhandled exception in the app, as a bug would raise
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_console_that_crashes_exits_non_zero(tmp_path: Path) -> None:
    folder = write_workflows(tmp_path / "workflows")
    console = Terminal(tmp_path, "-c", CRASHING, "--db", "blok.db", "--workflows", str(folder))
    code = console.finish()
    assert "the console broke" in console.text
    assert code == 1


def quit_by_q(console: Terminal) -> None:
    console.type("q")
    eventually(lambda: "Stay (n)" in console.text)  # asked first: a run is in flight
    console.type("y")


def quit_by_sigterm(console: Terminal) -> None:
    # `kill PID` (a supervisor) ended the process at once: the terminal
    # stayed in the alternate screen with its cursor hidden, and the runs had no grace.
    console.process.terminate()


@pytest.mark.parametrize("quit_", [quit_by_q, quit_by_sigterm], ids=["q", "sigterm"])
def test_quitting_with_a_run_in_flight_says_it_is_stopping_it(
    tmp_path: Path, quit_: Callable[[Terminal], None]
) -> None:
    code, console, _, _ = quit_with_a_run_going(tmp_path, quit_)
    assert code == 0
    after = console.text.rpartition("\x1b[?1049h")[2]  # what came after the screen was entered
    assert "\x1b[?1049l" in after and "\x1b[?25h" in after  # left it, cursor shown again
    assert "stopping 1 run… (up to 2s" in console.text


@pytest.mark.parametrize("memory", [False, True], ids=["durable", "memory"])
def test_the_stopping_line_keeps_to_one_line_of_an_80_column_terminal(memory: bool) -> None:
    # It is printed after the screen is gone, where nothing fits it to the terminal: at 118
    # characters it wrapped on any terminal narrower than that.
    for count in (1, 3, 12_345):
        line = stopping_line(count, 2.0, memory=memory)
        assert len(line) <= 80, line
        assert f"stopping {count:,} run" in line and "up to 2s" in line


# ---- 8: typeahead ---------------------------------------------------------------------------
async def test_keys_typed_right_after_the_colon_reach_the_command_line(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        assert isinstance(app.screen, QueuesScreen)
        await pilot.press(":", "r", "u", "n", "s", "enter")
        await until(pilot, lambda: isinstance(app.screen, RunsScreen), timeout=3)
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, QueuesScreen))
        # The pilot lets the app idle between keys; a paste or tmux's send-keys does not.
        burst(app, ":runs", "enter")
        await until(pilot, lambda: isinstance(app.screen, RunsScreen), timeout=3)
        assert app.screen.status_name == "all"


async def inject_modal(app: BlokApp, pilot: Pilot[Any], queue: str) -> TextArea:
    """Open the inject modal on `queue`; its payload editor, once it is on screen."""
    app.action_inject(queue)
    await until(
        pilot, lambda: isinstance(app.screen, InjectScreen) and bool(app.screen.query(TextArea))
    )
    await pilot.pause()
    return app.screen.query_one(TextArea)


def screen_table(app: BlokApp) -> RowTable:
    """The table of the view on top."""
    return app.screen.query_one(RowTable)


def burst(app: BlokApp, text: str, *keys: str) -> None:
    """Every character of `text`, then `keys`, in the app's queue at once (as a terminal
    delivers a paste), with no turn of the event loop between them."""
    for char in text:
        key = _character_to_key(char) if not char.isalnum() else char
        event = events.Key(key, char)
        event.set_sender(app)
        app.post_message(event)
    for key in keys:
        event = events.Key(key, "\r" if key == "enter" else None)
        event.set_sender(app)
        app.post_message(event)


# ---- 7: ctrl+c ------------------------------------------------------------------------------
async def test_ctrl_c_quits_from_a_view(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        await pilot.press("ctrl+c")
        await until(pilot, lambda: app.return_code == 0)


async def test_ctrl_c_asks_first_with_a_run_in_flight_and_a_second_one_quits(
    engine: Engine,
) -> None:
    await engine.enqueue("slow", {"order_id": "S1"})
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        await until(pilot, lambda: engine.in_flight == 1)
        await pilot.press("ctrl+c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert str(app.screen.query_one("#no", Button).label) == "Stay (n)"
        assert app.return_code is None  # asked, not quit
        await pilot.press("ctrl+c")
        await until(pilot, lambda: app.return_code == 0)


async def test_ctrl_c_in_the_inject_modal_copies_and_says_how_to_leave(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        area = await inject_modal(app, pilot, "quick")
        area.text = '{"order_id": "A1"}'
        area.select_all()
        await pilot.press("ctrl+c")
        await until(pilot, lambda: bool(app._notifications))
        assert app.clipboard == '{"order_id": "A1"}'
        [note] = [n for n in app._notifications]
        assert note.title == "Copied" and "esc closes this first" in note.message
        area.selection = Selection.cursor((0, 0))
        await pilot.press("ctrl+c")
        await until(pilot, lambda: len(app._notifications) == 2)
        assert isinstance(app.screen, InjectScreen)  # the payload is still there
        assert app.return_code is None


# ---- 4: short ids whole ---------------------------------------------------------------------
async def test_the_run_column_fits_the_short_ids_of_a_burst_of_runs(engine: Engine) -> None:
    # Ids made in one millisecond share 11 characters and more: their unique prefixes are
    # longer than the column's 12.
    await engine.enqueue_many("slow", [{"i": i} for i in range(100)])
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        await command(pilot, "runs queued")
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        table = screen.query_one("#runs", RowTable)
        lines = shown_lines(table)[1:-1]  # the rows on screen, under the header
        shown = [screen.short[key] for key in table.keys[: len(lines)]]
        assert max(map(len, shown)) > 12  # the case the walk-through met
        for short, line in zip(shown, lines, strict=True):
            assert short in line


# ---- 9: the questions' buttons say what staying means ---------------------------------------
async def test_a_bulk_cancel_asks_to_keep_them(engine: Engine) -> None:
    for n in range(3):
        await engine.enqueue("slow", {"order_id": f"S{n}"})
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        await command(pilot, "runs slow")
        await pilot.press("C")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert str(app.screen.query_one("#no", Button).label) == "Keep them (n)"
        await pilot.press("n")


# ---- 13: a template's blanks ----------------------------------------------------------------
ORDER = Workflow(
    name="orders.check",
    trigger=WorkerTrigger(queue="orders"),
    steps=[
        Step(
            "check",
            lambda ctx, order_id, amount: {"ok": amount > 0},
            inputs={"order_id": "$.body.order_id", "amount": "$.body.amount"},
        )
    ],
)


async def test_the_inject_template_says_which_fields_are_still_null(tmp_path: Path) -> None:
    async with Engine(workflows=[ORDER], database=tmp_path / "blok.db") as engine:
        app = BlokApp(engine)
        async with app.run_test(size=WIDE) as pilot:
            await settled(pilot)
            area = await inject_modal(app, pilot, "orders")
            problem = app.screen.query_one("#problem", Static)
            said = text_of(problem)
            assert "fill in order_id, amount" in said and "ready to send" not in said
            area.text = '{"order_id": "A1", "amount": null}'
            await pilot.pause()
            assert "fill in amount" in text_of(problem)
            area.text = '{"order_id": "A1", "amount": 5}'
            await pilot.pause()
            assert "ready to send" in text_of(problem)
            # A field taken out is no blank, but its step would fail with "bad input".
            area.text = '{"order_id": "A1"}'
            await pilot.pause()
            said = text_of(problem)
            assert "amount: missing, and read by its workflow" in said, said
            assert "ready to send" not in said
            # A warning, not a refusal: ctrl+s sends the nulls as they are.
            area.text = '{"order_id": "A1", "amount": null}'
            await pilot.press("ctrl+s")
            await until(pilot, lambda: not isinstance(app.screen, InjectScreen))
            assert [r.input for r in await engine.runs(queue="orders")] == [
                {"order_id": "A1", "amount": None}
            ]


async def test_edit_and_replay_says_which_fields_the_edited_input_lacks(tmp_path: Path) -> None:
    # It said "ready to send" of an input without a field the workflow reads: the replay
    # failed at once with "bad input".
    async with Engine(workflows=[ORDER], database=tmp_path / "blok.db") as engine:
        source = await engine.wait_for_job(
            await engine.enqueue("orders", {"order_id": "A1", "amount": 5}), timeout=10
        )
        app = BlokApp(engine)
        async with app.run_test(size=WIDE) as pilot:
            await settled(pilot)
            await command(pilot, f"run {source.id}")
            await pilot.press("e")
            await until(pilot, lambda: isinstance(app.screen, InjectScreen))
            problem = app.screen.query_one("#problem", Static)
            assert "ready to send" in text_of(problem)
            app.screen.query_one(TextArea).text = '{"order_id": "A1", "amont": 5}'
            await pilot.pause()
            said = text_of(problem)
            assert said.startswith("! amount: missing, and read by its workflow"), said


# ---- 14 and 15: the command line's refusals ---------------------------------------------------
def _messages(app: BlokApp) -> list[str]:
    return [n.message for n in app._notifications]


async def test_inject_of_an_unknown_queue_says_so_as_dlq_does(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        await command(pilot, "dlq nope")
        [refusal] = _messages(app)
        assert refusal.startswith("unknown queue 'nope' (queues: ")
        await command(pilot, "inject nope")
        assert _messages(app) == [refusal, refusal]


async def test_a_mistyped_command_gets_a_suggestion(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        await command(pilot, "rnus")
        [said] = _messages(app)
        assert said.startswith("unknown command :rnus; did you mean ':runs'? (commands: ")
        await command(pilot, "dlq slwo")
        assert _messages(app)[-1].startswith("unknown queue 'slwo'; did you mean 'slow'?")


# ---- 16: 60x20 ------------------------------------------------------------------------------
async def test_the_inject_modal_keeps_its_buttons_on_a_60x20_screen(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=SMALL) as pilot:
        await settled(pilot)
        await inject_modal(app, pilot, "quick")
        for button in ("#send", "#close"):
            region = app.screen.query_one(button).region
            assert region.height and region.bottom <= SMALL[1] and region.right <= SMALL[0]
        await pilot.resize_terminal(*WIDE)  # room again: the bordered fields come back
        await until(pilot, lambda: not app.screen.query_one("#send", Button).compact)


async def test_a_60_column_footer_keeps_the_essential_keys(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=SMALL) as pilot:
        await settled(pilot)
        for open_view in ("queues", "runs"):
            await command(pilot, open_view)
            footer = text_of(app.screen.query_one(KeyBar), width=SMALL[0])
            for essential in (": command", "? help"):
                assert essential in footer, (open_view, footer)
        assert "esc back" in footer


# ---- 17: wording ----------------------------------------------------------------------------
async def test_a_queued_runs_started_cell_says_it_has_not_started(engine: Engine) -> None:
    for n in range(3):  # concurrency 2: the third waits
        await engine.enqueue("slow", {"order_id": f"S{n}"})
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        await command(pilot, "runs queued")
        screen = app.screen
        assert isinstance(screen, RunsScreen) and len(screen.runs) == 1
        table = screen.query_one("#runs", RowTable)
        assert column(table, "started")[0].startswith("since ")
        await command(pilot, "runs running")
        started = column(screen_table(app), "started")
        assert len(started) == 2 and all(ISO_TIME.fullmatch(c) for c in started)


async def test_a_delayed_runs_started_cell_says_when_it_may_start(engine: Engine) -> None:
    # A retry in its backoff, or a job given a delay: "since 21:43" (its creation) read as how
    # long it had waited for a slot.
    job_id = await engine.enqueue("slow", {"order_id": "D1"}, delay="1h")
    run = await engine.get_run((await engine.get_job(job_id)).run_id)
    assert run.run_at is not None
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        await command(pilot, "runs")
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        table = screen_table(app)
        cells = dict(zip(column(table, "run"), column(table, "started"), strict=True))
        [cell] = [
            cell for short, cell in cells.items() if run.id.removeprefix("run_").startswith(short)
        ]
        moment = run.run_at.astimezone(app.tz)  # another day's (after 23:00) by its date
        same_day = moment.date() == app.now().astimezone(app.tz).date()
        expected = f"at {moment:%H:%M:%S}" if same_day else f"at {moment:%m-%d}"
        assert cell == expected, cell


async def test_a_queues_filter_that_matches_nothing_says_so(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        screen = app.screen
        assert isinstance(screen, QueuesScreen)
        await pilot.press("slash", "z", "z")
        await until(pilot, lambda: screen.table.row_count == 0)
        queues = len(app.queue_names)
        summary = text_of(screen.query_one("#summary", Static))
        assert f"0 of {queues} queues" in summary and "no queue matches 'zz'" in summary
        await pilot.press("backspace", "backspace", "s", "l", "o", "w")
        await until(pilot, lambda: screen.table.row_count == 1)
        summary = text_of(screen.query_one("#summary", Static))
        assert f"1 of {queues} queues" in summary and "no queue matches" not in summary


async def test_the_workers_view_names_the_consoles_own_process(tmp_path: Path) -> None:
    database = tmp_path / "blok.db"
    async with Engine(workflows=ALL, database=database) as engine:
        app = BlokApp(engine)
        async with app.run_test(size=WIDE) as pilot:
            await settled(pilot)
            await command(pilot, "workers")
            await until(pilot, lambda: bool(column(screen_table(app), "worker")))
            summary = text_of(app.screen.query_one("#workers-summary", Static))
            assert f"this console: {engine.worker.id}" in summary
