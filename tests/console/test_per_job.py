"""Failures per job, not per run (issue 18, item 4), the inject template from the queue's
workflow (item 7), and what a person met in the views: keys that apply, a reason said once,
times in the console's clock, a not-started run's input. Over a real engine on a real SQLite
file, driven with Textual's pilot."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from support import expect_events
from textual.pilot import Pilot
from textual.widgets import Select, Static, TextArea

from blok_tui.app import BlokApp
from blok_tui.confirm_screen import ConfirmScreen
from blok_tui.console import countdown, short_ids
from blok_tui.dead_letters_screen import DeadLettersScreen
from blok_tui.inject_screen import InjectScreen
from blok_tui.jobs import JobBook
from blok_tui.payload_template import body_template
from blok_tui.plain_text import one_line_keeping_where
from blok_tui.queues_screen import QueuesScreen, job_note
from blok_tui.run_screen import RunScreen
from blok_tui.runs_screen import RunsScreen
from blok_tui.widgets import Crumbs
from blok_tui.widgets.key_bar import KeyBar
from blok_tui.widgets.row_table import RowTable
from engine import (
    Engine,
    Job,
    JobState,
    RateLimit,
    Run,
    RunStatus,
    Step,
    WorkerTrigger,
    Workflow,
    wait,
)
from engine.events import StepStarted
from engine.ledger import make_job, make_run
from engine.records import assign

from . import scene
from .flows import ALL
from .helpers import column, command, settled, shown_lines, text_of, until

pytestmark = pytest.mark.anyio
SIZE = (140, 40)
ISO = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}")


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    async with Engine(workflows=ALL, database=tmp_path / "blok.db", grace_period=0.5) as engine:
        yield engine


async def _recovered(engine: Engine) -> tuple[str, str]:
    """A job whose first delivery failed and whose second completed: (failed run, later run)."""
    job_id = await engine.enqueue("recovers", {"url": "https://hooks.example.com/1"})
    later = await engine.wait_for_job(job_id, timeout=10)
    assert later.status == "completed" and later.job_attempt == 2
    [failed] = [
        r for r in await engine.runs(queue="recovers", status="failed") if r.job_id == job_id
    ]
    return failed.id, later.id


async def _dead(engine: Engine, n: int) -> list[str]:
    """`n` dead jobs of the doomed queue, each failed twice (retries=1)."""
    jobs = [await engine.enqueue("doomed", {"order_id": f"D{k}"}) for k in range(n)]
    for job_id in jobs:
        await engine.wait_for_job(job_id, timeout=10)
    return jobs


def _keys(app: BlokApp) -> str:
    bar = app.screen.query_one(KeyBar)
    return " ".join(f"{key} {label}" for key, label, _ in bar.keys)


# ---- a failed run whose job went on -----------------------------------------------------------
async def test_a_failed_run_whose_job_completed_later_says_so_and_J_opens_that_run(
    engine: Engine,
) -> None:
    failed, later = await _recovered(engine)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs failed")
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        table = screen.query_one("#runs", RowTable)
        assert table.keys == [failed]
        assert "then" in table.shown_columns
        assert column(table, "then") == ["↻ completed"]
        preview = text_of(screen.query_one("#preview", Static))
        assert "↻ then completed: its job went on to delivery 2 of 3" in preview
        await pilot.press("J")
        await until(pilot, lambda: isinstance(app.screen, RunScreen))
        assert app.screen.run_id == later
        # The failed run's own view says it too, and J goes the same way.
        await command(pilot, f"run {failed}")
        header = text_of(app.screen.query_one("#run-header", Static))
        short = short_ids([failed, later])  # the later run by its short id, as everywhere
        assert "delivery 1 of 3" in header
        assert f"↻ then completed: its job went on to delivery 2 of 3 ({short[later]})" in header
        assert "J later run" in _keys(app)
        await pilot.press("J")
        await until(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.run_id == later)


async def test_a_failed_runs_then_follows_its_job_to_the_end_of_its_next_delivery(
    tmp_path: Path,
) -> None:
    # The console keeps a going job's record 2 s. A job's next delivery that ended within
    # them left its failed run saying "↻ retrying" until something else moved (a crashed run
    # on PostgreSQL still said so 13 s after its redelivery completed). A run's events name
    # its job now, and the console reads the job again. The clock stands still here: only
    # the events can tell it.
    release = anyio.Event()

    async def second_time_lucky(ctx: Any) -> str:
        if ctx.job.attempt == 1:
            raise ConnectionError("connection reset")
        await release.wait()
        return "sent"

    hook = Workflow(
        name="hook",
        trigger=WorkerTrigger(queue="hook", retries=1, delay=10),
        steps=[Step("send", second_time_lucky)],
    )
    async with Engine(workflows=[hook], database=tmp_path / "blok.db") as engine:
        job_id = await engine.enqueue("hook", {})
        app = BlokApp(engine)
        app.jobs = JobBook(clock=lambda: 0.0)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            await command(pilot, "runs failed")
            table = app.screen.query_one("#runs", RowTable)
            await until(pilot, lambda: column(table, "then") == ["↻ retrying"])
            release.set()
            assert (await engine.wait_for_job(job_id, timeout=10)).status == "completed"
            await until(pilot, lambda: column(table, "then") == ["↻ completed"])


async def test_the_then_column_shows_only_when_a_run_on_the_page_has_it(engine: Engine) -> None:
    await engine.wait_for_job(await engine.enqueue("quick", {"n": 1}), timeout=10)
    app = BlokApp(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await settled(pilot)
        await command(pilot, "runs")
        table = app.screen.query_one("#runs", RowTable)
        # Nothing was retried: the column's room goes to the others.
        assert "then" not in table.shown_columns and "replay of" not in table.shown_columns
        assert "attempts" in table.shown_columns
        await _recovered(engine)
        await until(pilot, lambda: "then" in table.shown_columns)
        # At 80 columns it stays, with status and id.
        assert {"status", "then", "run"} <= set(table.shown_columns)


async def test_the_attempts_column_lines_up_its_three_fields(engine: Engine) -> None:
    # "4 3✗ j3" over "1", each right-aligned as a whole: the counts did not line up.
    failed, later = await _recovered(engine)
    await engine.wait_for_job(await engine.enqueue("quick", {"n": 1}), timeout=10)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs")
        table = app.screen.query_one("#runs", RowTable)
        await until(pilot, lambda: table.row_count == 3)
        cells = dict(zip(table.keys, column(table, "attempts"), strict=True))
        assert len(set(map(len, cells.values()))) == 1, cells  # one width: fields line up
        assert [cell.split() for cell in cells.values()].count(["1"]) == 1  # the quick run
        assert cells[later].split() == ["1", "j2"] and cells[failed].split()[1].endswith("✗")
        # Each field in its place: the attempts, then the failed ones, then the delivery.
        assert cells[later].index("1") == cells[failed].index(cells[failed].split()[0])


async def test_redraws_do_not_read_the_jobs_again(engine: Engine) -> None:
    await _recovered(engine)
    await _dead(engine, 2)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs failed")
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        read = app.jobs.reads
        assert read == 1  # the three jobs, read at once
        for _ in range(5):
            screen.request_reload()
            await settled(pilot)
        assert app.jobs.reads == read


async def test_a_page_of_running_and_failed_runs_reads_their_jobs_at_once(engine: Engine) -> None:
    """The `then` column (failed runs) and `⚠ orphaned` (running runs) both need each run's
    job: one read for the page, not one per run nor one per column."""
    await _dead(engine, 2)
    async with expect_events(engine, StepStarted, 2):  # both running before the page loads
        for k in range(2):
            await engine.enqueue("slow", {"order_id": f"S{k}"})
    app = BlokApp(engine)
    # The clock stands still: a running job is kept 2 s (KEEP_GOING), and in a slow hour the
    # page's refresh came later than that and read the running jobs again, as it should.
    app.jobs = JobBook(clock=lambda: 0.0)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        app.jobs.forget()  # the queues view read the failed runs' jobs already
        read = app.jobs.reads
        await command(pilot, "runs")
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        table = screen.query_one("#runs", RowTable)
        await settled(pilot)
        assert column(table, "status").count("▶ running") == 2
        assert len(table.keys) == 6  # 4 failed runs of 2 dead jobs, 2 running
        assert app.jobs.reads == read + 1


async def test_a_dead_jobs_last_run_says_dead_letter_where_its_earlier_say_then(
    engine: Engine,
) -> None:
    # Its earlier delivery read "↻ dead"; its last run, the row acted on, had a blank "then".
    dead, discarded = await _dead(engine, 2)
    await engine.discard(discarded)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs failed")
        table = app.screen.query_one("#runs", RowTable)
        await until(pilot, lambda: len(table.keys) == 4)
        then = dict(zip(table.keys, column(table, "then"), strict=True))
        for job_id, last in ((dead, "dead letter"), (discarded, "discarded")):
            newest = (await engine.get_job(job_id)).run_id
            earlier = [r.id for r in await engine.runs(status="failed") if r.job_id == job_id]
            earlier.remove(newest)
            assert (then[newest], then[earlier[0]]) == (last, f"↻ {last.split()[0]}"), then


# ---- bulk actions act once per job --------------------------------------------------------------
async def test_replaying_every_failed_run_replays_each_dead_job_once(engine: Engine) -> None:
    jobs = await _dead(engine, 3)  # six failed runs: two deliveries each
    await _recovered(engine)  # one failed run whose job completed later
    # Discarded: "it never runs again" (a bulk replay ran it all the same).
    discarded = jobs.pop()
    await engine.discard(discarded)
    newest = {}
    for run in await engine.runs(status="failed", queue="doomed", limit=10):
        if run.job_id != discarded:
            newest.setdefault(run.job_id, run.id)  # newest first
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs failed")
        assert len(app.screen.query_one("#runs", RowTable).keys) == 7
        await pilot.press("R")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        confirm = app.screen
        assert text_of(confirm.query_one(".question", Static)).strip() == "Replay 2 runs?"
        detail = " ".join(text_of(confirm.query_one(".detail", Static)).split())
        assert "7 runs of 4 jobs, each job once (its newest run)." in detail
        assert "Left out, by job: 1 " in detail
        assert "1 completed on a later delivery" in detail and "1 discarded" in detail
        # Replayed, the dead letters stay in their queue (a requeue later runs them again).
        assert "2 are dead letters, and stay in the dead-letter queue once replayed." in detail
        await pilot.press("y")
        await until(pilot, lambda: app.last_bulk is not None)
        assert set(app.last_bulk.replayed) == set(newest.values())
    replays = [r for r in await engine.runs(limit=50) if r.replay_of]
    assert {r.job_id for r in replays} and len({r.replay_of for r in replays}) == 2
    assert {(await engine.get_run(r.replay_of)).job_id for r in replays} == set(jobs)


async def test_a_bulk_key_pressed_again_while_planning_plans_nothing_more(engine: Engine) -> None:
    await _dead(engine, 1)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs failed")
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        screen.planning = True  # as while 10,000 runs and their jobs are read
        await pilot.press("R")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        assert any("still reading the runs" in n.message for n in app._notifications)
        screen.planning = False
        await pilot.press("R")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))


async def test_requeue_of_marked_runs_takes_each_dead_job_once_and_states_its_budget(
    engine: Engine,
) -> None:
    [job_id] = await _dead(engine, 1)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs doomed")
        await pilot.press("space", "space")  # both deliveries of the one dead job
        await pilot.press("D")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        confirm = app.screen
        assert text_of(confirm.query_one(".question", Static)).strip() == "Requeue 1 dead job?"
        detail = " ".join(text_of(confirm.query_one(".detail", Static)).split())
        assert "2 runs of 1 job, each job once" in detail
        assert "its retry budget again: 1 retry (up to 2 deliveries)." in detail
        await pilot.press("y")
        await until(pilot, lambda: app.last_bulk is not None)
        assert app.last_bulk.ids == [job_id]
        assert app.last_bulk.skipped == 0


async def test_requeue_from_the_dead_letters_says_the_budget_it_gives(engine: Engine) -> None:
    [job_id] = await _dead(engine, 1)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "dlq doomed")
        assert isinstance(app.screen, DeadLettersScreen)
        await pilot.press("r")
        await until(pilot, lambda: any(n.title == "Requeued" for n in app._notifications))
        [note] = [n.message for n in app._notifications if n.title == "Requeued"]
        assert note == (
            f"job {job_id} is back on doomed with a fresh run and 1 retry (up to 2 deliveries)"
        )
        # On a paused queue it is said, or it looked requeued and then nothing ran.
        await engine.wait_for_job(job_id, timeout=10)  # dead again: its input is as bad
        [other] = await _dead(engine, 1)  # the newest dead letter: the one selected
        await engine.pause("doomed")
        await pilot.press("escape")
        await command(pilot, "dlq doomed")
        screen = app.screen
        assert isinstance(screen, DeadLettersScreen)
        await until(pilot, lambda: screen.selected_job_id() == other)
        await pilot.press("r")
        await until(pilot, lambda: other in "".join(n.message for n in app._notifications))
        [note] = [n.message for n in app._notifications if other in n.message]
        assert note.endswith(
            "; the queue is paused: nothing runs until it is resumed (:resume doomed)"
        ), note
        await engine.resume("doomed")


async def test_recent_failures_are_one_line_per_job(engine: Engine) -> None:
    await _dead(engine, 1)
    await _recovered(engine)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        assert isinstance(app.screen, QueuesScreen)
        lines = text_of(app.screen.query_one("#failures", Static), 200).splitlines()
        failures = [line for line in lines if "✗" in line]
        assert len(failures) == 2, lines  # three failed runs, two jobs
        assert "doomed.retry" in failures[1] and "2 deliveries, dead" in failures[1]
        assert "recovers.hook" in failures[0] and "↻ completed" in failures[0]


async def test_recent_failures_line_up_whatever_their_ids_lengths(engine: Engine) -> None:
    """Each failure's id is as short as it can be and still tell it apart (`short_ids`), so
    the ids differ in length; what follows them starts in one column all the same."""
    [job_id] = await _dead(engine, 1)
    dead = await engine.wait_for_job(job_id, timeout=10)
    assert dead.error
    # Three ids: two alike for twelve characters (shown with thirteen), one alike for none.
    ids = ["run_0a0b0c0d0e0f1", "run_0a0b0c0d0e0f2", "run_9f9f9f9f9f9f9"]
    runs = [dead.model_copy(update={"id": run_id}) for run_id in ids]
    assert {len(short) for short in short_ids(ids).values()} == {8, 13}
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        assert isinstance(app.screen, QueuesScreen)
        app.screen.render_failures(runs, {})
        lines = text_of(app.screen.query_one("#failures", Static), 200).splitlines()
        opening = one_line_keeping_where(dead.error, 200)[:20]  # as a list shows it
        errors = [line.index(opening) for line in lines if "✗" in line]
        assert len(errors) == 3 and len(set(errors)) == 1, lines


# ---- a run's replays, per job --------------------------------------------------------------------
async def test_the_run_view_names_its_replay_once_per_replay_job(engine: Engine) -> None:
    [job_id] = await _dead(engine, 1)
    source = await engine.wait_for_job(job_id, timeout=10)
    assert source.job_attempt == 2
    replay = await engine.replay(source.id)
    # The replay is a doomed job too: two deliveries, two runs with replay_of set.
    await engine.wait_for_job((await engine.get_run(replay)).job_id, timeout=10)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, f"run {source.id}")
        header = text_of(app.screen.query_one("#run-header", Static))
        assert "delivery 2 of 2  dead letter" in header  # its job's last delivery
        assert "⟲ replayed as run" in header and "more" not in header
        await pilot.press("J")
        await until(pilot, lambda: app.screen.run_id != source.id)
        assert (await engine.get_run(app.screen.run_id)).replay_of == source.id


# ---- the footer offers the keys that apply ---------------------------------------------------------
async def test_the_run_views_footer_offers_only_the_keys_that_apply(engine: Engine) -> None:
    done = await engine.wait_for_job(await engine.enqueue("quick", {"n": 1}), timeout=10)
    events = engine.events()
    slow = await engine.enqueue("slow", {"order_id": "S1"})
    async for event in events:
        if getattr(event, "queue", None) == "slow" and type(event).__name__ == "RunStarted":
            break
    await events.aclose()
    app = BlokApp(engine)
    async with app.run_test(size=(200, 40)) as pilot:
        await settled(pilot)
        await command(pilot, f"run {done.id}")
        keys = _keys(app)
        assert "r replay" in keys and "f from step" in keys
        for absent in ("c cancel", "D diff", "o source", "s send event", "h holder", "p parent"):
            assert absent not in keys, keys
        assert "enter child run" not in keys
        await command(pilot, f"run {(await engine.get_job(slow)).run_id}")
        keys = _keys(app)
        assert "c cancel" in keys
        assert "r replay" not in keys and "f from step" not in keys


# ---- a throttled run: the reason once, in the console's clock, and its input --------------------
LIMITED = Workflow(
    name="api.calls",
    trigger=WorkerTrigger(queue="calls", rate_limit=RateLimit(limit=1, period="1m")),
    steps=[Step("call", lambda ctx: {"ok": True})],
)


async def test_a_throttled_run_says_why_once_in_local_time_and_shows_its_input() -> None:
    async with Engine(workflows=[LIMITED]) as engine:
        first = await engine.enqueue("calls", {"n": 1})
        second = await engine.enqueue("calls", {"n": 2, "customer": "acme"})
        await engine.wait_for_job(first, timeout=10)
        with anyio.fail_after(10):
            while True:
                run = await engine.get_run((await engine.get_job(second)).run_id)
                if run.status is RunStatus.THROTTLED:
                    break
                await anyio.sleep(0.02)
        app = BlokApp(engine)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            await command(pilot, f"run {run.id}")
            screen = app.screen
            header = text_of(screen.query_one("#run-header", Static))
            why = text_of(screen.query_one("#why", Static))
            log = text_of(screen.query_one("#run-log", Static))
            # The rate limit's words are in the panel, not again in the header.
            assert "runs started in the" in why and "runs started in the" not in header
            assert "[rate limit] 1/1 runs" in why  # the tag is not repeated either
            for shown in (header, why, log):
                assert not ISO.search(shown), shown
            # No steps until a worker starts it: its input is what there is to see.
            assert text_of(screen.query_one("#steps-title", Static)).strip() == "steps: not started"
            shown_input = text_of(screen.query_one("#step-input"))
            assert json.loads(shown_input) == {"n": 2, "customer": "acme"}
        await engine.cancel(run.id)


# ---- an event wait says what it waits for, and its deadline is a timeout ---------------------------
APPROVAL = Workflow(
    name="orders.approval",
    trigger=WorkerTrigger(queue="approvals"),
    steps=[wait.for_event("approved", timeout="1h", match="$.body.order_id", name="approval")],
)


async def test_an_event_waits_step_says_it_times_out_not_that_it_resumes() -> None:
    async with Engine(workflows=[APPROVAL]) as engine:
        job_id = await engine.enqueue("approvals", {"order_id": "A7"})
        with anyio.fail_after(10):
            while True:
                run = await engine.get_run((await engine.get_job(job_id)).run_id)
                if run.status is RunStatus.WAITING:
                    break
                await anyio.sleep(0.02)
        app = BlokApp(engine)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            await command(pilot, f"run {run.id}")
            title = text_of(app.screen.query_one("#step-title", Static))
            assert "✉ waits for event 'approved' with key 'A7'; times out at" in title
            assert "resumes" not in title
            attempts = text_of(app.screen.query_one("#attempts", Static))
            assert attempts.strip() == "waits for an event: no attempts"
            assert "s send event" in _keys(app)
        await engine.cancel(run.id)


def test_a_countdown_counts_whole_seconds() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert countdown(now + timedelta(seconds=18.2), now) == "in 19s"
    assert countdown(now + timedelta(seconds=0.4), now) == "in <1s"
    assert countdown(now + timedelta(seconds=61), now) == "in 1m01s"
    assert countdown(now - timedelta(seconds=1), now) == "due now"


# ---- the inject template ---------------------------------------------------------------------------
SIGNUP = Workflow(
    name="accounts.signup",
    trigger=WorkerTrigger(queue="signups"),
    steps=[
        Step(
            "create",
            lambda ctx, email, name: {"ok": True},
            inputs={"email": "$.body.customer.email", "name": "$.body.customer.name"},
        ),
        Step(
            "welcome",
            lambda ctx, sku, plan: {"sent": True},
            inputs={"sku": "$.body.items.0.sku", "plan": "$.body.plan"},
        ),
    ],
)
PLAIN = Workflow(
    name="plain.echo",
    trigger=WorkerTrigger(queue="plain"),
    steps=[Step("echo", lambda ctx: {"echo": ctx.body})],
)


def test_body_fields_become_a_nested_template() -> None:
    fields = ["customer.email", "customer.name", "items.0.sku", "plan", "customer"]
    assert body_template(fields) == {
        "customer": {"email": None, "name": None},
        "items": [{"sku": None}],
        "plan": None,
    }
    assert body_template([]) == {}


async def _inject_modal(app: BlokApp, pilot: Pilot[Any], queue: str) -> InjectScreen:
    app.action_inject(queue)
    await until(pilot, lambda: isinstance(app.screen, InjectScreen))
    await pilot.pause()
    modal = app.screen
    assert isinstance(modal, InjectScreen)
    return modal


async def test_the_inject_template_holds_the_fields_the_queues_workflow_reads(
    tmp_path: Path,
) -> None:
    async with Engine(workflows=[SIGNUP, PLAIN], database=tmp_path / "blok.db") as engine:
        app = BlokApp(engine)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            modal = await _inject_modal(app, pilot, "signups")
            area = modal.query_one(TextArea)
            assert json.loads(area.text) == {
                "customer": {"email": None, "name": None},
                "items": [{"sku": None}],
                "plan": None,
            }
            assert "the fields accounts.signup reads" in str(
                modal.query_one("#payload-label").render()
            )
            assert area.selected_text == "null"  # typing replaces the first blank
            # Another queue, untouched payload: its template instead.
            modal.query_one("#queue", Select).value = "plain"
            await pilot.pause()
            assert area.text == "{}"
            assert "plain.echo reads no $.body field" in str(
                modal.query_one("#payload-label").render()
            )
            # Written by hand: picking a queue keeps it.
            area.text = '{"mine": 1}'
            modal.query_one("#queue", Select).value = "signups"
            await pilot.pause()
            assert area.text == '{"mine": 1}'


async def test_an_attached_console_gets_the_template_from_the_workers_catalog(
    tmp_path: Path,
) -> None:
    database = tmp_path / "blok.db"
    # The worker first, then a console with no workflows of its own on its database.
    async with (
        Engine(workflows=[SIGNUP], database=database),
        Engine(database=database, create=False, follow=True) as client,
    ):
        app = BlokApp(client)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            modal = await _inject_modal(app, pilot, "signups")
            assert json.loads(modal.query_one(TextArea).text)["customer"] == {
                "email": None,
                "name": None,
            }


# ---- a walkthrough: phrases cut by a narrow line, crumbs alike, clocks running on ------------------
async def test_the_run_header_breaks_between_its_phrases_never_inside_one(tmp_path: Path) -> None:
    # At 140 columns a dead letter's header wrapped as "delivery 2 of 2  dead" / " letter".
    app = scene.app(*await scene.build(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, f"run {scene.rid(12)}")  # its job's last delivery: a dead letter
        header = app.screen.query_one("#run-header", Static)
        phrases = (
            "✗ failed",
            "webhooks.deliver @0be61f4a",
            "queue webhooks",
            "delivery 3 of 3",
            "dead letter",
            "took 520ms",
            "attempts 2 (2 failed)",
        )
        for width in range(112, 141, 2):
            await pilot.resize_terminal(width, 40)
            await settled(pilot)
            lines = shown_lines(header)
            for phrase in phrases:
                assert any(phrase in line for line in lines), (width, phrase, lines)


async def test_the_queues_summary_and_the_runs_filter_line_keep_their_phrases_whole(
    tmp_path: Path,
) -> None:
    # At 80x24, after /sh, the queues view's summary ended in "filter:" (its 'sh' wrapped onto
    # a line its height hides); with runs marked, the runs view's ended in "R replay · D".
    app = scene.app(*await scene.build(tmp_path))
    async with app.run_test(size=(80, 24)) as pilot:
        await settled(pilot)
        await pilot.press("slash", "s", "h")
        await settled(pilot)
        [summary] = shown_lines(app.screen.query_one("#summary", Static))
        # Whole phrases; a count of none ("0 delayed") is the first to go.
        assert re.search(r"\d queued · \d running · \d waiting · \d throttled · \d dead", summary)
        assert summary.endswith("dead") or summary.endswith("filter: 'sh'"), summary
        await pilot.press("escape", "escape")
        await command(pilot, "runs failed")
        await pilot.press("space")
        await settled(pilot)
        [filters] = shown_lines(app.screen.query_one("#filters", Static))
        assert "● 1 marked  C cancel · R replay · D requeue · u unmark" in filters, filters
        assert filters.startswith(" status failed"), filters


async def test_the_breadcrumbs_tell_two_deliveries_of_a_job_apart(tmp_path: Path) -> None:
    # Two deliveries of one job, started moments apart, have ids alike for ten characters: from
    # the first, J opened the second, and both crumbs read "run 1a2497ad0".
    folder, database = await scene.build(tmp_path)
    first, second = scene.retried_order()  # one job: delivery 1 failed, delivery 2 completed
    first.id, second.id = "run_1a2497ad091f3c2b7e9d04a15", "run_1a2497ad098a6e0c3b5f17d42"
    first.job_id = second.job_id = "job_1a2497ad0910000000000000a"
    job = Job(
        id=first.job_id,
        queue=first.queue,
        workflow_name=first.workflow_name,
        payload=first.input,
        state=JobState.COMPLETED,
        run_id=second.id,
        created_at=first.created_at,
        finished_at=second.finished_at,
        attempts=2,
        max_retries=1,
    )
    async with Engine(workflows=folder, database=database, consume=False) as engine:
        await engine.backend.queue("sqlite").add([job], [])
        for run in (first, second):
            engine.backend.runs.save_run(run)
        await engine.backend.runs.flush()
    app = scene.app(folder, database)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, f"run {first.id}")
        await pilot.press("J")  # its job's later delivery
        await until(pilot, lambda: getattr(app.screen, "run_id", None) == second.id)
        await settled(pilot)
        [crumbs] = shown_lines(app.screen.query_one(Crumbs))
        assert "›  run 1a2497ad091  ›  run 1a2497ad098 #2  " in crumbs, crumbs
        await pilot.press("escape")
        await settled(pilot)
        [crumbs] = shown_lines(app.screen.query_one(Crumbs))
        assert "›  run 1a2497ad0  " in crumbs, crumbs  # alone again: as short as ever


async def test_a_run_a_stop_sent_back_to_the_queue_shows_the_time_it_ran(tmp_path: Path) -> None:
    # Back to queued, still naming its worker, with no end: its took in the runs view and the
    # run view, and its step's on the rail and the timeline, ran on while nobody ran it.
    database = tmp_path / "blok.db"
    async with Engine(workflows=ALL, database=database, grace_period=0.2) as worker:
        job_id = await worker.enqueue("slow", {"order_id": "S9"})
        with anyio.fail_after(10):
            while True:
                run = await worker.get_run((await worker.get_job(job_id)).run_id)
                if run.steps and str(run.steps[0].status) == "running":
                    break
                await anyio.sleep(0.02)
    async with Engine(database=database, create=False) as engine:  # nobody runs it now
        run = await engine.get_run(run.id)
        assert run.status is RunStatus.QUEUED and run.started_at and not run.finished_at
        an_hour_on = engine.now() + timedelta(hours=1)
        app = BlokApp(engine, clock=lambda: an_hour_on)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            await command(pilot, "runs queued")
            table = app.screen.query_one("#runs", RowTable)
            assert column(table, "took") == ["–"]  # a listing has no steps to tell
            await command(pilot, f"run {run.id}")
            header = "\n".join(shown_lines(app.screen.query_one("#run-header", Static)))
            assert re.search(r"\bran \d+(ms|\.\ds)\b", header), header
            [rail] = [line for line in shown_lines(app.screen.query_one("#rail")) if line]
            await pilot.press("T")  # the timeline
            await until(pilot, lambda: bool(app.screen.query("#timeline")))
            await settled(pilot)
            timeline = shown_lines(app.screen.query_one("#timeline", Static))
            [row] = [line for line in timeline if line.lstrip().startswith("sleep")]
            # The step ran a moment (its axis spans the hour since: the run is still queued).
            for shown in (header, rail, row):
                assert re.search(r"\b\d+(ms|\.\ds)\b", shown), shown
                assert not re.search(r"\b(1h|59m)", shown), shown


async def test_the_queues_view_says_where_failures_out_of_retries_went(engine: Engine) -> None:
    # A queue whose runs all failed and went to the dead-letter queue read "failed ·" while
    # "recent failures" listed them right below.
    await _dead(engine, 2)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        screen = app.screen
        assert isinstance(screen, QueuesScreen)
        table = screen.query_one("#queues", RowTable)
        assert (str(table.cell("doomed", "failed")), str(table.cell("doomed", "dead"))) == (
            "·",
            "2",
        )
        [title] = shown_lines(screen.query_one("#failures-title", Static))
        assert (
            title == " recent failures   out of retries: counted as dead, not failed · d lists them"
        )
        # Where the table narrows, dead stays longer than failed (and completed): no "failed ·"
        # next to nothing at 50 columns.
        for width in (80, 64, 50, 42):
            await pilot.resize_terminal(width, 40)
            await settled(pilot)
            assert "dead" in table.shown_columns, (width, table.shown_columns)


def _job_with_one_retry() -> tuple[Job, Run]:
    job = make_job(
        queue="q",
        workflow_name="w",
        payload={},
        headers=None,
        priority=0,
        run_at=None,
        max_retries=1,
        job_id="job_1",
    )
    return job, make_run(job, workflow_version="v1")


def test_a_failures_deliveries_are_counted_as_show_counts_them() -> None:
    """The recent failures said "3 deliveries" of a job `show` called "delivery 1 of 2": the
    claims a gate (or a worker without the run's version) held back are not deliveries."""
    job, run = _job_with_one_retry()
    assign(job, state=JobState.DEAD, attempts=3, meta={"held": 2})
    assert job_note(run, job).plain == "dead  "
    assign(job, meta={"held": 1})
    assert job_note(run, job).plain == "2 deliveries, dead  "


async def test_the_run_header_counts_a_jobs_deliveries_as_show_does(tmp_path: Path) -> None:
    # A job whose first run crashed (a crash spends no retry): the header said "delivery 2 of
    # 2" where `show` said "delivery 2 of 3".
    job, run = _job_with_one_retry()
    assign(job, state=JobState.ACTIVE, attempts=2, meta={"crashes": 1})
    run.job_attempt = 2
    async with Engine(database=tmp_path / "blok.db") as engine:
        app = BlokApp(engine)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            screen = RunScreen(run.id)
            screen.job = job
            header = "".join(phrase.text.plain for phrase in screen.what_phrases(run))
    assert "delivery 2 of 3" in header, header
    assert job.delivery_budget == 3  # what `show` says (blok_tui/run_text.py)
