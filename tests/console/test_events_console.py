"""The console on events, schedules and rate limits, driven by keys over a real engine: a run
waiting for an event says for what and until when and takes an event sent from its view; the
schedules view pauses and runs a schedule; the "why is it waiting" panel names the runs holding
a rate limit's window, and h opens one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from textual.pilot import Pilot
from textual.widgets import Input, Static, TextArea

from blok_tui.app import BlokApp
from blok_tui.console import clock_time, short_ids
from blok_tui.inject_screen import InjectScreen
from blok_tui.run_screen import RunScreen
from blok_tui.schedules_screen import SchedulesScreen
from blok_tui.widgets.row_table import RowTable
from engine import (
    Engine,
    EngineError,
    RateLimit,
    RunStatus,
    Schedule,
    Step,
    WorkerTrigger,
    Workflow,
    wait,
)

from .helpers import column, command, settled, shown_lines, text_of, until

pytestmark = pytest.mark.anyio
SIZE = (140, 40)


def echo(ctx) -> dict:
    return {"echo": ctx.body}


APPROVAL = Workflow(
    name="orders.approval",
    trigger=WorkerTrigger(queue="approvals", concurrency=2),
    steps=[
        wait.for_event("approved", timeout="1h", match="$.body.order_id", name="approval"),
        Step("ship", echo),
    ],
)
NIGHTLY = Workflow(
    name="reports.nightly",
    trigger=WorkerTrigger(queue="nightly"),
    schedules=[Schedule(every="1d", payload={"report": "sales"})],
    steps=[Step("report", echo)],
)
LIMITED = Workflow(
    name="api.calls",
    trigger=WorkerTrigger(queue="calls", rate_limit=RateLimit(limit=1, period="1m")),
    steps=[Step("call", echo)],
)


async def parked(engine: Engine, job_id: str, status: RunStatus) -> str:
    with anyio.fail_after(10):
        while True:
            run = await engine.get_run((await engine.get_job(job_id)).run_id)
            if run.status is status:
                return run.id
            await anyio.sleep(0.02)


async def send_modal_of(pilot: Pilot[None], run_id: str) -> InjectScreen:
    """The run's view, and its send-event modal opened with `s`."""
    await settled(pilot)
    await command(pilot, f"run {run_id}")
    await pilot.press("s")
    await until(pilot, lambda: isinstance(pilot.app.screen, InjectScreen))
    modal = pilot.app.screen
    assert isinstance(modal, InjectScreen)
    return modal


async def test_send_the_awaited_event_from_the_run_view() -> None:
    async with Engine(workflows=[APPROVAL]) as engine:
        job_id = await engine.enqueue("approvals", {"order_id": "A1"})
        run_id = await parked(engine, job_id, RunStatus.WAITING)
        app = BlokApp(engine)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            await command(pilot, f"run {run_id}")
            assert isinstance(app.screen, RunScreen)
            header = text_of(app.screen.query_one("#run-header", Static))
            assert "✉ waiting for event 'approved' with key 'A1' until" in header
            assert "times out in 59m" in header or "times out in 1h" in header
            # Nobody sent anything else: the panel has nothing to add to the header.
            assert not app.screen.query_one("#why", Static).display
            await pilot.press("s")
            await until(pilot, lambda: isinstance(app.screen, InjectScreen))
            assert app.screen.query_one("#event", Input).value == "approved"
            # The dialog covers the header's countdown: it says when the wait gives up.
            wait_until = (await engine.get_run(run_id)).step("approval").wait_until
            assert wait_until is not None
            question = text_of(app.screen.query_one(".question", Static))
            assert f"its wait times out at {clock_time(wait_until, app.tz)}" in question
            app.screen.query_one(TextArea).text = '{"by": "ops"}'
            await pilot.press("ctrl+s")
            await until(pilot, lambda: isinstance(app.screen, RunScreen))
            done = await engine.wait_for_job(job_id, timeout=10)
            assert done.output == {"echo": {"order_id": "A1"}}
            assert done.step("approval").output == {"by": "ops"}
            assert [n.title for n in app._notifications][-1:] == ["Event sent"]


