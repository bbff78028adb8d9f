"""The run view as a new user met it (the console walk-through): a long error that took the
whole screen (and PageDown that then crashed the console), step names cut short on the rail
and the timeline, the selected step out of sight on open, an ended event wait told in the
present tense, a search that showed a backslash twice, an unfold with no sign, tab going to a
scroll with nothing in it, and an attempts table whose error column was the narrowest. Over
an in-memory engine, driven with Textual's pilot."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest
from support import run_when
from textual.pilot import Pilot
from textual.widgets import Static

from blok_tui.app import BlokApp
from blok_tui.run_screen import RunScreen
from blok_tui.timeline_screen import TimelineScreen
from blok_tui.widgets import AttemptsView, ReloadBanner, StepRail
from blok_tui.widgets.key_bar import KeyBar
from blok_tui.widgets.timeline import timeline
from engine import (
    Engine,
    Retry,
    Run,
    RunStatus,
    Step,
    WorkerTrigger,
    Workflow,
    for_each,
    wait,
)

from .helpers import command, settled, shown_lines, text_of, until

pytestmark = pytest.mark.anyio

ERROR_LINES = 40  # the failing step's error: a heading and these lines


def explode(ctx: Any) -> None:
    lines = "\n".join(
        f"line {n}: something went badly wrong with the frobnicator component number {n}"
        for n in range(ERROR_LINES)
    )
    raise RuntimeError("Multi-line failure:\n" + lines)


def gateway(ctx: Any) -> None:
    raise ConnectionError(f"gateway 503 for order A1 (attempt {ctx.attempt} of 3)")


def huge(ctx: Any) -> dict[str, str]:
    return {f"key_{n:05d}": "x" * 40 for n in range(4_000)}


def long_line(ctx: Any) -> dict[str, str]:
    return {"blob": "x" * 300_000 + "NEEDLE" + "x" * 300_000}


def long_error(ctx: Any) -> None:
    ctx.logger.info("body: %s", "y" * 300_000)
    raise ValueError("bad row: " + "z" * 600_000)


def takes_x(ctx: Any, x: int) -> int:
    return x


def numbered(n: int) -> Any:
    def node(ctx: Any) -> dict[str, int]:
        return {"n": n}

    return node


LONG_NAMES = [f"step_{n:02d}_with_a_rather_long_descriptive_name" for n in range(30)]
FAILING = Workflow(
    name="walk.failing",
    trigger=WorkerTrigger(queue="failing"),
    steps=[Step("explode", explode, retry=Retry(max_attempts=2, min_timeout="10ms"))],
)
GATEWAY = Workflow(
    name="walk.gateway",
    trigger=WorkerTrigger(queue="gateway"),
    steps=[Step("call", gateway, retry=Retry(max_attempts=3, min_timeout="10ms"))],
)
MANY = Workflow(
    name="walk.many",
    trigger=WorkerTrigger(queue="many"),
    steps=[Step(name, numbered(n)) for n, name in enumerate(LONG_NAMES)],
)
HUGE = Workflow(name="walk.huge", trigger=WorkerTrigger(queue="huge"), steps=[Step("big", huge)])
LONG_ERROR = Workflow(
    name="walk.long_error",
    trigger=WorkerTrigger(queue="long_error"),
    steps=[Step("shout", long_error)],
)
LONG_LINE = Workflow(
    name="walk.long_line", trigger=WorkerTrigger(queue="long_line"), steps=[Step("blob", long_line)]
)
WAITER = Workflow(
    name="walk.waiter",
    trigger=WorkerTrigger(queue="waiter"),
    steps=[wait.for_event("approved", timeout="1h", name="approval")],
)
IMPATIENT = Workflow(
    name="walk.impatient",
    trigger=WorkerTrigger(queue="impatient"),
    steps=[wait.for_event("approved", timeout="50ms", name="approval")],
)

THEN_SHIP = Workflow(
    name="walk.then_ship",
    trigger=WorkerTrigger(queue="then_ship"),
    steps=[wait.for_event("approved", timeout="1h", name="approval"), Step("ship", numbered(1))],
)

# A for_each (its attempts are its steps'), a step whose input is refused before any attempt,
# and one the run never reaches.
HOLDER = Workflow(
    name="walk.holder",
    trigger=WorkerTrigger(queue="holder"),
    steps=[
        for_each("each", "$.body.items", steps=[Step("one", numbered(1))]),
        Step("needs", takes_x, inputs={"x": "$.body.missing"}),
        Step("after", numbered(3)),
    ],
)


def fails_on_15(ctx: Any, n: int) -> int:
    if n == 15:
        raise ValueError("item 15 is bad")
    return n


# A for_each of 30 items whose 15th fails: 15 iterations ran, the 15th failed.
FAN = Workflow(
    name="walk.fan",
    trigger=WorkerTrigger(queue="fan"),
    steps=[
        for_each(
            "each",
            lambda ctx: list(range(1, 31)),
            steps=[Step("one", fails_on_15, inputs={"n": "$.state.each.item"})],
        )
    ],
)


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    flows = [
        FAN,
        FAILING,
        GATEWAY,
        MANY,
        HUGE,
        LONG_LINE,
        LONG_ERROR,
        WAITER,
        IMPATIENT,
        THEN_SHIP,
        HOLDER,
    ]
    async with Engine(workflows=flows, grace_period=0.5) as engine:
        yield engine


async def _ended(engine: Engine, queue: str) -> Run:
    job_id = await engine.enqueue(queue, {})
    return await engine.wait_for_job(job_id, timeout=10)


async def _waiting(engine: Engine, queue: str) -> Run:
    return await run_when(engine, await engine.enqueue(queue, {}), RunStatus.WAITING)


async def _open(pilot: Pilot[Any], run_id: str) -> RunScreen:
    await command(pilot, f"run {run_id}")
    screen = pilot.app.screen
    assert isinstance(screen, RunScreen) and screen.run is not None
    await settled(pilot)
    return screen


@asynccontextmanager
async def _ended_open(
    engine: Engine, queue: str, size: tuple[int, int] = (140, 40)
) -> AsyncIterator[tuple[Pilot[Any], RunScreen]]:
    """A run of the queue's workflow that ended, open in a console of `size`."""
    run = await _ended(engine, queue)
    app = BlokApp(engine)
    async with app.run_test(size=size) as pilot:
        await settled(pilot)
        yield pilot, await _open(pilot, run.id)


