"""Operator power tools in the console (issues 8 and 9), driven by keys over a real engine on a
real SQLite file: bulk actions on a filter or on marked rows, replay from a step, edit and
replay, retry now, the retrying filter, and opening a subworkflow's child run."""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import anyio
import pytest
from support import expect_events, raised_at
from textual.widgets import Button, Static, TextArea

from blok_tui import dead_letters_screen
from blok_tui.actions import RUN_FLAGS, ActionCommands
from blok_tui.app import BlokApp
from blok_tui.confirm_screen import ConfirmScreen
from blok_tui.console import clock_time, short_ids
from blok_tui.inject_screen import InjectScreen
from blok_tui.run_screen import RunScreen
from blok_tui.runs_screen import MARK, RunsScreen
from blok_tui.widgets import BulkBar, StepRail
from blok_tui.widgets.row_table import RowTable
from blok_tui.workers_screen import WorkersScreen
from engine import (
    Engine,
    JobState,
    RateLimit,
    RunFilter,
    RunStarted,
    RunStatus,
    RunStatusChanged,
    Step,
    StepStarted,
    WorkerInfo,
    WorkerTrigger,
    Workflow,
)
from engine.events import AttemptFailed
from engine.liveness import process_of, this_process

from .flows import ALL, sleep_long
from .helpers import column, command, settled, shown_lines, text_of, until

pytestmark = pytest.mark.anyio
SIZE = (150, 45)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    async with Engine(workflows=ALL, database=tmp_path / "blok.db", grace_period=0.5) as engine:
        yield engine


async def _started(events, queue: str, count: int) -> None:
    """Until `count` runs on `queue` have started (events subscribed before enqueueing)."""
    with anyio.fail_after(10):
        seen = 0
        async for event in events:
            if isinstance(event, RunStarted) and event.queue == queue:
                seen += 1
                if seen == count:
                    break
    await events.aclose()


async def _doomed(engine: Engine, n: int = 3) -> list[str]:
    """`n` dead letters on the queue doomed, oldest first (one enqueue each: ids in order)."""
    jobs = [await engine.enqueue("doomed", {"order_id": f"D{n}"}) for n in range(n)]
    for job_id in jobs:
        await engine.wait_for_job(job_id, timeout=10)
    return jobs


async def _dead_letter_view(pilot, app: BlokApp, rows: int) -> RowTable:
    """The dead-letter view of the queue doomed, once it lists `rows` jobs."""
    await settled(pilot)
    await command(pilot, "dlq doomed")
    table = app.screen.query_one("#dead", RowTable)
    await until(pilot, lambda: table.row_count == rows)
    return table


async def _confirm(pilot, app: BlokApp, question: str) -> None:
    await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
    assert text_of(app.screen.query_one(".question", Static)).strip() == question
    await pilot.press("y")
    await until(pilot, lambda: app.last_bulk is not None)
    await settled(pilot)


async def test_bulk_cancel_of_a_filtered_set_cancels_exactly_those_runs(engine: Engine) -> None:
    events = engine.events()
    slow = [await engine.enqueue("slow", {"order_id": f"S{n}"}) for n in range(3)]
    await _started(events, "slow", 2)
    quick = [await engine.enqueue("quick", {"n": n}) for n in range(2)]
    for job_id in quick:
        await engine.wait_for_job(job_id, timeout=10)
    slow_runs = {(await engine.get_job(j)).run_id for j in slow}
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs slow")  # two running (concurrency 2), one queued
        table = app.screen.query_one("#runs", RowTable)
        assert set(table.keys) == slow_runs
        await pilot.press("C")
        await _confirm(pilot, app, "Cancel 3 runs?")
        assert app.last_bulk is not None and sorted(app.last_bulk.ids) == sorted(slow_runs)
        messages = [n.message for n in app._notifications]
        assert any(m.startswith("cancel: 3 of 3") for m in messages), messages
    for run in await engine.runs(limit=20):
        expected = "cancelled" if run.id in slow_runs else "completed"
        assert run.status == expected, run


async def test_marked_rows_are_replayed_and_only_those(engine: Engine) -> None:
    jobs = [await engine.enqueue("quick", {"n": n}) for n in range(3)]
    sources = [await engine.wait_for_job(j, timeout=10) for j in jobs]
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs quick")
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        table = screen.query_one("#runs", RowTable)
        newest_first = table.keys
        await pilot.press("space", "space")  # marks the first row, moves on, marks the second
        await pilot.pause()
        assert column(table, "mark") == [MARK, MARK, " "]
        assert "2 marked" in text_of(screen.query_one("#filters", Static))
        await pilot.press("R")
        await _confirm(pilot, app, "Replay 2 runs?")
        result = app.last_bulk
        assert result is not None and set(result.replayed) == set(newest_first[:2])
        assert screen.marked == {}  # marks are spent by the action
    replays = [r for r in await engine.runs(queue="quick", limit=10) if r.replay_of]
    assert sorted(r.replay_of for r in replays) == sorted(newest_first[:2])
    assert {r.id for r in replays} == set(result.replayed.values())
    assert len(sources) == 3