async def test_an_event_the_run_does_not_wait_for_is_told_kept() -> None:
    # A typo in the event's name: the mailbox keeps it for a wait that never comes. The view
    # says so, and what the run waits for instead, where it said "run … gets it".
    async with Engine(workflows=[APPROVAL]) as engine:
        job_id = await engine.enqueue("approvals", {"order_id": "A3"})
        run_id = await parked(engine, job_id, RunStatus.WAITING)
        app = BlokApp(engine)
        async with app.run_test(size=SIZE) as pilot:
            modal = await send_modal_of(pilot, run_id)
            modal.query_one("#event", Input).value = "aproved"
            modal.query_one(TextArea).text = "{}"
            await pilot.press("ctrl+s")
            await until(pilot, lambda: isinstance(app.screen, RunScreen))
            await until(pilot, lambda: bool(app._notifications))
            told = list(app._notifications)[-1]
            assert (told.title, told.severity) == ("Event kept", "warning")
            assert told.message == (
                "aproved kept: the run waits for 'approved' now; it will get 'aproved' if it "
                "waits for it later\nworkflow 'orders.approval' has no wait.for_event('aproved'): "
                "no step of it takes this event (the events it waits for: 'approved')"
            )
        assert (await engine.get_run(run_id)).status is RunStatus.WAITING
        await engine.cancel(run_id)


async def test_a_bad_event_is_refused_in_the_modal() -> None:
    async with Engine(workflows=[APPROVAL]) as engine:
        job_id = await engine.enqueue("approvals", {"order_id": "A2"})
        run_id = await parked(engine, job_id, RunStatus.WAITING)
        app = BlokApp(engine)
        async with app.run_test(size=SIZE) as pilot:
            modal = await send_modal_of(pilot, run_id)
            modal.query_one("#event", Input).value = ""
            modal.query_one(TextArea).text = "{not json"
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert isinstance(app.screen, InjectScreen)  # nothing sent
            # The first problem, in the order of the fields.
            assert "name the event" in text_of(modal.query_one("#problem", Static))
            modal.query_one("#event", Input).value = "approved"
            await pilot.pause()
            assert "not valid JSON" in text_of(modal.query_one("#problem", Static))
            modal.query_one(TextArea).text = "{}"
            await pilot.pause()
            assert "ready to send" in text_of(modal.query_one("#problem", Static))
            await pilot.press("escape")
        assert (await engine.get_run(run_id)).status is RunStatus.WAITING
        await engine.cancel(run_id)


async def test_the_schedules_view_pauses_runs_now_and_opens_the_last_run() -> None:
    async with Engine(workflows=[NIGHTLY]) as engine:
        await declared(engine)
        app = BlokApp(engine)
        async with app.run_test(size=SIZE) as pilot:
            table, _ = await schedules_view(app, pilot)
            assert column(table, "schedule") == ["every 1d"]
            assert column(table, "state") == ["● active"]
            assert column(table, "next")[0].startswith("in ")
            await pilot.press("p")
            await until(pilot, lambda: column(table, "state") == ["⏸ paused"])
            assert (await engine.schedules())[0].paused
            await pilot.press("n")
            await until(pilot, lambda: column(table, "status") not in (["–"], []))
            [info] = await engine.schedules()
            assert info.last_run_id is not None
            await engine.wait_for_job((await engine.get_run(info.last_run_id)).job_id, 10)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RunScreen))
            assert app.screen.run_id == info.last_run_id
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, SchedulesScreen))
            await pilot.press("p")
            await until(pilot, lambda: column(table, "state") == ["● active"])


async def declared(engine: Engine) -> None:
    """Until the scheduler's first pass has declared the engine's schedules."""
    with anyio.fail_after(10):
        while not await engine.schedules():  # noqa: ASYNC110 - another task writes them
            await anyio.sleep(0.02)