def _many_open(
    engine: Engine, size: tuple[int, int] = (140, 40)
) -> AbstractAsyncContextManager[tuple[Pilot[Any], RunScreen]]:
    """A run of thirty long-named steps that ended, open in a console of `size`."""
    return _ended_open(engine, "many", size)


def _highlight_in_view(rail: StepRail) -> bool:
    highlighted = rail.highlighted
    if highlighted is None or highlighted not in rail._index_to_line:
        return False
    line = rail._index_to_line[highlighted]
    top = int(rail.scroll_y)
    return top <= line < top + rail.scrollable_content_region.height


# ---- a long run error: its first lines, where the rest is; the rail keeps its room ------------
@pytest.mark.parametrize("size", [(140, 40), (80, 24)])
async def test_a_long_error_shows_its_first_lines_and_leaves_the_rail_its_room(
    engine: Engine, size: tuple[int, int]
) -> None:
    run = await _ended(engine, "failing")
    app = BlokApp(engine)
    async with app.run_test(size=size) as pilot:
        await settled(pilot)
        screen = await _open(pilot, run.id)
        header = shown_lines(screen.query_one("#run-header", Static))
        most = 3 if size[1] >= 30 else 2
        first = next(n for n, line in enumerate(header) if "failed: Multi-line" in line)
        note = next(n for n, line in enumerate(header) if "more lines" in line)
        assert note - first <= most, header  # its first lines, then where the rest is
        assert re.search(r"… \d+ more lines: step explode has the whole error", header[note])
        rail = screen.query_one(StepRail)
        assert rail.size.height >= 1 and _highlight_in_view(rail)
        assert rail.region.bottom <= size[1] - 1  # above the footer, on screen
        # The whole error is in the step's attempts.
        assert f"line {ERROR_LINES - 1}:" in text_of(screen.query_one(AttemptsView), size[0])
        await pilot.press("pagedown", "pageup", "end", "home")  # raised KeyError: 0
        await settled(pilot)
        assert app.screen is screen