async def test_bulk_requeue_puts_the_filtered_dead_jobs_back(engine: Engine) -> None:
    jobs = [await engine.enqueue("doomed", {"order_id": f"D{n}"}) for n in range(2)]
    for job_id in jobs:
        await engine.wait_for_job(job_id, timeout=10)
    assert len(await engine.dead_letters("doomed")) == 2
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs doomed")
        await pilot.press("4")  # failed: the last run of each job
        await settled(pilot)
        await pilot.press("D")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: app.last_bulk is not None)
        assert sorted(app.last_bulk.ids) == sorted(jobs)


async def test_replay_from_the_selected_step_reuses_the_earlier_steps(engine: Engine) -> None:
    job_id = await engine.enqueue("fixable", {"order_id": "F9"})
    source = await engine.wait_for_job(job_id, timeout=10)
    assert source.status == "failed"
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, f"run {source.id}")
        screen = app.screen
        assert isinstance(screen, RunScreen)
        assert screen.selected_step() is not None
        assert screen.selected_step().name == "charge"  # the rail starts on the failed step
        await pilot.press("f")
        await until(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen is not screen)
        new_id = app.screen.run_id
    replay = await engine.wait_for_job((await engine.get_run(new_id)).job_id, timeout=10)
    assert replay.replay_of == source.id and replay.replay_from_step == "charge"
    prepared = replay.step("prepare")
    assert prepared.status == "cached" and prepared.cached_from == source.id
    assert prepared.output == source.step("prepare").output
    assert replay.step("charge").attempts  # ran again (and failed again: not fixed yet)


async def test_edit_and_replay_refuses_bad_json_then_replays_the_edited_input(
    engine: Engine,
) -> None:
    job_id = await engine.enqueue("fixable", {"order_id": "F10"})
    source = await engine.wait_for_job(job_id, timeout=10)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, f"run {source.id}")
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, InjectScreen))
        modal = app.screen
        area = modal.query_one(TextArea)
        assert '"order_id": "F10"' in area.text
        area.text = '{"order_id": "F10", "fixed": tru}'
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is modal
        assert "not valid JSON" in text_of(modal.query_one("#problem", Static))
        assert await engine.count_runs() == 1
        area.text = '{"order_id": "F10", "fixed": true}'
        await pilot.press("ctrl+s")
        await until(pilot, lambda: isinstance(app.screen, RunScreen))
        new_id = app.screen.run_id
    replay = await engine.wait_for_job((await engine.get_run(new_id)).job_id, timeout=10)
    assert replay.replay_of == source.id
    assert replay.input == {"order_id": "F10", "fixed": True}
    assert replay.status == "completed"


async def test_retrying_filter_and_retry_now_cut_a_long_backoff(engine: Engine) -> None:
    events = engine.events()
    job_id = await engine.enqueue("patient", {"order_id": "P1"})
    run_id = (await engine.get_job(job_id)).run_id
    with anyio.fail_after(10):  # the first attempt failed; the next one is a minute away
        async for event in events:
            if isinstance(event, AttemptFailed) and event.run_id == run_id:
                break
    await events.aclose()
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs retrying")
        table = app.screen.query_one("#runs", RowTable)
        assert table.keys == [run_id]
        await pilot.press("t")
        with anyio.fail_after(10):
            run = await engine.wait_for_job(job_id, timeout=10)
        assert run.status == "completed"
        assert [a.number for a in run.step("call").attempts] == [1, 2]
        messages = [n.message for n in app._notifications]
        assert any(f"run {run_id} goes ahead now" in m for m in messages), messages


async def test_enter_on_a_subworkflow_step_opens_the_child_run(engine: Engine) -> None:
    job_id = await engine.enqueue("parent", {"items": ["a", "b"]})
    parent = await engine.wait_for_job(job_id, timeout=10)
    assert parent.status == "completed", parent.error
    ships = [s for s in parent.steps if s.name == "ship"]
    assert len(ships) == 2 and all(s.child_run_id for s in ships)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, f"run {parent.id}")
        screen = app.screen
        assert isinstance(screen, RunScreen)
        rail = screen.query_one(StepRail)
        lines = [text_of_prompt(rail, n) for n in range(rail.option_count)]
        assert any("iteration 1" in line for line in lines)
        assert any("iteration 2" in line for line in lines)
        assert sum("↳ sub" in line for line in lines) == 2
        second = ships[1]
        rail.highlighted = rail.option_of(second.index)
        await pilot.pause()
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen is not screen)
        child = app.screen
        assert child.run_id == second.child_run_id
        await settled(pilot)
        header = text_of(child.query_one("#run-header", Static))
        assert f"child of run {parent.id}" in header
        await pilot.press("p")  # and back up to the parent
        await until(pilot, lambda: getattr(app.screen, "run_id", None) == parent.id)


