"""The console driven by keys over a real engine on a real SQLite file."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest
from textual.widgets import Input, Static, TextArea

from blok_tui.actions import ActionCommands
from blok_tui.app import BlokApp
from blok_tui.confirm_screen import ConfirmScreen
from blok_tui.inject_screen import InjectScreen
from blok_tui.run_screen import RunScreen
from blok_tui.runs_screen import RunsScreen, worker_labels
from blok_tui.widgets import AttemptsView, StepRail
from blok_tui.widgets.row_table import RowTable
from blok_tui.widgets.step_rail import step_line
from engine import Attempt, Engine, RunStarted, StepRun, StepStatus

from .flows import ALL
from .helpers import column, command, settled, text_of, until

pytestmark = pytest.mark.anyio
SIZE = (150, 45)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    async with Engine(workflows=ALL, database=tmp_path / "blok.db", grace_period=0.5) as engine:
        yield engine


async def _running(engine: Engine, queue: str) -> str:
    """Enqueue a job and return its run id once a worker has started it."""
    events = engine.events()
    job_id = await engine.enqueue(queue, {"order_id": "S1"})
    with anyio.fail_after(10):
        async for event in events:
            if isinstance(event, RunStarted) and event.queue == queue:
                break
    await events.aclose()
    return (await engine.get_job(job_id)).run_id


async def test_cancel_a_running_run_with_c_after_confirming(engine: Engine) -> None:
    run_id = await _running(engine, "slow")
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs running")
        table = app.screen.query_one("#runs", RowTable)
        assert table.keys == [run_id]
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, RunsScreen))
        with anyio.fail_after(10):
            while (await engine.get_run(run_id)).status != "cancelled":
                await pilot.pause(0.02)
        # The running filter no longer shows it; without a filter it reads cancelled.
        await settled(pilot)
        await pilot.press("0")
        await settled(pilot)
        table = app.screen.query_one("#runs", RowTable)
        assert column(table, "status") == ["⊘ cancelled"]


async def test_cancel_asks_first_and_n_keeps_the_run(engine: Engine) -> None:
    run_id = await _running(engine, "slow")
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, f"run {run_id}")
        assert isinstance(app.screen, RunScreen)
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, RunScreen))
        assert (await engine.get_run(run_id)).status == "running"
        await engine.cancel(run_id)


async def test_replay_with_r_opens_the_new_run(engine: Engine) -> None:
    job_id = await engine.enqueue("quick", {"n": 7})
    source = await engine.wait_for_job(job_id, timeout=10)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs quick")
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, RunScreen))
        screen = app.screen
        assert isinstance(screen, RunScreen)
        assert screen.run_id != source.id
        replay = await engine.get_run(screen.run_id)
        assert replay.replay_of == source.id
        assert replay.input == {"n": 7}
        await settled(pilot)
        header = text_of(screen.query_one("#run-header", Static))
        assert f"replay of {source.id}" in header


async def test_inject_refuses_bad_json_in_the_modal_then_sends(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "inject quick")
        modal = app.screen
        assert isinstance(modal, InjectScreen)
        modal.query_one(TextArea).text = '{"order_id": "B7", }'
        await pilot.press("ctrl+s")
        await pilot.pause()
        problem = text_of(modal.query_one("#problem", Static))
        assert "not valid JSON: line 1, column 20" in problem
        assert app.screen is modal
        assert await engine.count_runs() == 0
        modal.query_one(TextArea).text = '{"order_id": "B7"}'
        # A delay the form cannot take says what to type (not "or a timedelta").
        modal.query_one("#delay", Input).value = "soon"
        await pilot.press("ctrl+s")
        await pilot.pause()
        problem = text_of(modal.query_one("#problem", Static))
        assert problem.strip().endswith("'1h', '1d'") and "timedelta" not in problem, problem
        modal.query_one("#delay", Input).value = ""
        await pilot.press("ctrl+s")
        await until(pilot, lambda: not isinstance(app.screen, InjectScreen))
        runs = await engine.runs(queue="quick")
        assert [r.input for r in runs] == [{"order_id": "B7"}]


async def test_inject_explains_an_unknown_queue_and_sends_nothing(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "inject nosuch")
        modal = app.screen
        assert isinstance(modal, InjectScreen)
        assert "unknown queue 'nosuch'" in text_of(modal.query_one("#problem", Static))
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is modal
        assert "unknown queue 'nosuch'" in text_of(modal.query_one("#problem", Static))
        assert await engine.count_runs() == 0


async def test_filter_the_runs_table_by_text_and_by_status(engine: Engine) -> None:
    quick = [await engine.enqueue("quick", {"n": n}) for n in range(3)]
    broken = [await engine.enqueue("broken", {"order_id": f"X{n}"}) for n in range(2)]
    for job_id in quick + broken:
        await engine.wait_for_job(job_id, timeout=10)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs")
        table = app.screen.query_one("#runs", RowTable)
        assert table.row_count == 5
        await pilot.press("slash", *"broken")
        await settled(pilot)
        assert column(table, "workflow") == ["broken.always"] * 2
        await pilot.press("escape")  # drops the text filter
        await settled(pilot)
        assert table.row_count == 5
        await pilot.press("4")  # failed, timed out, crashed
        await settled(pilot)
        assert column(table, "status") == ["✗ failed"] * 2
        await pilot.press("5")
        await settled(pilot)
        assert sorted(column(table, "workflow")) == ["quick.echo"] * 3


async def test_the_runs_table_names_the_worker_where_two_or_more_ran_the_page(
    tmp_path: Path,
) -> None:
    # With workers on several machines, which one ran a failing run was the first question,
    # and the runs view had no worker column (the run's own view named it). It shows one when
    # the page's runs name two workers or more; with one, the room stays the error's.
    database = tmp_path / "blok.db"
    ran_by: dict[str, str] = {}
    for n in range(2):  # one engine after the other: each is a worker of its own
        async with Engine(workflows=ALL, database=database) as worker:
            run = await worker.wait_for_job(await worker.enqueue("quick", {"n": n}), timeout=10)
            assert run.worker is not None
            ran_by[f'"n": {n}'] = run.worker
    assert len(set(ran_by.values())) == 2, ran_by
    async with Engine(database=database) as client:
        app = BlokApp(client)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            await command(pilot, "runs")
            table = app.screen.query_one("#runs", RowTable)
            shown = [c.key for c, _ in table.fit_columns(table.size.width)]
            assert "worker" in shown, shown
            inputs = column(table, "detail")
            workers = [next(w for i, w in ran_by.items() if i in row) for row in inputs]
            assert column(table, "worker") == workers, (inputs, workers)
            await pilot.press("slash", *'"n": 1')  # a page of one worker's runs
            await settled(pilot)
            assert table.row_count == 1
            assert "worker" not in [c.key for c, _ in table.fit_columns(table.size.width)]


def test_a_worker_is_named_as_short_as_tells_the_pages_workers_apart() -> None:
    one_host = ["vm:5212:560864", "vm:5230:0a1b2c"]
    assert worker_labels(one_host) == dict(zip(one_host, ["5212", "5230"], strict=True))
    hosts = ["web-1:5212:560864", "web-2:5212:0a1b2c"]
    assert worker_labels(hosts) == dict(zip(hosts, ["web-1:5212", "web-2:5212"], strict=True))
    one_process = ["vm:5212:560864", "vm:5212:0a1b2c"]  # two engines in one process
    assert worker_labels(one_process) == {w: w for w in one_process}
    assert worker_labels(["vm:5212:560864", "made by hand"]) == {
        "vm:5212:560864": "vm:5212:560864",
        "made by hand": "made by hand",
    }


async def test_open_a_run_and_see_its_attempts(engine: Engine) -> None:
    job_id = await engine.enqueue("flaky", {"order_id": "F1"})
    run = await engine.wait_for_job(job_id, timeout=10)
    assert run.status == "completed"
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs flaky")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RunScreen))
        await settled(pilot)
        screen = app.screen
        rail = screen.query_one(StepRail)
        assert rail.option_count == 2
        rail.highlighted = 0
        await pilot.pause()
        attempts = text_of(screen.query_one(AttemptsView))
        assert "1/3" in attempts and "2/3" in attempts
        assert "upstream reset the connection" in attempts
        assert "retry in 20ms" in attempts
        assert "ConnectionError" in attempts  # the traceback of the failed attempt


def test_the_rail_counts_attempts_made_not_a_budget_untouched() -> None:
    """ "1/4" on the rail is attempts made of the budget. A step with none made (cached,
    skipped, not reached yet) shows no count: "0/4" read as four failures to come."""
    now = datetime.now(UTC)
    attempt = Attempt(number=1, status="completed", started_at=now, finished_at=now)
    made = StepRun(
        index=0,
        name="charge",
        status=StepStatus.COMPLETED,
        started_at=now,
        finished_at=now,
        max_attempts=4,
        attempts=[attempt],
    )
    cached = StepRun(
        index=0,
        name="charge",
        status=StepStatus.CACHED,
        started_at=now,
        finished_at=now,
        max_attempts=4,
        cached_from="run_0a0b0c0d",
    )
    pending = StepRun(index=1, name="notify", max_attempts=4)
    assert "1/4" in step_line(made, 1.0, now, UTC).plain
    for untouched in (cached, pending):
        assert "/4" not in step_line(untouched, 1.0, now, UTC).plain


async def test_requeue_a_dead_letter_from_the_dead_letter_view(engine: Engine) -> None:
    job_id = await engine.enqueue("doomed", {"order_id": "D1"})
    first = await engine.wait_for_job(job_id, timeout=10)
    assert [j.id for j in await engine.dead_letters("doomed")] == [job_id]
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "dlq doomed")
        table = app.screen.query_one("#dead", RowTable)
        assert table.keys == [job_id]
        await pilot.press("r")
        # Back in the queue with a fresh run, which fails again and dead-letters again.
        with anyio.fail_after(10):
            while (await engine.get_job(job_id)).run_id == first.id:
                await pilot.pause(0.02)
        again = await engine.wait_for_job(job_id, timeout=10)
        assert again.id != first.id and again.status == "failed"


async def test_pause_and_resume_a_queue_from_the_queues_view(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        table = app.screen.query_one("#queues", RowTable)
        table.move_cursor(table.keys.index("quick"))
        await pilot.press("p")
        await settled(pilot)
        assert {q.name: q.paused for q in await engine.queues()}["quick"] is True
        await until(pilot, lambda: "paused" in str(table.cell("quick", "queue")))
        await pilot.press("p")
        await settled(pilot)
        assert {q.name: q.paused for q in await engine.queues()}["quick"] is False


async def test_unknown_command_says_what_exists(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "frobnicate")
        messages = [n.message for n in app._notifications]
        assert any("unknown command :frobnicate" in m and ":runs" in m for m in messages)


async def test_the_palette_offers_the_views_actions_and_one_entry_per_queue(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs")
        provider = ActionCommands(app.screen)
        # Each entry shows its key: the palette teaches the shortcut for next time.
        shown = [str(hit.prompt) async for hit in provider.search("cancel")]
        assert "Cancel the selected run  c" in shown
        titles = [str(hit.text) async for hit in provider.discover()]
        assert len(titles) == len(set(titles)), "an entry is listed twice"
        titles = [str(hit.text) async for hit in provider.search("dead letters")]
        assert {f"Dead letters of {q}" for q in ("slow", "flaky", "broken", "quick")} <= set(titles)
        # Choosing an entry runs it: here, the runs of one queue.
        hits = [h async for h in provider.search("Runs on quick")]
        next(h for h in hits if h.text == "Runs on quick").command()
        await settled(pilot)
        assert isinstance(app.screen, RunsScreen) and app.screen.queue == "quick"


async def test_runs_and_logs_arrive_live_without_a_key_press(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs")
        table = app.screen.query_one("#runs", RowTable)
        assert table.row_count == 0
        job_id = await engine.enqueue("quick", {"n": 1})
        run = await engine.wait_for_job(job_id, timeout=10)
        await until(pilot, lambda: column(table, "status") == ["✓ completed"])
        assert table.keys == [run.id]
        # A run view follows its run: the log line of a step in flight shows up by itself.
        slow_id = await _running(engine, "slow")
        await command(pilot, f"run {slow_id}")
        log = app.screen.query_one("#step-log", Static)
        await until(pilot, lambda: "started sleeping for S1" in text_of(log))
        await engine.cancel(slow_id)


async def test_q_with_runs_in_flight_asks_first(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await pilot.press("q")  # nothing running: it quits at once
        await until(pilot, lambda: not app.is_running)
    run_id = await _running(engine, "slow")
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "Quit while 1 run is running?" in text_of(app.screen.query_one(".question", Static))
        assert "go on from there" in text_of(app.screen.query_one(".detail", Static))
        await pilot.press("n")  # kept: the console goes on
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert app.is_running
        await command(pilot, "q")  # :q asks too
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: not app.is_running)
    assert (await engine.get_run(run_id)).status == "running"  # quitting the app alone


async def test_the_clock_ticking_while_the_app_closes_is_harmless(engine: Engine) -> None:
    # The app's clock (once a second) and the change feed tell the topmost view. While the app
    # closes, the views' widgets are removed first: a tick then (a run view showing a running
    # run redraws its durations) found no widgets and failed the app, at random, on quitting.
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        slow_id = await _running(engine, "slow")
        await command(pilot, f"run {slow_id}")
        await until(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.run is not None)
        closing = asyncio.ensure_future(app._shutdown())
        while not closing.done():
            await app._tick()
            app._changes.everything = True  # as after lost events: every view re-reads
            await app._flush_changes()
            await asyncio.sleep(0)
        await closing
        await engine.cancel(slow_id)


async def test_the_queues_view_reads_the_failures_again_on_a_change_not_each_second(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each second's tick read the 40 newest failed runs whole: with errors that quoted a
    # response body, 25 MB a run, the idle console used a third of a core.
    from blok_tui.queues_screen import FAILURES_READ

    reads: list[int] = []
    runs = engine.runs

    async def counted(*args: object, **kwargs: object) -> object:
        reads.append(kwargs.get("limit") == FAILURES_READ)
        return await runs(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "runs", counted)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        before = reads.count(True)
        for _ in range(5):
            await app._tick()
            await settled(pilot)
        assert reads.count(True) == before
        run = await engine.wait_for_job(await engine.enqueue("broken", {}), timeout=10)
        failures = app.screen.query_one("#failures", Static)
        await until(pilot, lambda: run.id[4:12] in text_of(failures))  # told by its events
        assert reads.count(True) > before