async def test_the_page_keys_on_a_rail_squeezed_to_no_height_do_nothing(engine: Engine) -> None:
    async with _many_open(engine) as (pilot, screen):
        rail = screen.query_one(StepRail)
        rail.styles.min_height = rail.styles.max_height = rail.styles.height = 0
        await until(pilot, lambda: rail.size.height == 0)
        highlighted = rail.highlighted
        rail.focus()
        await pilot.press("pagedown", "pageup")
        await settled(pilot)
        assert pilot.app.screen is screen and rail.highlighted == highlighted


async def test_a_run_error_no_step_holds_is_shown_whole_under_the_header(engine: Engine) -> None:
    async with _many_open(engine) as (pilot, screen):
        error = "the engine gave up:\n" + "\n".join(f"reason {n}" for n in range(20))
        assert screen.run is not None
        screen.run = screen.run.model_copy(update={"error": error, "status": RunStatus.CRASHED})
        screen.render_run()
        await settled(pilot)
        header = text_of(screen.query_one("#run-header", Static))
        assert "… 18 more lines: the run error below has them all" in header
        whole = screen.query_one("#run-error", Static)
        assert whole.display and "reason 19" in text_of(whole)


# ---- the step names: the room there is, and "…" where cut -------------------------------------
@pytest.mark.parametrize(("width", "whole"), [(140, False), (200, True), (80, False)])
async def test_the_rail_gives_step_names_its_room_and_marks_a_cut_one(
    engine: Engine, width: int, whole: bool
) -> None:
    async with _many_open(engine, (width, 40)) as (_, screen):
        rail = screen.query_one(StepRail)
        lines = [str(rail.get_option_at_index(n).prompt) for n in range(rail.option_count)]
        assert len(lines) == len(LONG_NAMES)
        for line, name in zip(lines, LONG_NAMES, strict=True):
            shown = line[2:].split(" ", 1)[0]  # after the status icon
            if whole:
                assert shown == name, line
            else:
                assert shown.endswith("…") and name.startswith(shown[:-1]), line
                assert len(shown) > 16, line  # more than the 15 columns it had
        assert all(len(line) <= rail.room for line in lines)  # none wraps onto two rows
        # The timeline too (it cut them at 18, with no "…").
        drawn = timeline(screen.run, screen.blok.now(), width - 2).plain  # type: ignore[arg-type]
        assert (LONG_NAMES[0] if width >= 140 else LONG_NAMES[0][:20]) in drawn


# ---- the selected step is in sight on open ------------------------------------------------------
@pytest.mark.parametrize("size", [(140, 40), (80, 24)])
async def test_the_rail_opens_scrolled_to_its_selected_step(
    engine: Engine, size: tuple[int, int]
) -> None:
    async with _many_open(engine, size) as (pilot, screen):
        rail = screen.query_one(StepRail)
        assert rail.highlighted == len(LONG_NAMES) - 1  # the last that ran
        await until(pilot, lambda: _highlight_in_view(rail))
        # In sight on screen too: not under the footer (at 80x24 the rail was one row taller
        # than its column).
        assert rail.region.bottom <= screen.query_one("#rail-column").region.bottom


async def test_j_and_k_move_the_rail_as_they_move_the_tables(engine: Engine) -> None:
    async with _many_open(engine) as (pilot, screen):
        rail = screen.query_one(StepRail)
        last = len(LONG_NAMES) - 1
        assert rail.has_focus and rail.highlighted == last
        await pilot.press("k", "k")
        assert rail.highlighted == last - 2
        await pilot.press("j")
        assert rail.highlighted == last - 1


# ---- a view being opened ------------------------------------------------------------------------
async def test_the_apps_timers_and_events_wait_for_a_view_being_opened(engine: Engine) -> None:
    """The app's flush of the engine's changes, a reload error and its tick reached a view
    pushed but not composed yet: NoMatches on its banner ended the console (seen in CI)."""
    run = await _ended(engine, "many")
    app = BlokApp(engine)
    async with app.run_test(size=(140, 40)) as pilot:
        await settled(pilot)
        app.open_run(run.id)
        screen = app.screen
        assert isinstance(screen, RunScreen) and not screen.is_mounted
        app._changes.runs.add(run.id)
        await app._flush_changes()  # no await on the way: the view is still being opened
        assert not screen.is_mounted and app._changes.runs == {run.id}  # kept for it
        app.reload_errors["flows/x.py"] = "flows/x.py:1: SyntaxError: invalid syntax"
        app._show_reload_errors()
        await app._tick()
        await settled(pilot)
        assert app.screen is screen and screen.is_mounted and not app._changes
        assert "SyntaxError" in text_of(screen.query_one(ReloadBanner))