async def test_workers_view_lists_this_engine_as_alive(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        line = text_of(app.screen.query_one("#workers-line", Static))
        assert f"1 alive: {engine.worker.id}" in line
        await command(pilot, "workers")
        assert isinstance(app.screen, WorkersScreen)
        table = app.screen.query_one("#workers", RowTable)
        assert column(table, "worker") == [engine.worker.id]
        assert column(table, "alive") == ["✓ alive"]


async def test_a_workflow_served_at_two_versions_shows_in_the_queues_and_workers_views(
    tmp_path: Path,
) -> None:
    # A deploy half done (one machine on the new files) showed only in `blok-tui health`
    # and the workers' logs: the console said nothing.
    def charge(step: str) -> Workflow:
        return Workflow(
            name="orders.charge",
            trigger=WorkerTrigger(queue="orders"),
            steps=[Step(step, lambda ctx: step)],  # another step: another version
        )

    database = tmp_path / "blok.db"
    old, new = charge("charge_v1"), charge("charge_v2")
    async with Engine(workflows=[old], database=database) as first:
        async with Engine(workflows=[new], database=database) as second:
            app = BlokApp(second)
            async with app.run_test(size=SIZE) as pilot:
                line = app.screen.query_one("#workers-line", Static)
                await until(pilot, lambda: "⚠ orders.charge at 2 versions" in text_of(line))
                await command(pilot, "workers")
                table = app.screen.query_one("#workers", RowTable)
                await until(pilot, lambda: "versions" in table.shown_columns)
                by_worker = dict(
                    zip(column(table, "worker"), column(table, "versions"), strict=True)
                )
                assert by_worker == {
                    first.worker.id: f"orders.charge@{old.version}",
                    second.worker.id: f"orders.charge@{new.version}",
                }
        # One version again: the column goes, and the line says nothing of versions.
        app = BlokApp(first)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            await command(pilot, "workers")
            table = app.screen.query_one("#workers", RowTable)
            await until(pilot, lambda: table.row_count >= 1)
            await settled(pilot)
            assert "versions" not in table.shown_columns


async def test_a_queue_served_with_two_workflows_shows_both_in_the_queues_view(
    tmp_path: Path,
) -> None:
    # Two services that chose one queue name: the queues view named the latest declaration
    # only, and each worker ran only the jobs enqueued for its own, unseen.
    def flow(name: str) -> Workflow:
        return Workflow(
            name=name, trigger=WorkerTrigger(queue="x"), steps=[Step("hi", lambda ctx: name)]
        )

    database = tmp_path / "blok.db"
    async with (
        Engine(workflows=[flow("one")], database=database),
        Engine(workflows=[flow("two")], database=database) as second,
    ):
        app = BlokApp(second)
        async with app.run_test(size=SIZE) as pilot:
            line = app.screen.query_one("#workers-line", Static)
            await until(pilot, lambda: "⚠ queue x serves one and two" in text_of(line))
            table = app.screen.query_one("#queues", RowTable)
            assert column(table, "workflow") == ["one + two"]


async def test_the_console_judges_a_worker_alive_as_recovery_does(engine: Engine) -> None:
    """A worker of this machine is not gone while its process runs, whatever its heartbeat
    says: the rule recovery acts on. Judged by its heartbeat alone, a worker killed a moment ago
    was listed alive (its jobs already given to others) and a busy one whose heartbeat lagged
    was listed stale. The lagging one is stalled: it keeps its jobs, but claims none."""
    async with await anyio.open_process([sys.executable, "-c", "input()"]) as killed:
        process = process_of(killed.pid)
        killed.kill()
        await killed.wait()
    now = engine.now()
    here = socket.gethostname()
    rows = {
        "killed": WorkerInfo(
            id=f"{here}:{killed.pid}:killed",
            host=here,
            pid=killed.pid,
            process=process,
            started_at=now,
            heartbeat_at=now,
        ),
        "lagging": WorkerInfo(
            id=f"{here}:{os.getpid()}:lagging",
            host=here,
            pid=os.getpid(),
            process=this_process(),
            started_at=now - timedelta(hours=1),
            heartbeat_at=now - timedelta(minutes=5),
        ),
    }
    # Draining after a SIGTERM: its heartbeat is recent, and it claims nothing more.
    rows["draining"] = rows["lagging"].model_copy(
        update={
            "id": f"{here}:{os.getpid()}:draining",
            "heartbeat_at": now,
            "stopping_since": now - timedelta(seconds=3),
        }
    )
    async with await anyio.open_process([sys.executable, "-c", "input()"]) as stopped:
        stopped.send_signal(signal.SIGSTOP)  # as Ctrl-Z, or a machine paused
        try:
            rows["stopped"] = WorkerInfo(
                id=f"{here}:{stopped.pid}:stopped",
                host=here,
                pid=stopped.pid,
                process=process_of(stopped.pid),
                started_at=now - timedelta(hours=1),
                heartbeat_at=now - timedelta(minutes=5),
            )
            for row in rows.values():
                engine.backend.shared.heartbeat(row)
            await _judged_in_the_console(engine, rows)
        finally:
            stopped.send_signal(signal.SIGCONT)
            stopped.kill()


async def _judged_in_the_console(engine: Engine, rows: dict[str, WorkerInfo]) -> None:
    # The engine's two ways of saying it agree: the list, and a worker at a time.
    judged = {w.id for w in await engine.workers() if engine.worker_alive(w)}
    assert (
        judged
        == {w.id for w in await engine.live_workers()}
        == {engine.worker.id, rows["lagging"].id, rows["stopped"].id, rows["draining"].id}
    )
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await until(pilot, lambda: "1 alive" in text_of(app.screen.query_one("#workers-line")))
        line = text_of(app.screen.query_one("#workers-line", Static))
        # Their processes run (recovery leaves their jobs to them), but they serve nothing: not
        # gone, not alive either (health counted a suspended worker alive).
        assert rows["lagging"].id not in line and rows["killed"].id not in line
        assert "1 alive" in line and "· 1 stalled · 1 stopping · 1 suspended · 1 gone" in line
        await command(pilot, "workers")
        table = app.screen.query_one("#workers", RowTable)
        await until(pilot, lambda: len(column(table, "worker")) == 5)
        alive = dict(zip(column(table, "worker"), column(table, "alive"), strict=True))
        assert alive[rows["killed"].id] == "✗ gone"
        assert alive[rows["lagging"].id] == "⚠ stalled"
        assert alive[rows["stopped"].id] == "⏸ suspended"
        assert alive[rows["draining"].id] == "↓ stopping"
        assert alive[engine.worker.id] == "✓ alive"
        assert ":workers lists them" not in text_of(app.screen.query_one("#workers-summary"))


def text_of_prompt(rail: StepRail, n: int) -> str:
    return str(rail.get_option_at_index(n).prompt)


async def test_a_large_bulk_cancel_shows_progress_as_it_goes(engine: Engine) -> None:
    await engine.pause("quick")  # everything stays queued: 120 runs to cancel
    await engine.enqueue_many("quick", [{"n": n} for n in range(120)])
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs queued")
        await pilot.press("C")
        await _confirm(pilot, app, "Cancel 120 runs?")
        bar = app.screen.query_one(BulkBar)
        done = [report.done for report in bar.reports]
        assert done[-1] == 120 and any(0 < d < 120 for d in done), done
        assert not bar.has_class("-running")
    assert await engine.count_runs(RunFilter.of("cancelled")) == 120


async def test_an_attached_console_has_the_same_actions_as_a_local_one(engine: Engine) -> None:
    """An attached console is an Engine with no workflows over the same operator API: bulk
    cancel goes through the engine's bulk API (a signal to the worker holding each run), and
    retry now answers as it would in the worker's own console."""
    events = engine.events()
    slow = [await engine.enqueue("slow", {"order_id": f"S{n}"}) for n in range(2)]
    await _started(events, "slow", 2)
    slow_runs = {(await engine.get_job(j)).run_id for j in slow}
    assert engine.database is not None
    async with Engine(database=engine.database, create=False) as attached:
        assert not attached.capabilities.runs_workflows
        app = BlokApp(attached)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            await command(pilot, "runs running")
            await pilot.press("t")
            await pilot.pause()
            assert any("no backoff to skip" in n.message for n in app._notifications), [
                n.message for n in app._notifications
            ]
            await pilot.press("C")
            await _confirm(pilot, app, "Cancel 2 runs?")
            assert app.last_bulk is not None
            assert sorted(app.last_bulk.ids) == sorted(slow_runs)
            messages = [n.message for n in app._notifications]
            assert not any("one by one" in m for m in messages), messages
    for run_id in slow_runs:
        assert (await engine.get_run(run_id)).status == "cancelled"


async def test_filters_pause_and_bulk_actions_are_reachable_by_command_and_palette(
    engine: Engine,
) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        for name in ("retrying", "stuck"):
            await command(pilot, f"runs {name}")
            assert isinstance(app.screen, RunsScreen) and app.screen.status_name == name
            assert app.screen.where == RunFilter.of(**RUN_FLAGS[name])
        await command(pilot, "runs failed gateway 503")
        assert isinstance(app.screen, RunsScreen) and app.screen.text == "gateway 503"
        await command(pilot, "pause quick")
        assert {q.name: q.paused for q in await engine.queues()}["quick"] is True
        await command(pilot, "resume quick")
        assert {q.name: q.paused for q in await engine.queues()}["quick"] is False
        await command(pilot, "runs")
        provider = ActionCommands(app.screen)
        shown = [str(hit.prompt) async for hit in provider.search("marked")]
        assert "Cancel the marked runs (or all the filter matches), once per job  C" in shown
        assert "Replay the marked runs (or all the filter matches), once per job  R" in shown


async def test_a_delayed_run_says_until_when_and_retry_now_starts_it(engine: Engine) -> None:
    job_id = await engine.enqueue("quick", {"n": 1}, delay="5m")
    run_id = (await engine.get_job(job_id)).run_id
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, f"run {run_id}")
        header = text_of(app.screen.query_one("#run-header", Static))
        run_at = (await engine.get_run(run_id)).run_at
        assert run_at is not None
        # Counted down in whole seconds, rounded up: 4m59.9s to go reads "in 5m00s".
        assert f"◷ delayed until {clock_time(run_at, None)} — starts in " in header
        assert re.search(r"starts in (4m\d\ds|5m00s)", header), header
        assert "t starts it now" in header
        await pilot.press("t")
        run = await engine.wait_for_job(job_id, timeout=10)
        assert run.id == run_id and run.status == "completed"


