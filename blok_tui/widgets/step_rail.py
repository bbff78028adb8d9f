"""The step rail: every step of a run in order, with status icon, a duration bar scaled to the
run's slowest step, attempt count and badges (cached, waiting until HH:MM:SS, timed out).

Nested steps (of for_each, loop, switch, try_catch) sit under their parent, grouped under a
header per iteration, case, try or catch arm; middleware steps come first with a `mw:<name>`
badge, and subworkflow steps carry `↳ sub` (waits for its child) or `↳ async`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, tzinfo
from typing import Any, ClassVar, Literal

from rich.cells import cell_len, set_cell_size
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from engine import Run, StepRun

from ..console import clock_time, duration, printable, status_style, status_text
from ..step_order import Row, fold_said, folded_groups, is_fold, own_tags, rail_rows, step_ms

BAR_WIDTH = 8
# The step names' column: as wide as the longest name where the rail has the room, never
# narrower than these (a step with many badges lets them wrap rather than cut its name).
NAME_WIDTH = 15
NARROW_NAME_WIDTH = 12
BADGES = {"sub": "↳ sub", "async": "↳ async"}


def _bar(ms: float | None, longest: float, style: str) -> Text:
    if ms is None or longest <= 0:
        return Text("·" * BAR_WIDTH, style="grey23")
    filled = ms / longest * BAR_WIDTH
    whole = int(filled)
    partial = filled - whole
    text = Text("━" * whole, style=style)
    if whole < BAR_WIDTH:
        text.append("╸" if partial >= 0.5 else "", style=style)
    text.append("─" * (BAR_WIDTH - text.cell_len), style="grey23")
    return text


def cut(name: str, width: int) -> str:
    """`name` in `width` cells: padded, or cut with "…" (a bare cut at a fixed width made
    charge_customer_card and charge_customer_refund the same "charge_customer")."""
    if cell_len(name) <= width:
        return set_cell_size(name, width)
    return set_cell_size(name, width - 1) + "…"


def step_line(
    step: StepRun,
    longest: float,
    now: datetime,
    tz: tzinfo | None,
    depth: int = 0,
    *,
    narrow: bool = False,
    typical: Text | None = None,
    names: int | None = None,
) -> Text:
    """One step on the rail. `narrow`: no bar and one badge at most (an 80-column terminal).
    `typical`: the step's usual duration over recent runs, shown after its own. `names`: the
    columns of the name column (with a nested step's indent); a longer name ends in "…"."""
    status = str(step.status)
    line = Text("  " * depth)
    line.append_text(status_text(status, steps=True, label=False))
    if names is None:
        names = NARROW_NAME_WIDTH if narrow else NAME_WIDTH
    width = max(6, names - 2 * depth)
    name = cut(printable(step.name), width)
    line.append(f" {name} ", style="bold" if status == "running" else "")
    ms = step_ms(step, now)
    if not narrow:
        line.append_text(_bar(ms, longest, status_style(status, steps=True)))
    line.append(f" {duration(ms) if ms is not None else '':>7}")
    if typical is not None:
        line.append_text(typical)
    tries = len(step.attempts)
    # "1/4": attempts made of the step's budget; none made (cached, skipped, not yet reached)
    # says nothing, and "0/4" read as four failures to come.
    if tries and (step.max_attempts > 1 or tries > 1):
        failed = sum(1 for a in step.attempts if a.error)
        line.append(f"  {tries}/{step.max_attempts}", style="red1" if failed else "dim")
    badges: list[tuple[str, str]] = []
    if status == "cached" or step.cached_from:
        badges.append(("cached", "medium_purple1"))
    if step.wait_until is not None and status == "waiting":
        badges.append((f"until {clock_time(step.wait_until, tz)}", "khaki1"))
    if step.timed_out or any(str(a.status) == "timed_out" for a in step.attempts):
        badges.append(("timed out", "bold dark_orange"))
    last = step.attempts[-1] if step.attempts else None
    if status == "running" and last is not None and last.backoff_ms and last.finished_at:
        badges.append(("backing off", "khaki3"))
    for tag in own_tags(step):
        if tag in BADGES:
            badges.append((BADGES[tag], "deep_sky_blue1"))
        elif tag.startswith("mw:"):
            badges.append((tag, "plum2"))
        else:
            badges.append((tag, "grey62"))
    if narrow:  # no room for words: the status icon says it, the step's detail says more
        return line
    for badge, style in badges:
        line.append("  ")
        line.append(f" {badge} ", style=f"{style} reverse")
    return line


def header_line(label: str, depth: int, steps: list[StepRun]) -> Text:
    line = Text("  " * depth)
    failed = any(str(s.status) == "failed" for s in steps)
    line.append("▾ ", style="grey50")
    line.append(label, style="bold red1" if failed else "bold grey70")
    line.append(f"  {len(steps)} step{'s' if len(steps) != 1 else ''}", style="grey42")
    return line


def fold_line(label: str, depth: int, room: int) -> Text:
    """A stretch of iterations left out, "… 35 more completed", and how to see them where the
    rail has the room ("iteration 4 to iteration 38" is plain from the rows around it)."""
    said = f"{'  ' * depth}{fold_said(label)}"
    line = Text(said if not room else cut(said, room).rstrip(), style="grey70")
    if not room or line.cell_len + len(FOLD_HINT) <= room:
        line.append(FOLD_HINT, style="grey42")
    return line


FOLD_HINT = "  enter shows them"


class StepRail(OptionList):
    DEFAULT_CSS = """
    StepRail, StepRail:focus { height: auto; max-height: 50%; border: none; padding: 0; }
    """

    # j and k as the tables have them (k9s's, vi's).
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("k", "cursor_up", "up", show=False),
        Binding("j", "cursor_down", "down", show=False),
    ]

    # Until the operator moves the cursor, the rail follows the step that explains the run.
    moved_by_hand = False
    # A long for_each is shown by its first and last iterations and those that did not end
    # well, as `blok-tui show` prints it (a rail of 2,000 items was 4,000 lines to scroll
    # through for the one that failed); enter on the stretch left out shows them all.
    every_group = False

    def action_select(self) -> None:
        """Enter: on a stretch of iterations left out, shows them; else the step's own."""
        row = self.rows[self.highlighted] if self.highlighted is not None else None
        if row is None or not is_fold(row[2]) or self.shown is None:
            super().action_select()
            return
        self.every_group = self.moved_by_hand = True
        run, now, tz, narrow, typical = self.shown
        self.show(run, now, tz, narrow=narrow, typical=typical)  # on the step above the stretch
        super().action_cursor_down()  # the first step of the first iteration it had left out

    def action_cursor_up(self) -> None:
        self.moved_by_hand = True
        super().action_cursor_up()

    def action_cursor_down(self) -> None:
        self.moved_by_hand = True
        super().action_cursor_down()

    def action_first(self) -> None:
        self.moved_by_hand = True
        super().action_first()

    def action_last(self) -> None:
        self.moved_by_hand = True
        super().action_last()

    def action_page_up(self) -> None:
        self.page(-1)

    def action_page_down(self) -> None:
        self.page(1)

    def page(self, direction: Literal[-1, 1]) -> None:
        """OptionList's page keys, but not on a rail with no lines laid out."""
        if self.highlighted is None:
            self.moved_by_hand = True
            self.highlighted = 0 if direction < 0 else len(self.options) - 1
        elif self.laid_out:
            self.moved_by_hand = True
            self._move_page(direction)

    @property
    def laid_out(self) -> bool:
        """Whether the rail has lines to page through: OptionList pages by its lines, and a
        rail squeezed to no height has none (its page keys raised KeyError: 0)."""
        return self.highlighted in self._index_to_line

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rows: list[Row] = []
        # What was last shown, to lay the names out again at a new width.
        self.shown: tuple[Run, datetime, tzinfo | None, bool, dict[str, Text]] | None = None
        self.names_room = 0  # the width the names were laid out for

    def on_resize(self) -> None:
        if self.shown is not None and self.room != self.names_room:
            run, now, tz, narrow, typical = self.shown
            self.show(run, now, tz, narrow=narrow, typical=typical)
        # Opened before it had a size, the rail could not scroll to its highlighted step.
        self.call_after_refresh(self.scroll_to_highlight)

    @property
    def room(self) -> int:
        """The columns a step's line has (a scrollbar's are kept, shown or not: a line one
        column too long wraps onto two)."""
        if not self.size.width:
            return 0
        padding = self.get_component_styles("option-list--option").padding.width
        scrollbar = self.styles.scrollbar_size_vertical
        return self.size.width - self.styles.gutter.width - scrollbar - padding

    def step_index(self, option: int | None = None) -> int | None:
        """The index in run.steps of the step on an option (the highlighted one by default);
        a group header belongs to the step above it."""
        option = self.highlighted if option is None else option
        if option is None or not self.rows:
            return None
        for index, _, _, _ in reversed(self.rows[: option + 1]):
            if index is not None:
                return index
        return None

    def show(
        self,
        run: Run,
        now: datetime,
        tz: tzinfo | None,
        *,
        narrow: bool = False,
        typical: dict[str, Text] | None = None,
    ) -> None:
        """`typical`: per step name, its usual duration over recent runs (p50/p95)."""
        typical = typical or {}
        self.shown = (run, now, tz, narrow, typical)
        keep = self.step_index()
        durations = [step_ms(s, now) or 0.0 for s in run.steps]
        longest = max(durations, default=0.0)
        rows = rail_rows(run) if self.every_group else folded_groups(run, rail_rows(run))
        by_index = {s.index: s for s in run.steps}
        by_parent: dict[int | None, list[StepRun]] = {}
        for step in run.steps:
            by_parent.setdefault(step.parent, []).append(step)

        def line(step: StepRun, depth: int, names: int | None) -> Text:
            return step_line(
                step,
                longest,
                now,
                tz,
                depth,
                narrow=narrow,
                typical=None if narrow else typical.get(step.name),
                names=names,
            )

        steps = [(by_index[index], depth) for index, depth, _, _ in rows if index is not None]
        names = self.name_columns(steps, line, NARROW_NAME_WIDTH if narrow else NAME_WIDTH)
        options = []
        for index, depth, label, parent in rows:
            if index is None and is_fold(label):
                options.append(Option(fold_line(label, depth, self.room)))
            elif index is None:
                members = [s for s in by_parent.get(parent, []) if s.tags[:1] == [label]]
                options.append(Option(header_line(label, depth, members), disabled=True))
            else:
                options.append(Option(line(by_index[index], depth, names)))
        self.set_class(not options, "-empty")
        if rows == self.rows:
            for n, option in enumerate(options):
                self.replace_option_prompt_at_index(n, option.prompt)
            return
        self.rows = rows
        self.set_options(options)
        if options:
            wanted = keep if keep is not None and keep in by_index else _focus_step(run)
            self.highlighted = self.option_of(wanted)

    def name_columns(
        self,
        steps: list[tuple[StepRun, int]],
        line: Callable[[StepRun, int, int], Text],
        least: int,
    ) -> int | None:
        """The name column's width: the longest name (with its indent) where the rail has the
        room for it beside the other columns and the badges, else what room there is, but no
        less than `least` (None: the rail has no width yet)."""
        room = self.names_room = self.room
        if not room or not steps:
            return None
        wanted = max(2 * depth + cell_len(printable(step.name)) for step, depth in steps)
        # The other columns of each line: its length with a 6-column name, less that name.
        others = max(
            line(step, depth, 2 * depth + 6).cell_len - 2 * depth - 6 for step, depth in steps
        )
        return max(least, min(wanted, room - others))

    def option_of(self, step_index: int) -> int:
        for n, (index, _, _, _) in enumerate(self.rows):
            if index == step_index:
                return n
        return 0


def _focus_step(run: Run) -> int:
    """The step that explains the run: the failed one, else the one in flight, else the
    last that ran."""
    for wanted in ("failed", "running", "waiting"):
        # The innermost step of that status explains the most (a parent fails with its child).
        matching = [s.index for s in run.steps if str(s.status) == wanted]
        if matching:
            nested = [s.index for s in run.steps if s.index in matching and s.parent is not None]
            return (nested or matching)[0]
    ran = [step.index for step in run.steps if step.started_at is not None]
    return ran[-1] if ran else 0