async def schedules_view(app: BlokApp, pilot: Pilot[None]) -> tuple[RowTable, Static]:
    """`:schedules` typed once the console has settled: the view's table and summary line."""
    await settled(pilot)
    await command(pilot, "schedules")
    assert isinstance(app.screen, SchedulesScreen)
    screen = app.screen
    return screen.query_one("#schedules", RowTable), screen.query_one("#schedules-summary", Static)


async def test_a_schedule_no_live_worker_serves_says_so_with_no_countdown(
    tmp_path: Path,
) -> None:
    # Its file failed to load on the workers: "● active", a countdown that came and went,
    # and nothing fired.
    database = tmp_path / "blok.db"
    async with Engine(workflows=[NIGHTLY], database=database) as engine:
        await declared(engine)
    async with Engine(database=database, workflows=[]) as console:
        app = BlokApp(console)
        async with app.run_test(size=SIZE) as pilot:
            table, summary = await schedules_view(app, pilot)
            await until(pilot, lambda: column(table, "state") == ["⚠ not served"])
            assert column(table, "next") == ["–"]
            said = text_of(summary)
            assert "1 not served by a live worker" in said and "next tick" not in said


async def test_schedules_another_version_of_the_file_declared_are_said_to_be_what_fires(
    tmp_path: Path,
) -> None:
    # A mixed fleet: a worker with the file of before (every 1d) beside one with a new file
    # (every 1h), started last. Its `every 1h` fires; the summary says the other worker's
    # own schedules are not what fires.
    database = tmp_path / "blok.db"
    newer = NIGHTLY.model_copy(update={"schedules": [Schedule(every="1h")]})
    async with (
        Engine(workflows=[NIGHTLY], database=database) as before,
        Engine(workflows=[newer], database=database) as after,
    ):
        await declared(after)
        app = BlokApp(before)
        async with app.run_test(size=SIZE) as pilot:
            table, summary = await schedules_view(app, pilot)
            await until(pilot, lambda: column(table, "schedule") == ["every 1h"])
            assert (
                "1 worker declares other schedules for reports.nightly (another version of the"
                " file): those listed fire"
            ) in text_of(summary)


async def test_schedules_a_version_with_none_declared_last_is_said_to_leave_none_firing(
    tmp_path: Path,
) -> None:
    # The new file took the schedule away (started last); a worker with the file of before
    # is still up. Nothing is listed, and "none declared" would be wrong: its file declares one.
    database = tmp_path / "blok.db"
    newer = NIGHTLY.model_copy(update={"schedules": []})
    async with (
        Engine(workflows=[NIGHTLY], database=database) as before,
        Engine(workflows=[newer], database=database),
    ):
        app = BlokApp(before)
        async with app.run_test(size=SIZE) as pilot:
            table, summary = await schedules_view(app, pilot)
            await until(pilot, lambda: "none fire" in text_of(summary))
            assert text_of(summary).strip() == (
                "schedules  1 worker declares schedules for reports.nightly, which another"
                " version of the file, declared last, has none of: none fire"
            )
            assert column(table, "schedule") == []


async def test_no_schedules_is_said_in_one_line_of_an_80_column_terminal() -> None:
    # The demo has none: the line saying so wrapped at 80 columns.
    async with Engine(workflows=[APPROVAL]) as engine:
        app = BlokApp(engine)
        async with app.run_test(size=(80, 24)) as pilot:
            _, summary = await schedules_view(app, pilot)
            await until(pilot, lambda: "none" in text_of(summary, width=80))
            lines = [line.strip() for line in shown_lines(summary) if line.strip()]
            assert lines == [
                "schedules  none: a workflow declares them with schedules=[Schedule(...)]"
            ]