async def test_the_stuck_filter_shows_only_the_run_far_past_its_median(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLOK_STUCK_MIN", "0")  # the floor of 30 s aside: medians of ms here
    for _ in range(3):
        await engine.wait_for_job(await engine.enqueue("moody", {"seconds": 0.01}), timeout=10)
    events = engine.events()
    hung = await engine.enqueue("moody", {"seconds": 60})
    fresh = await engine.enqueue("slow", {"order_id": "S1"})  # running, but no median: never stuck
    await _started(events, "moody", 1)
    await anyio.sleep(0.2)  # past 3 × the ~10 ms median: the one wait that is about time itself
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs stuck")
        table = app.screen.query_one("#runs", RowTable)
        assert table.keys == [(await engine.get_job(hung)).run_id]
        await pilot.press("8")  # the same filter by key
        await settled(pilot)
        assert table.keys == [(await engine.get_job(hung)).run_id]
        # Its run view says so too (`show` did, and the console's header said "took 0.2s").
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RunScreen))
        await until(pilot, lambda: "stuck? " in _header(app))
        assert re.search(
            r"stuck\? \d+× its workflow's usual \d+ms \(w: where it is\)", _header(app)
        )
        await command(pilot, f"run {(await engine.get_job(fresh)).run_id}")
        await until(pilot, lambda: "slow.sleep" in _header(app) and "took" in _header(app))
        assert "stuck" not in _header(app)  # running, but no median to judge it by
    for job_id in (hung, fresh):
        await engine.cancel((await engine.get_job(job_id)).run_id)