# ---- an event wait that has ended says how -----------------------------------------------------
async def test_an_ended_event_wait_says_how_it_ended(engine: Engine) -> None:
    cancelled = await _waiting(engine, "waiter")
    await engine.cancel(cancelled.id)
    got = await _waiting(engine, "waiter")
    await engine.send_event(got.id, "approved", {"ok": True})
    got = await engine.wait_for_job(got.job_id, timeout=10)
    timed_out = await _ended(engine, "impatient")
    waiting = await _waiting(engine, "waiter")
    app = BlokApp(engine)
    async with app.run_test(size=(140, 40)) as pilot:
        await settled(pilot)
        said = {}
        for run in (cancelled, got, timed_out, waiting):
            screen = await _open(pilot, run.id)
            title = text_of(screen.query_one("#step-title", Static))
            attempts = text_of(screen.query_one(AttemptsView)).strip()
            said[run.id] = (title, attempts)
        title, attempts = said[cancelled.id]
        assert "✉ cancelled while waiting for event 'approved'" in title, title
        assert "waited" not in title and attempts == "an event wait: no attempts"
        title, attempts = said[got.id]
        assert re.search(r"✉ got event 'approved' at \d\d:\d\d:\d\d", title), title
        assert attempts == "an event wait: no attempts"
        title, _ = said[timed_out.id]
        assert re.search(r"✉ no event 'approved' before its timeout at \d\d:\d\d:\d\d", title)
        title, attempts = said[waiting.id]
        assert "✉ waits for event 'approved'; times out at" in title
        assert attempts == "waits for an event: no attempts"
    await engine.cancel(waiting.id)


async def test_a_step_an_ended_run_never_reached_says_so(engine: Engine) -> None:
    """Cancelled while it waited, the run's next step read "pending", its output "none yet",
    as if it were still to come."""
    cancelled = await _waiting(engine, "then_ship")
    await engine.cancel(cancelled.id)
    waiting = await _waiting(engine, "then_ship")
    app = BlokApp(engine)
    async with app.run_test(size=(140, 40)) as pilot:
        await settled(pilot)
        said = []
        for run in (cancelled, waiting):
            screen = await _open(pilot, run.id)
            rail = screen.query_one(StepRail)
            rail.highlighted = rail.option_of(1)
            await settled(pilot)
            title = text_of(screen.query_one("#step-title", Static))
            said.append((title, text_of(screen.query_one("#step-output", Static)).strip()))
    [(ended_title, ended_output), (waiting_title, waiting_output)] = said
    assert "ship" in ended_title and "not reached: the run ended before it" in ended_title
    assert ended_output == "none"
    assert "ship" in waiting_title and "not reached" not in waiting_title
    assert waiting_output == "none yet"
    await engine.cancel(waiting.id)


async def test_a_step_without_attempts_says_why_it_has_none(engine: Engine) -> None:
    """Each said "no attempts yet", as if one were to come: a for_each that had completed, a
    step whose input was refused, a step its failed run never reached."""
    ended = await engine.wait_for_job(await engine.enqueue("holder", {"items": [1, 2]}), timeout=10)
    assert ended.status is RunStatus.FAILED
    waiting = await _waiting(engine, "then_ship")
    app = BlokApp(engine)
    async with app.run_test(size=(140, 40)) as pilot:
        await settled(pilot)
        said = {}
        for run, names in ((ended, ("each", "one", "needs", "after")), (waiting, ("ship",))):
            screen = await _open(pilot, run.id)
            rail = screen.query_one(StepRail)
            for name in names:
                step = next(step for step in run.steps if step.name == name)
                rail.highlighted = rail.option_of(step.index)
                await settled(pilot)
                said[name] = text_of(screen.query_one(AttemptsView)).strip()
    assert said["each"] == "a for_each: no attempts of its own; its steps have them"
    assert said["one"].split()[:3] == ["#", "status", "took"]  # its own attempts, a table
    assert said["needs"] == "no attempts: it failed before its function was called"
    assert said["after"] == "no attempts"
    assert said["ship"] == "no attempts yet"  # its run waits: one is to come
    await engine.cancel(waiting.id)