async def test_why_waiting_names_the_rate_limit_holders_and_h_opens_one() -> None:
    async with Engine(workflows=[LIMITED]) as engine:
        first = await engine.enqueue("calls", {"n": 1})
        second = await engine.enqueue("calls", {"n": 2})
        done = await engine.wait_for_job(first, timeout=10)
        held = await parked(engine, second, RunStatus.THROTTLED)
        app = BlokApp(engine)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            await command(pilot, f"run {held}")
            why = text_of(app.screen.query_one("#why", Static))
            assert "[rate limit]" in why and "1/1 runs started in the window" in why
            assert f"held by {short_ids([done.id])[done.id]}" in why  # short, as everywhere
            await pilot.press("h")
            await until(
                pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.run_id == done.id
            )
        await engine.cancel(held)


async def hold_until_released(ctx) -> dict:
    await anyio.sleep(30)
    return {}


PER_USER = Workflow(
    name="api.per_user",
    trigger=WorkerTrigger(
        queue="per_user", concurrency=2, concurrency_key="$.body.user", on_limit="queue"
    ),
    steps=[Step("call", hold_until_released)],
)


@asynccontextmanager
async def one_held_behind_a_key() -> AsyncIterator[tuple[Engine, str]]:
    """An engine where a run of key 'u1' runs and a second one is held behind it (both
    cancelled afterwards): the engine and the held run's id."""
    async with Engine(workflows=[PER_USER]) as engine:
        first = await parked(
            engine, await engine.enqueue("per_user", {"user": "u1"}), RunStatus.RUNNING
        )
        held = await parked(
            engine, await engine.enqueue("per_user", {"user": "u1"}), RunStatus.QUEUED
        )
        yield engine, held
        await engine.cancel(held)
        await engine.cancel(first)


async def test_the_runs_views_preview_says_which_gate_holds_a_queued_run() -> None:
    # A run a concurrency key held showed "queued until 18:14:36 (in 3s)" and its input: read
    # as a backoff, where another run of its key held the slot.
    async with one_held_behind_a_key() as (engine, held):
        app = BlokApp(engine)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            await command(pilot, "runs queued")
            table = app.screen.query_one("#runs", RowTable)
            await until(pilot, lambda: table.keys == [held])
            preview = app.screen.query_one("#preview", Static)
            await until(pilot, lambda: "[concurrency]" in text_of(preview))
            said = text_of(preview)
            assert "queued [concurrency] concurrency key 'u1': 1 run(s) hold its slots" in said


async def test_a_run_held_by_its_key_is_said_to_wait_for_a_run_of_its_key_not_a_time() -> None:
    """Its header said "queued until 15:27:15 — starts in 2s" and offered "t starts it now",
    of a run whose key's holder had 20 s to go: at that time the gate only looks again (and a
    freed slot starts it sooner), and retry now found the key full again."""
    async with one_held_behind_a_key() as (engine, held):
        app = BlokApp(engine)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            await command(pilot, f"run {held}")
            header = app.screen.query_one("#run-header", Static)
            await until(pilot, lambda: "until a run of its key ends" in text_of(header))
            said = text_of(header)
            assert "○ queued until a run of its key ends (looks again in " in said, said
            assert "starts in" not in said and "t starts it now" not in said, said
            assert isinstance(app.screen, RunScreen) and not app.screen.key_applies("retry_now")
        with pytest.raises(EngineError, match="starts when a run of that key ends"):
            await engine.retry_now(held)


async def test_a_queued_run_no_live_worker_serves_says_so_in_its_view(tmp_path: Path) -> None:
    """The console attached to a database whose workers all stopped: a run enqueued since
    says why it does not start."""
    mail = Workflow(
        name="mail.send", trigger=WorkerTrigger(queue="mail"), steps=[Step("send", echo)]
    )
    database = tmp_path / "blok.db"
    async with Engine(workflows=[mail], database=database):
        pass
    async with Engine(database=database, create=False, follow=True) as engine:
        job_id = await engine.enqueue("mail", {})
        run_id = (await engine.get_job(job_id)).run_id
        app = BlokApp(engine)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            await command(pilot, f"run {run_id}")
            why = text_of(app.screen.query_one("#why", Static))
            assert "[no worker] no live worker serves queue 'mail'" in why, why