async def test_requeue_every_dead_letter_of_a_queue_after_one_confirmation(engine: Engine) -> None:
    jobs = [await engine.enqueue("doomed", {"order_id": f"D{n}"}) for n in range(3)]
    firsts = {j: (await engine.wait_for_job(j, timeout=10)).id for j in jobs}
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "dlq doomed")
        await pilot.press("A")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert str(app.screen.query_one("#yes", Button).label) == "Requeue all (y)"
        await _confirm(pilot, app, "Requeue 3 dead letters?")
        assert sorted(app.last_bulk.ids) == sorted(jobs)
        # A queue with none: said so, not "the 0 dead letters on quick: no dead letters to
        # act on."
        await command(pilot, "dlq quick")
        await pilot.press("A")
        await until(pilot, lambda: "no dead letters to act on." in _notes(app))
        assert "the 0 dead letters" not in _notes(app)
    for job_id in jobs:  # each went back with a fresh run
        assert (await engine.get_job(job_id)).run_id != firsts[job_id]


def _header(app: BlokApp) -> str:
    return text_of(app.screen.query_one("#run-header", Static))


def _notes(app: BlokApp) -> str:
    return "\n".join(n.message for n in app._notifications)


async def test_requeue_of_the_dead_letters_a_filter_shows_asks_about_them_not_all(
    engine: Engine,
) -> None:
    # With a filter the button said "Requeue all (y)" where it requeues the 2 shown.
    jobs = await _doomed(engine, 3)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        table = await _dead_letter_view(pilot, app, 3)
        await pilot.press("slash", *"'D1'", "enter")  # in the error: "bad order 'D1'"
        await until(pilot, lambda: table.row_count == 1)
        await pilot.press("A")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert str(app.screen.query_one("#yes", Button).label) == "Requeue (y)"
        await pilot.press("n")
    assert (await engine.get_job(jobs[1])).state is JobState.DEAD


async def test_requeue_all_counts_every_dead_letter_not_only_those_listed(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The view listed the newest 1,000 of 4,499, asked "Requeue 1,000 dead letters?" and
    # requeued all 4,499.
    monkeypatch.setattr(dead_letters_screen, "LISTED", 2)
    jobs = await _doomed(engine)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "dlq doomed")
        summary = text_of(app.screen.query_one("#dlq-summary", Static))
        assert "3 dead letters on doomed" in summary and "the newest 2 listed" in summary
        await pilot.press("A")
        await _confirm(pilot, app, "Requeue 3 dead letters?")
        assert sorted(app.last_bulk.ids) == sorted(jobs)