# ---- the search: as typed, and esc ends it -----------------------------------------------------
async def test_the_search_shows_the_pattern_as_typed_and_esc_in_its_box_clears_it(
    engine: Engine,
) -> None:
    run = await _ended(engine, "huge")
    app = BlokApp(engine)
    async with app.run_test(size=(140, 40)) as pilot:
        await settled(pilot)
        screen = await _open(pilot, run.id)
        output_title = screen.query_one("#output-title", Static)
        await pilot.press("slash", "left_square_bracket", "left_parenthesis", "backslash")
        await until(pilot, lambda: screen.search == "[(\\")
        await settled(pilot)
        title = text_of(output_title)
        assert "0 of 4,002 lines match '[(\\'" in title, title  # repr() showed '[(\\\\'
        assert "esc clears" in title
        assert "no line matches '[(\\'" in text_of(screen.query_one("#step-output", Static))
        await pilot.press("escape")
        await settled(pilot)
        assert screen.search == "" and "match" not in text_of(output_title)
        assert app.screen is screen  # the first esc ends the search, it does not leave
        # Kept with enter, then ended with esc from the rail.
        await pilot.press("slash", "x", "enter")
        await settled(pilot)
        assert screen.search == "x" and "esc clears" in text_of(output_title)
        await pilot.press("escape")
        await settled(pilot)
        assert screen.search == "" and app.screen is screen


# ---- a large output unfolds with a sign; tab goes where there is something to scroll ----------
async def test_unfolding_a_large_output_says_so_first(engine: Engine) -> None:
    run = await _ended(engine, "huge")
    app = BlokApp(engine)
    async with app.run_test(size=(140, 40)) as pilot:
        await settled(pilot)
        screen = await _open(pilot, run.id)
        output_title = screen.query_one("#output-title", Static)
        assert "the first 40 shown: z unfolds" in text_of(output_title)
        screen.action_unfold()
        assert "unfolding…" in text_of(output_title)  # before the lines are drawn
        await until(pilot, lambda: "the first 2,000 shown" in text_of(output_title))
        screen.action_unfold()  # folding back is quick: no sign
        assert "the first 40 shown" in text_of(output_title)


async def test_an_output_of_one_very_long_line_is_cut_and_a_search_finds_inside_it(
    engine: Engine,
) -> None:
    # A step that returned a 20 MB string: the run view laid out every cell of its one line,
    # the console frozen at full CPU for good.
    async with _ended_open(engine, "long_line") as (pilot, screen):
        title = text_of(screen.query_one("#output-title", Static))
        assert "a line cut to 2,000 of its 600,018 characters" in title, title
        output = text_of(screen.query_one("#step-output", Static), width=140)
        assert (
            len(output) < 4_000
            and "… (598,018 more characters: blok-tui show --json has them)" in output
        )
        await pilot.press("slash", *"needle", "enter")
        await until(pilot, lambda: screen.search == "needle")
        await settled(pilot)
        found = text_of(screen.query_one("#step-output", Static), width=140)
        assert "NEEDLE" in found and "…xxx" in found and len(found) < 4_000, found[:300]


async def test_a_very_long_error_and_log_line_are_cut_where_the_run_view_shows_them(
    engine: Engine,
) -> None:
    # An error that quoted a 5 MB response body froze the console as a long output did.
    async with _ended_open(engine, "long_error") as (_, screen):
        for shown in ("#run-header", "#step-title", "#step-log"):
            text = text_of(screen.query_one(shown, Static), width=140)
            assert len(text) < 5_000, (shown, len(text))
        log = text_of(screen.query_one("#step-log", Static), width=140)
        assert "… (298,006 more characters" in log, log[-300:]
        attempts = "".join(line.strip() for line in shown_lines(screen.query_one(AttemptsView)))
        assert len(attempts) < 10_000 and "morecharacters:" in attempts.replace(" ", "")


async def test_tab_skips_a_run_log_with_nothing_to_scroll(engine: Engine) -> None:
    run = await _ended(engine, "huge")
    app = BlokApp(engine)
    async with app.run_test(size=(140, 40)) as pilot:
        await settled(pilot)
        screen = await _open(pilot, run.id)
        assert isinstance(app.focused, StepRail)
        await pilot.press("tab")
        await settled(pilot)
        assert app.focused is screen.query_one("#detail")  # the output, which scrolls


