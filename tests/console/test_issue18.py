"""The console for a developer watching real runs (issue 18): tables that redraw only what
changed and fit 80 columns, finding a run, one vocabulary, the run view's fold, search and
tracebacks, keys that act at once, the timeline and the live log view. Over a real engine on a
real SQLite file, driven with Textual's pilot."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from rich.text import Text
from support import expect_events
from support import until as until_true
from textual.app import App, ComposeResult
from textual.pilot import Pilot
from textual.widgets import Input, Static, TextArea

from blok_tui import runs_screen
from blok_tui.app import BlokApp
from blok_tui.diff_screen import DiffScreen
from blok_tui.inject_screen import InjectScreen
from blok_tui.logs_screen import LogsScreen
from blok_tui.queues_screen import QueuesScreen
from blok_tui.run_screen import RunScreen
from blok_tui.runs_screen import RunsScreen
from blok_tui.step_stats import StepStats
from blok_tui.timeline_screen import TimelineScreen
from blok_tui.tracebacks import clean_error, fold_traceback
from blok_tui.widgets.row_table import Column, RowTable
from engine import (
    Engine,
    RateLimit,
    RunFilter,
    RunStarted,
    Step,
    StepFinished,
    StepStarted,
    WorkerTrigger,
    Workflow,
    subworkflow,
)

from .flows import ALL
from .helpers import column, command, settled, text_of, until

pytestmark = pytest.mark.anyio
NARROW = (80, 24)
WIDE = (140, 40)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    async with Engine(workflows=ALL, database=tmp_path / "blok.db", grace_period=0.5) as engine:
        yield engine


# ---- the table ----------------------------------------------------------------------------
class CountingTable(RowTable):
    rendered = 0

    def _render_cells(self, cells: Any, console: Any) -> Any:
        CountingTable.rendered += 1
        return super()._render_cells(cells, console)


class TableApp(App[None]):
    def compose(self) -> ComposeResult:
        yield CountingTable([Column("a", "a", 6), Column("b", "b", 6)], id="t")


async def test_a_changed_row_is_the_only_row_drawn_again() -> None:
    app = TableApp()
    async with app.run_test(size=(40, 20)) as pilot:
        table = app.query_one(CountingTable)
        rows = [(f"k{n}", [f"a{n}", "b"]) for n in range(10)]
        table.set_rows(rows)
        await pilot.pause()
        CountingTable.rendered = 0
        rows[3] = ("k3", ["changed", "b"])
        table.set_rows(rows)
        await pilot.pause()
        # One row drawn, not ten (DataTable redrew every visible cell on any change). The
        # header is drawn with each refreshed frame, hence "at most 2".
        assert 1 <= CountingTable.rendered <= 2
        assert str(table.cell("k3", "a")) == "changed"
        # A style-only change is a change too (Text's == ignores styles).
        CountingTable.rendered = 0
        rows[5] = ("k5", [Text("a5", style="red"), "b"])
        table.set_rows(rows)
        await pilot.pause()
        assert CountingTable.rendered >= 1


def test_narrow_tables_drop_the_least_important_columns_first() -> None:
    table = RowTable(
        [
            Column("status", "status", 11, priority=10),
            Column("version", "version", 8, priority=1),
            Column("workflow", "workflow", 16, priority=8),
            Column("note", "note", 10, priority=0, flex=True),
        ]
    )
    wide = table.fit_columns(120)
    assert [c.key for c, _ in wide] == ["status", "version", "workflow", "note"]
    assert sum(w for _, w in wide) + 3 + 1 == 120  # the flexible column takes the rest
    narrow = table.fit_columns(36)
    assert [c.key for c, _ in narrow] == ["status", "workflow"]


async def test_the_runs_view_at_80_columns_has_no_hidden_columns_and_keeps_status_and_id(
    engine: Engine,
) -> None:
    job_id = await engine.enqueue("quick", {"n": 1})
    run = await engine.wait_for_job(job_id, timeout=10)
    app = BlokApp(engine)
    async with app.run_test(size=NARROW) as pilot:
        await settled(pilot)
        await command(pilot, "runs")
        table = app.screen.query_one("#runs", RowTable)
        shown = table.shown_columns
        assert {"status", "run", "workflow", "took"} <= set(shown)
        assert "replay of" not in shown and "detail" not in shown
        widths = sum(w for _, w in table.fit_columns(table.scrollable_content_region.width))
        assert widths + len(shown) <= 80
        # The id shows as its shortest unique prefix; the preview line has it whole.
        assert run.id.startswith("run_" + column(table, "run")[0])
        assert run.id in text_of(app.screen.query_one("#preview", Static))


# ---- finding a run ------------------------------------------------------------------------
async def test_slash_finds_a_run_by_its_input_and_by_its_job_id(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `/` read the newest 1,000 runs and matched them itself: an order's run older than that
    # was not found, where the engine searches every run. (SEARCHED was that window: set to
    # 2 here, it would leave the oldest of three out.)
    monkeypatch.setattr(runs_screen, "SEARCHED", 2, raising=False)
    jobs = [await engine.enqueue("quick", {"customer": name}) for name in ("注文", "bob", "cyd")]
    runs = [await engine.wait_for_job(job_id, timeout=10) for job_id in jobs]
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        await command(pilot, "runs")
        table = app.screen.query_one("#runs", RowTable)
        assert table.row_count == 3
        await pilot.press("slash", *"bob")
        await settled(pilot)
        assert table.keys == [runs[1].id]
        box = app.screen.query_one(Input)
        box.value = jobs[2]
        await settled(pilot)
        assert table.keys == [runs[2].id]
        box.value = "注文"  # the oldest run, and text beyond ASCII in its input
        await settled(pilot)
        assert table.keys == [runs[0].id]
        # esc clears the filter (and stays); the next esc goes back.
        await pilot.press("enter")
        await settled(pilot)
        await pilot.press("escape")
        await settled(pilot)
        assert isinstance(app.screen, RunsScreen) and app.screen.text == ""
        assert table.row_count == 3
        await pilot.press("escape")
        await settled(pilot)
        assert isinstance(app.screen, QueuesScreen)


async def test_run_command_takes_a_unique_prefix_or_a_job_id_and_y_copies_the_id(
    engine: Engine,
) -> None:
    first = await engine.wait_for_job(await engine.enqueue("quick", {"n": 1}), timeout=10)
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        await command(pilot, f"run {first.id.removeprefix('run_')[:14]}")
        assert isinstance(app.screen, RunScreen) and app.screen.run_id == first.id
        await pilot.press("y")
        assert app.clipboard == first.id
        await command(pilot, f"run {first.job_id}")
        assert isinstance(app.screen, RunScreen) and app.screen.run_id == first.id
        await command(pilot, "run zzzz")
        messages = [n.message for n in app._notifications]
        assert "unknown run 'zzzz': no run id starts with it" in messages


async def test_after_inject_O_opens_the_new_run(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        app.action_inject("quick")
        await until(pilot, lambda: bool(app.screen.query(TextArea)))
        app.screen.query_one(TextArea).text = '{"n": 7}'
        await pilot.press("ctrl+s")
        await until(pilot, lambda: app.last_injected is not None)
        await pilot.press("O")
        await settled(pilot)
        assert isinstance(app.screen, RunScreen) and app.screen.run_id == app.last_injected
        run = await engine.get_run(app.screen.run_id)
        assert run.input == {"n": 7}


# ---- keys ---------------------------------------------------------------------------------
async def test_escape_closes_the_inject_modal_at_once_and_tab_moves_between_fields(
    engine: Engine,
) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=NARROW) as pilot:
        await settled(pilot)
        await pilot.press("i")
        await until(pilot, lambda: isinstance(app.screen, InjectScreen))
        modal = app.screen
        assert isinstance(modal.focused, TextArea)
        await pilot.press("tab")
        assert modal.focused is modal.query_one("#priority", Input)
        # At 80x24 the buttons are on screen, inside the dialog.
        send = modal.query_one("#send")
        assert send.region.bottom <= 24 and send.region.right <= 80
        await pilot.press("shift+tab", "escape")  # back in the editor, then one escape
        await until(pilot, lambda: not isinstance(app.screen, InjectScreen))


async def test_escape_right_after_enter_is_not_lost(engine: Engine) -> None:
    await engine.wait_for_job(await engine.enqueue("quick", {"n": 1}), timeout=10)
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        await command(pilot, "runs")
        await pilot.press("enter", "escape")
        await settled(pilot)
        assert isinstance(app.screen, RunsScreen)


async def test_ctrl_c_hint_is_plain_text_not_markup(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        app.action_help_quit()
        await pilot.pause()
        messages = [n.message for n in app._notifications]
        assert messages and not any("[b]" in m for m in messages)


# ---- vocabulary ---------------------------------------------------------------------------
async def test_the_queues_view_counts_a_durable_wait_as_waiting_not_delayed(
    engine: Engine,
) -> None:
    events = engine.events()
    await engine.enqueue("waiter", {})
    with anyio.fail_after(10):
        async for event in events:
            if isinstance(event, StepFinished) and event.name == "ready":
                break
    await events.aclose()
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        table = app.screen.query_one("#queues", RowTable)
        await until(pilot, lambda: str(table.cell("waiter", "waiting")).strip() == "1")
        assert str(table.cell("waiter", "delayed")).strip() == "·"
        assert "queued" in table.shown_columns and "running" in table.shown_columns


async def test_the_queues_view_counts_runs_a_rate_limit_holds_as_throttled_not_delayed(
    tmp_path: Path,
) -> None:
    # They were counted delayed, and the operator looked for a backoff or a start delay.
    async def call(ctx: Any) -> int:
        return 1

    limited = Workflow(
        name="limited",
        trigger=WorkerTrigger(queue="limited", rate_limit=RateLimit(limit=1, period="1h")),
        steps=[Step("call", call)],
    )
    async with Engine(workflows=[limited], database=tmp_path / "blok.db") as engine:
        first, *held = [await engine.enqueue("limited", {"n": n}) for n in range(3)]
        await engine.wait_for_job(first, timeout=10)

        async def both_held() -> bool:
            return await engine.count_runs(RunFilter.of("throttled")) == len(held)

        await until_true(both_held)
        app = BlokApp(engine)
        async with app.run_test(size=WIDE) as pilot:
            await settled(pilot)
            table = app.screen.query_one("#queues", RowTable)
            await until(pilot, lambda: str(table.cell("limited", "throttled")).strip() == "2")
            assert str(table.cell("limited", "delayed")).strip() == "·"
            summary = text_of(app.screen.query_one("#summary", Static))
            assert "0 delayed · 2 throttled ·" in summary, summary
            # Narrow, counts of none go first: "2 throttled" went, the line read "0 queued ·
            # 0 running · 0 waiting · 0 delayed", and the backlog looked empty.
            await pilot.resize_terminal(60, 24)
            await settled(pilot)
            summary = text_of(app.screen.query_one("#summary", Static))
            assert "2 throttled" in summary and "0 delayed" not in summary, summary


async def test_recent_failures_are_listed_by_when_they_failed_with_that_time(
    tmp_path: Path,
) -> None:
    # Listed by their starts, with their starts: a crash found minutes into a run read as
    # its start, and the lines came out of order.
    release = anyio.Event()

    async def fail_when_released(ctx: Any) -> None:
        if ctx.body["wait"]:
            await release.wait()
        raise ValueError(f"failed {ctx.body['name']}")

    flaky = Workflow(
        name="flaky",
        trigger=WorkerTrigger(queue="flaky", concurrency=2),
        steps=[Step("go", fail_when_released)],
    )
    async with Engine(workflows=[flaky], database=tmp_path / "blok.db") as engine:
        async with expect_events(engine, StepStarted):
            late = await engine.enqueue("flaky", {"wait": True, "name": "late"})
        early = await engine.wait_for_job(
            await engine.enqueue("flaky", {"wait": False, "name": "early"}), timeout=10
        )
        release.set()
        last = await engine.wait_for_job(late, timeout=10)
        assert last.started_at < early.started_at < early.finished_at < last.finished_at
        app = BlokApp(engine)
        async with app.run_test(size=WIDE) as pilot:
            await settled(pilot)
            failures = app.screen.query_one("#failures", Static)
            await until(pilot, lambda: "failed early" in text_of(failures))
            lines = [line for line in text_of(failures).splitlines() if "failed " in line]
            assert ["failed late" in lines[0], "failed early" in lines[1]] == [True, True], lines
            ended = last.finished_at.astimezone().strftime("%H:%M:%S")
            assert lines[0].startswith(ended), lines


async def test_the_queues_view_counts_the_runs_that_failed_lately_retried_or_not(
    tmp_path: Path,
) -> None:
    # Every job failed, was retried and went to the dead-letter queue: "failed" stayed "·"
    # (it counts jobs that ended failed without it), and nothing on the row said it failed.
    async def declined(ctx: Any) -> None:
        raise ValueError("declined")

    pay = Workflow(
        name="pay",
        trigger=WorkerTrigger(queue="pay", retries=1, delay=1),
        steps=[Step("go", declined)],
    )
    async with Engine(workflows=[pay], database=tmp_path / "blok.db") as engine:
        for _ in range(2):
            await engine.wait_for_job(await engine.enqueue("pay", {}), timeout=10)
        app = BlokApp(engine)
        async with app.run_test(size=WIDE) as pilot:
            await settled(pilot)
            table = app.screen.query_one("#queues", RowTable)
            await until(pilot, lambda: str(table.cell("pay", "errors")).strip() == "4")
            assert str(table.cell("pay", "failed")).strip() == "·"


async def test_the_queues_view_marks_a_queue_no_live_worker_serves(tmp_path: Path) -> None:
    # Its workers stopped (the demo's, once a user's own workflows took over): its row looked
    # like a live one, jobs queued and all, where `blok-tui queues` said "no worker".
    async def call(ctx: Any) -> int:
        return 1

    flows = [
        Workflow(name=name, trigger=WorkerTrigger(queue=name), steps=[Step("call", call)])
        for name in ("gone", "here")
    ]
    database = tmp_path / "blok.db"
    async with Engine(workflows=[flows[0]], database=database):
        pass
    async with Engine(workflows=[flows[1]], database=database) as engine:
        assert {q.name: q.served for q in await engine.queues()} == {"gone": False, "here": True}
        app = BlokApp(engine)
        async with app.run_test(size=WIDE) as pilot:
            await settled(pilot)
            table = app.screen.query_one("#queues", RowTable)
            await until(pilot, lambda: table.row_count == 2)
            assert str(table.cell("gone", "queue")).endswith("✗ no worker")
            assert "no worker" not in str(table.cell("here", "queue"))


# ---- the run view -------------------------------------------------------------------------
async def test_a_large_output_folds_and_a_search_finds_a_line_inside_it(engine: Engine) -> None:
    run = await engine.wait_for_job(await engine.enqueue("big", {}), timeout=10)
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        await command(pilot, f"run {run.id}")
        title = text_of(app.screen.query_one("#output-title", Static))
        assert "lines, the first 40 shown" in title
        assert "SKU-1999" not in text_of(app.screen.query_one("#step-output", Static))
        await pilot.press("slash")
        app.screen.query_one(Input).value = "SKU-1999"
        await settled(pilot)
        found = text_of(app.screen.query_one("#step-output", Static))
        assert '"sku": "SKU-1999"' in found
        assert "1 of" in text_of(app.screen.query_one("#output-title", Static))


async def test_run_provided_control_characters_never_reach_the_terminal(engine: Engine) -> None:
    run = await engine.wait_for_job(await engine.enqueue("hostile", {}), timeout=10)
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        await command(pilot, f"run {run.id}")
        header = text_of(app.screen.query_one("#run-header", Static))
        assert "\x1b" not in header and "\x07" not in header
        assert "\\x1b]0;pwned\\x07" in header
        await command(pilot, "runs")
        table = app.screen.query_one("#runs", RowTable)
        assert all("\x1b" not in str(table.cell(key, "detail")) for key in table.keys)


def test_tracebacks_start_at_the_users_frame_and_fold_engine_frames() -> None:
    import engine as engine_package

    runner = str(Path(engine_package.__file__).parent / "runner.py")
    traceback = (
        "Traceback (most recent call last):\n"
        f'  File "{runner}", line 410, in _node\n'
        "    result = await call(ctx)\n"
        f'  File "{runner}", line 120, in call\n'
        "    return fn(ctx)\n"
        '  File "/home/me/flows/webhooks.py", line 12, in deliver\n'
        "    raise EndpointGone(url)\n"
        "blok_workflows.webhooks_2b0425cb.EndpointGone: POST https://x: 410 Gone\n"
    )
    folded = fold_traceback(traceback, cwd=Path("/home/me"))
    assert folded.splitlines() == [
        "Traceback (most recent call last):",
        "  … 2 engine frames",
        '  File "flows/webhooks.py", line 12, in deliver',
        "    raise EndpointGone(url)",
        "EndpointGone: POST https://x: 410 Gone",
    ]
    assert clean_error("blok_workflows.orders_0a1b2c3d.Declined: no") == "Declined: no"


def test_a_step_slower_since_a_reload_is_flagged() -> None:
    stats = StepStats("w", durations={"charge": {"new": [900.0] * 3, "old": [100.0] * 5}})
    stats.versions = ["new", "old"]
    assert stats.slower("new", "charge") == (900.0, 100.0, "old")
    stats.durations["charge"]["new"] = [110.0] * 3
    assert stats.slower("new", "charge") is None


# ---- the new views ------------------------------------------------------------------------
async def test_the_timeline_draws_each_attempt_and_the_backoff_between_them(
    engine: Engine,
) -> None:
    run = await engine.wait_for_job(await engine.enqueue("flaky", {}), timeout=10)
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        await command(pilot, f"run {run.id}")
        await pilot.press("T")
        await settled(pilot)
        assert isinstance(app.screen, TimelineScreen)
        lines = text_of(app.screen.query_one("#timeline", Static)).splitlines()
        call = next(line for line in lines if line.startswith("call "))
        assert "█" in call and "×2" in call  # two attempts
        assert any(line.startswith("queued ") for line in lines)
        assert any(line.startswith("after ") for line in lines)


async def logs_view(app: BlokApp, pilot: Pilot[Any]) -> RowTable:
    """The live log view opened (L), its table."""
    await settled(pilot)
    await pilot.press("L")
    await settled(pilot)
    assert isinstance(app.screen, LogsScreen)
    return app.screen.query_one("#logs", RowTable)


async def test_the_live_log_view_shows_every_runs_lines_as_they_come(engine: Engine) -> None:
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        table = await logs_view(app, pilot)
        events = engine.events()
        await engine.enqueue("slow", {"order_id": "S9"})
        with anyio.fail_after(10):
            async for event in events:
                if isinstance(event, RunStarted):
                    break
        await events.aclose()
        await until(pilot, lambda: any("S9" in m for m in column(table, "message")))
        # The step by its name (its start was seen): a log line carries only its index.
        lines = dict(zip(column(table, "message"), column(table, "step"), strict=True))
        assert [step for message, step in lines.items() if "S9" in message] == ["sleep"]
        await pilot.press("slash", *"nothing-like-this")
        await settled(pilot)
        assert table.row_count == 0
        await pilot.press("escape")
        await settled(pilot)
        assert table.row_count >= 1
        await pilot.press("enter")
        await settled(pilot)
        assert isinstance(app.screen, RunScreen)


async def test_the_engines_own_warnings_reach_the_log_view_and_a_toast(engine: Engine) -> None:
    # Under the console the engine's log goes to a file: its warnings (a node blocking the
    # event loop, a mistyped sub-workflow, a job id enqueued again with another payload) were
    # read by no one.
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        table = await logs_view(app, pilot)
        await engine.enqueue("slow", {"order_id": "D1"}, job_id="dup")
        await engine.enqueue("slow", {"order_id": "D2"}, job_id="dup")
        await until(pilot, lambda: any("payload differs" in m for m in column(table, "message")))
        lines = dict(zip(column(table, "message"), column(table, "run"), strict=True))
        [(message, run)] = [(m, r) for m, r in lines.items() if "payload differs" in m]
        assert run == "engine" and message.startswith("blok.operator: job id 'dup' is already")
        await until(pilot, lambda: bool(app._notifications))
        [toast] = list(app._notifications)
        assert toast.title == "Engine warning" and "payload differs" in str(toast.message)
        # A second warning at once: a line, no second toast.
        await engine.enqueue("slow", {"order_id": "D3"}, job_id="dup")
        await until(
            pilot, lambda: sum("payload differs" in m for m in column(table, "message")) == 2
        )
        assert len(app._notifications) == 1
        table.move_cursor(row=[*lines].index(message))
        await pilot.press("enter")  # no run to open: said so, the view stays
        await settled(pilot)
        assert isinstance(app.screen, LogsScreen)


async def test_a_warning_of_loading_the_workflows_reaches_the_console_that_opens_after(
    tmp_path: Path,
) -> None:
    # `blok-tui` opens the engine, which loads the workflows, before the console is up: what
    # the load warned of (a sub-workflow name no workflow has) is kept for it.
    from blok_tui import engine_log

    engine_log.installed()
    parent = Workflow(
        name="parent",
        trigger=WorkerTrigger(queue="parent"),
        steps=[subworkflow("kid", workflow="billing.refnd")],
    )
    refund = Workflow(name="billing.refund", steps=[Step("refund", lambda ctx: "refunded")])
    async with Engine(workflows=[parent, refund], database=tmp_path / "blok.db") as engine:
        app = BlokApp(engine)
        async with app.run_test(size=WIDE) as pilot:
            await settled(pilot)
            await until(pilot, lambda: bool(app._notifications))
            [toast] = list(app._notifications)
            assert "names 'billing.refnd', which no loaded workflow is" in str(toast.message)
            assert "did you mean 'billing.refund'?" in str(toast.message)


async def test_a_workflow_file_that_fails_to_load_is_said_by_the_banner_alone(
    tmp_path: Path,
) -> None:
    # The engine logs it as an error, and the banner shows it: a toast said it a second time.
    from blok_tui import engine_log

    engine_log.installed()
    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "bad.py").write_text("x = undefined_name\n")
    async with Engine(workflows=folder, database=tmp_path / "blok.db") as engine:
        assert engine.reload_errors
        app = BlokApp(engine)
        async with app.run_test(size=WIDE) as pilot:
            await settled(pilot)
            assert app.reload_errors
            assert not [n for n in app._notifications if n.title == "Engine warning"]
            assert not [e for _, e in app.log_lines if "failed to load" in e.message]


async def test_diff_shows_what_a_replay_with_an_edited_input_changed(engine: Engine) -> None:
    failed = await engine.wait_for_job(
        await engine.enqueue("fixable", {"order_id": "F1"}), timeout=10
    )
    assert failed.status == "failed"
    replay_id = await engine.replay(failed.id, input={"order_id": "F1", "fixed": True})
    await engine.wait_for_job((await engine.get_run(replay_id)).job_id, timeout=10)
    app = BlokApp(engine)
    async with app.run_test(size=WIDE) as pilot:
        await settled(pilot)
        await command(pilot, f"run {replay_id}")
        await pilot.press("D")
        await settled(pilot)
        assert isinstance(app.screen, DiffScreen)
        shown = text_of(app.screen.query_one("#diff", Static), width=140)
        assert "+ fixed: true" in shown
        charge = next(line for line in shown.splitlines() if line.startswith("charge"))
        assert "✗ failed" in charge and "✓ completed" in charge
        assert "+ charged: true" in shown or "null →" in shown


async def test_the_running_steps_log_follows_its_new_lines(engine: Engine) -> None:
    async with expect_events(engine, RunStarted):
        job_id = await engine.enqueue("chatty", {})
    run_id = (await engine.get_job(job_id)).run_id
    app = BlokApp(engine)
    async with app.run_test(size=NARROW) as pilot:
        await settled(pilot)
        await command(pilot, f"run {run_id}")
        log = app.screen.query_one("#step-log", Static)
        await until(pilot, lambda: "progress line 79" in text_of(log))
        await settled(pilot)
        detail = app.screen.query_one("#detail")
        await until(
            pilot, lambda: detail.max_scroll_y > 0 and detail.scroll_y == detail.max_scroll_y
        )
        await engine.cancel(run_id)