async def test_no_dead_letters_is_said_in_one_line_of_an_80_column_terminal(
    engine: Engine,
) -> None:
    # "0 dead letters on orders   nothing here: every job either finished or is still" and
    # "trying" on a line of its own.
    app = BlokApp(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await settled(pilot)
        await command(pilot, "dlq doomed")
        summary = app.screen.query_one("#dlq-summary", Static)
        await until(pilot, lambda: "dead letters" in text_of(summary, width=80))
        lines = [line.strip() for line in shown_lines(summary) if line.strip()]
        assert lines == ["0 dead letters on doomed   every job finished or is still trying"]


async def test_a_dead_letters_very_long_error_is_cut_where_the_view_shows_it() -> None:
    # An error quoting a 5 MB body: the view laid out all of it under the table, seconds at
    # full CPU each time the selection came to it.
    def shout(ctx: object) -> None:
        raise ValueError("bad row: " + "z" * 300_000)

    noisy = Workflow(name="noisy", trigger=WorkerTrigger(queue="noisy"), steps=[Step("s", shout)])
    async with Engine(workflows=[noisy]) as engine:
        await engine.wait_for_job(await engine.enqueue("noisy", {}), timeout=10)
        app = BlokApp(engine)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            await command(pilot, "dlq noisy")
            detail = app.screen.query_one("#dlq-detail", Static)
            await until(pilot, lambda: "more characters" in text_of(detail))
            assert len(text_of(detail)) < 5_000
            table = app.screen.query_one(RowTable)
            assert len(table.cell(table.keys[0], "error").plain) < 5_000


async def test_dead_letters_made_together_show_ids_that_tell_them_apart(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Jobs of one enqueue_many have ids alike far along (13 to 15 characters tell 300 apart):
    # cut to the column's 12 cells, with an ellipsis, they read the same. Here the column is
    # 6 cells, so that any two ids are that alike.
    job, *rest = dead_letters_screen.COLUMNS
    monkeypatch.setattr(dead_letters_screen, "COLUMNS", (replace(job, width=6), *rest))
    jobs = await engine.enqueue_many("doomed", [{"order_id": f"D{n}"} for n in range(3)])
    for job_id in jobs:
        await engine.wait_for_job(job_id, timeout=10)
    short = short_ids(jobs)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "dlq doomed")
        lines = shown_lines(app.screen.query_one("#dead", RowTable))
    for job_id in jobs:
        assert sum(short[job_id] in line for line in lines) == 1, (short[job_id], lines)


def _declined(ctx) -> None:
    raise ValueError("card declined")


async def test_the_dead_letter_views_deliveries_leave_out_claims_a_gate_held(
    tmp_path: Path,
) -> None:
    # It showed the job's claims: "34 deliveries" of a job allowed 3, where a rate limit held
    # most of them back before they ran.
    limited = Workflow(
        name="limited.charge",
        trigger=WorkerTrigger(
            queue="limited", retries=1, delay=1, rate_limit=RateLimit(limit=1, period="300ms")
        ),
        steps=[Step("charge", _declined)],
    )
    async with Engine(workflows=[limited], database=tmp_path / "blok.db") as engine:
        job_id = await engine.enqueue("limited", {})
        await engine.wait_for_job(job_id, timeout=10)
        job = await engine.get_job(job_id)
        assert job.state is JobState.DEAD and job.attempts > job.deliveries == 2, job
        app = BlokApp(engine)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            await command(pilot, "dlq limited")
            table = app.screen.query_one("#dead", RowTable)
            await until(pilot, lambda: table.row_count == 1)
            assert column(table, "deliveries") == ["2"]


async def test_g_and_shift_g_go_to_the_newest_and_oldest_dead_letter(engine: Engine) -> None:
    # G did nothing in the dead-letter view; the operator pressed r next, and requeued the
    # newest job instead of the oldest.
    jobs = await _doomed(engine)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        table = await _dead_letter_view(pilot, app, len(jobs))
        await pilot.press("G")
        assert table.cursor_key == jobs[0]  # the oldest, listed last
        await pilot.press("g")
        assert table.cursor_key == jobs[-1]


async def test_x_discards_the_selected_dead_letter_after_asking_and_shift_x_all(
    engine: Engine,
) -> None:
    # Dead letters could only be requeued: failures nobody meant to retry filled the list.
    jobs = await _doomed(engine)
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        table = await _dead_letter_view(pilot, app, len(jobs))
        assert table.cursor_key == jobs[-1]  # the newest
        # Under the table, its input; and the filter finds a job by what its input holds.
        detail = text_of(app.screen.query_one("#dlq-detail", Static)).splitlines()
        assert detail[1] == 'input {"order_id": "D2"}', detail
        await pilot.press("slash", *'"D0"', "enter")  # in its input, not its error ('D0')
        await until(pilot, lambda: table.row_count == 1)
        assert table.cursor_key == jobs[0]
        await pilot.press("slash", *["backspace"] * 4, "enter")
        await until(pilot, lambda: table.row_count == len(jobs))
        table.move_cursor(row=0)
        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        question = text_of(app.screen.query_one(".question", Static)).strip()
        assert question == f"Discard job {jobs[-1]}?"
        # Which order it is, when it died and why: the question had named the job id alone.
        detail = text_of(app.screen.query_one(".detail", Static))
        assert detail.startswith('doomed.retry, input {"order_id": "D2"}; died '), detail
        assert "check failed" in detail.split("\n")[0], detail
        await pilot.press("n")  # kept: nothing happens
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert (await engine.get_job(jobs[-1])).state is JobState.DEAD
        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: table.row_count == 2)
        assert (await engine.get_job(jobs[-1])).state is JobState.CANCELLED
        assert jobs[-1] not in table.keys
        await pilot.press("X")
        await _confirm(pilot, app, "Discard 2 dead letters?")
        assert sorted(app.last_bulk.ids) == sorted(jobs[:2])
        await until(pilot, lambda: table.row_count == 0)
    assert await engine.dead_letters("doomed") == []