# ---- the attempts table: the error column has the room ----------------------------------------
async def test_the_attempts_error_column_has_the_room_the_others_leave(engine: Engine) -> None:
    run = await _ended(engine, "gateway")
    app = BlokApp(engine)
    async with app.run_test(size=(140, 40)) as pilot:
        await settled(pilot)
        screen = await _open(pilot, run.id)
        lines = shown_lines(screen.query_one(AttemptsView))
        table = lines[: next(n for n, line in enumerate(lines) if "traceback" in line)]
        assert len(table) == 1 + 3 + 1, table  # a heading, a line an attempt, a blank line
        for attempt in (1, 2, 3):
            error = f"gateway 503 for order A1 (attempt {attempt} of 3)"
            assert any(error in line for line in table), table  # on its line, not wrapped
        assert re.search(r"\s1/3 .*of 3\)\s+retry in \S+ms$", table[1]), table  # then its backoff


def test_a_traceback_line_too_long_for_the_pane_goes_on_under_its_own_indent() -> None:
    # As one Text, "line 18, in upload" went on in the pane's first column, where it read
    # as a line of its own.
    from rich.console import Console

    from blok_tui.widgets.attempts import indented

    traceback = (
        "Traceback (most recent call last):\n"
        '  File "/work/examples/exports.py", line 18, in upload\n'
        "    await anyio.sleep(size_mb / 20)\n"
        "TimeoutError: timed out"
    )
    console = Console(width=40, record=True, color_system=None)
    console.print(indented(traceback, style="grey70"))
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    frame = next(n for n, line in enumerate(lines) if line.startswith('  File "'))
    assert lines[frame + 1].startswith("  ") and not lines[frame + 1].startswith("   ")
    assert "18, in upload" in lines[frame + 1]
    assert lines[frame + 2] == "    await anyio.sleep(size_mb / 20)"


# ---- a long for_each: its first and last iterations and the one that failed ----------------
async def test_a_long_for_each_shows_its_ends_and_its_failure_and_enter_shows_the_rest(
    engine: Engine,
) -> None:
    """The rail listed every iteration, two lines each (a for_each of 2,000 items: 4,000 lines
    to scroll through for the one that failed); `blok-tui show` folded them."""
    async with _ended_open(engine, "fan") as (pilot, screen):
        rail = screen.query_one(StepRail)
        lines = [str(rail.get_option_at_index(n).prompt) for n in range(rail.option_count)]
        headers = [line.strip() for line in lines if "▾ iteration" in line]
        assert headers == [f"▾ iteration {n}  1 step" for n in (1, 2, 3, 14, 15)], lines
        [fold] = [n for n, line in enumerate(lines) if "… 10 more completed" in line]
        title = screen.query_one("#step-title", Static)
        assert "iteration 15 › one  ✗ failed" in text_of(title)  # the step that explains the run
        rail.highlighted = fold
        await pilot.press("enter")
        await settled(pilot)
        lines = [str(rail.get_option_at_index(n).prompt) for n in range(rail.option_count)]
        assert sum("▾ iteration" in line for line in lines) == 15
        assert "iteration 4 › one" in text_of(title)


async def test_the_timeline_folds_a_long_for_each_as_the_rail_does_and_a_shows_it_all(
    engine: Engine,
) -> None:
    """The timeline drew every iteration, two lines each: 4,000 lines for a for_each of
    2,000 items, a second and a half to open (0.3 s folded)."""
    async with _ended_open(engine, "fan") as (pilot, _):
        await pilot.press("T")
        await settled(pilot)
        timeline_screen = pilot.app.screen
        assert isinstance(timeline_screen, TimelineScreen)

        def drawn() -> list[str]:
            return text_of(timeline_screen.query_one("#timeline", Static)).splitlines()

        def iterations() -> list[int]:
            return [int(m[1]) for line in drawn() if (m := re.search(r"▾ iteration (\d+)", line))]

        assert iterations() == [1, 2, 3, 14, 15]
        [fold] = [line for line in drawn() if "… 10 more completed" in line]
        assert "─" in fold  # over the time the ten took
        assert "a all iterations" in text_of(timeline_screen.query_one(KeyBar))
        await pilot.press("a")
        await settled(pilot)
        assert iterations() == list(range(1, 16))
        assert not any("more completed" in line for line in drawn())
        await pilot.press("a")
        await settled(pilot)
        assert iterations() == [1, 2, 3, 14, 15]