async def test_a_cut_error_keeps_its_file_and_line_in_the_dead_letter_and_runs_views(
    engine: Engine,
) -> None:
    # Where the error column was narrower than the error, its end was cut, and its place went
    # first: the operator scanning failures for the file they come from read "check fai…".
    jobs = await _doomed(engine, 1)
    run, _ = await engine.runs(status="failed")  # its two deliveries
    place = re.search(r"\(at [^()]+/(flows\.py:\d+)\)$", run.error or "")
    assert place is not None, run.error
    # Whole, or without its folders where it would take more than half the column.
    kept = (place[0], f"(at …/{place[1]})")
    app = BlokApp(engine)
    async with app.run_test(size=(100, 24)) as pilot:
        await settled(pilot)
        await command(pilot, "dlq doomed")
        await until(pilot, lambda: app.screen.query_one("#dead", RowTable).row_count == 1)
        [row] = [line for line in shown_lines(app.screen.query_one("#dead", RowTable))[1:] if line]
        assert short_ids(jobs)[jobs[0]] in row[:16]
        # The cut opening ("[step 1/1] check failed: ") leaves the message its room.
        assert row.endswith(kept) and "…" in row and " check: bad" in row, row
    app = BlokApp(engine)
    async with app.run_test(size=(150, 24)) as pilot:  # room for the runs' detail column
        await settled(pilot)
        await command(pilot, "runs failed")
        table = app.screen.query_one(RowTable)
        await until(pilot, lambda: table.row_count == 2)
        rows = [line for line in shown_lines(table)[1:] if line]
        assert len(rows) == 2, rows
        assert all(r.endswith(kept) and "…" in r and " check: bad" in r for r in rows), rows


async def test_r_on_a_dead_letter_a_replay_completed_asks_before_it_runs_again(
    engine: Engine,
) -> None:
    # r requeued it at once: fixed by a replay already, its card was charged twice.
    job_id = await engine.enqueue("fixable", {"order_id": "F1"})
    dead = await engine.wait_for_job(job_id, timeout=10)
    replay = await engine.get_run(await engine.replay(dead.id, input={"fixed": True}))
    assert (await engine.wait_for_job(replay.job_id, timeout=10)).status is RunStatus.COMPLETED
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "dlq fixable")
        # The list says so before r: it still looked like work to do.
        detail = app.screen.query_one("#dlq-detail", Static)
        fixed = f"it was replayed as run {replay.id}, which completed: a requeue runs it again"
        await until(pilot, lambda: fixed in text_of(detail))
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert text_of(app.screen.query_one(".question", Static)).strip() == "Requeue it anyway?"
        assert f"replayed as run {replay.id}, which completed" in text_of(
            app.screen.query_one(".detail", Static)
        )
        await pilot.press("n")
        await settled(pilot)
        assert (await engine.get_job(job_id)).run_id == dead.id  # left dead
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")

        async def requeued() -> bool:
            return (await engine.get_job(job_id)).run_id != dead.id

        with anyio.fail_after(10):
            while not await requeued():
                await pilot.pause(0.05)


async def test_r_on_a_run_a_replay_fixed_asks_before_it_runs_again(engine: Engine) -> None:
    # r replayed at once a failed run whose replay had completed: the order charged twice.
    source = await engine.wait_for_job(await engine.enqueue("fixable", {"order_id": "F2"}), 10)
    fixed = await engine.get_run(await engine.replay(source.id, input={"fixed": True}))
    assert (await engine.wait_for_job(fixed.job_id, timeout=10)).status is RunStatus.COMPLETED
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, f"run {source.id}")
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert text_of(app.screen.query_one(".question", Static)).strip() == "Replay it anyway?"
        assert f"it was replayed as run {fixed.id}, which completed" in text_of(
            app.screen.query_one(".detail", Static)
        )
        await pilot.press("n")
        await settled(pilot)
        assert len(await engine.runs(replay_of=source.id)) == 1  # not replayed again
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(
            pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.run_id != source.id
        )
        assert len(await engine.runs(replay_of=source.id)) == 2


async def test_w_asks_where_a_running_run_is_and_shows_the_workers_answer(engine: Engine) -> None:
    async with expect_events(engine, StepStarted):  # its node is called in the same turn
        job_id = await engine.enqueue("slow", {"order_id": "W1"})
    run_id = (await engine.get_job(job_id)).run_id
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, f"run {run_id}")
        await pilot.press("w")
        await until(pilot, lambda: any(n.title.startswith("Where") for n in app._notifications))
        [note] = [n for n in app._notifications if n.title.startswith("Where")]
        assert note.title == f"Where run {run_id} is now"
        at = raised_at(sleep_long, 2)  # its `await anyio.sleep(60)`
        assert note.message.splitlines() == [
            f"where: [step 1/1] sleep is at {at}",
            f"  {at} in sleep_long: await anyio.sleep(60)",
        ]
        await engine.cancel(run_id)
        # Offered while it runs only.
        await until(pilot, lambda: not app.screen.key_applies("where"))


async def test_w_in_the_runs_view_asks_about_the_selected_run(engine: Engine) -> None:
    async with expect_events(engine, StepStarted):
        job_id = await engine.enqueue("slow", {"order_id": "W2"})
    done = await engine.wait_for_job(await engine.enqueue("quick", {"n": 1}), timeout=10)
    run_id = (await engine.get_job(job_id)).run_id
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await command(pilot, "runs")
        table = app.screen.query_one("#runs", RowTable)
        table.move_cursor(row=table.keys.index(run_id))
        await pilot.press("w")
        await until(pilot, lambda: any(n.title.startswith("Where") for n in app._notifications))
        table.move_cursor(row=table.keys.index(done.id))
        await pilot.press("w")
        await until(pilot, lambda: any(n.title == "Where: no answer" for n in app._notifications))
    answers = {n.title: n.message for n in app._notifications}
    assert answers[f"Where run {run_id} is now"].startswith("where: [step 1/1] sleep is at ")
    assert answers["Where: no answer"] == f"run {done.id} is completed: none of its code runs now"
    await engine.cancel(run_id)


async def test_c_asks_about_what_a_cancel_stops_for_the_runs_state(engine: Engine) -> None:
    """A queued run never starts, a waiting one does not go on, a running one is interrupted:
    the confirmation says which, before anything is done."""
    async with expect_events(engine, StepStarted):
        running = await engine.enqueue("slow", {"order_id": "C1"})
    async with expect_events(
        engine, RunStatusChanged, where=lambda event: event.status == "waiting"
    ):
        waiting = await engine.enqueue("waiter", {})
    await engine.pause("quick")
    queued = await engine.enqueue("quick", {"n": 1})
    said: dict[str, str] = {}
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        for job_id in (running, waiting, queued):
            run_id = (await engine.get_job(job_id)).run_id
            await command(pilot, f"run {run_id}")
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            said[job_id] = " ".join(text_of(app.screen.query_one(".detail", Static)).split())
            await pilot.press("n")
            await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
    assert said == {
        # Said before the cancel: a sync node is not interrupted (the dialog promised it was).
        running: "slow.sleep on slow, running. Its current step is interrupted (a node written "
        "as a plain def runs on in its thread until it returns, and keeps its worker's slot "
        "till then); the job is not retried.",
        waiting: "waiter.pause on waiter, waiting. It does not go on from its wait; the job is "
        "not retried.",
        queued: "quick.echo on quick, queued. It never starts; the job is not retried.",
    }
    for job_id in (running, waiting, queued):  # nothing was cancelled
        run = await engine.get_run((await engine.get_job(job_id)).run_id)
        assert run.status is not RunStatus.CANCELLED
        await engine.cancel(run.id)


async def test_a_key_of_another_view_says_where_it_acts(engine: Engine) -> None:
    # The on-call walkthrough typed 8 (stuck runs) and C (cancel them) in the queues view:
    # nothing happened, and nothing said why.
    app = BlokApp(engine)
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot)
        await pilot.press("8")
        await until(pilot, lambda: "8 does nothing in the Queues view" in _notes(app))
        assert "Runs view: show stuck runs (? lists every key)" in _notes(app)
        # A key the view binds does its own thing, and says nothing more.
        app.clear_notifications()
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RunsScreen))
        await pilot.press("8")
        await settled(pilot)
        assert app.screen.status_name == "stuck" and _notes(app) == ""


async def test_r_says_which_version_the_replay_runs_when_not_its_runs(tmp_path: Path) -> None:
    # A run failed on a bad deploy; once fixed, r's toast said "replay of … started as …",
    # and only the diff view showed the replay ran other code.
    def flow(fails: bool) -> Workflow:
        def go(ctx: object) -> str:
            if fails:
                raise ValueError("bad deploy")
            return "ok"

        name = "go_bad" if fails else "go"  # another step: another version
        return Workflow(
            name="deploy.me", trigger=WorkerTrigger(queue="deploy"), steps=[Step(name, go)]
        )

    database = tmp_path / "blok.db"
    old, fixed = flow(True), flow(False)
    async with Engine(workflows=[old], database=database) as first:
        failed = await first.wait_for_job(await first.enqueue("deploy", {}), timeout=10)
    async with Engine(workflows=[fixed], database=database) as engine:
        app = BlokApp(engine)
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot)
            await command(pilot, f"run {failed.id}")
            await until(pilot, lambda: isinstance(app.screen, RunScreen))
            await pilot.press("r")
            await until(pilot, lambda: "started as" in _notes(app))
            assert (
                f", on version {fixed.version} of deploy.me (run {failed.id} ran {old.version})"
                in _notes(app)
            )
