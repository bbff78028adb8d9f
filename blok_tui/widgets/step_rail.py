"""The step rail: every step of a run in order, with status icon, a duration bar scaled to the
run's slowest step, attempt count and badges (cached, waiting until HH:MM:SS, timed out).

Nested steps (of for_each, loop, switch, try_catch) sit under their parent, grouped under a
header per iteration, case, try or catch arm; middleware steps come first with a `mw:<name>`
badge, and subworkflow steps carry `↳ sub` (waits for its child) or `↳ async`."""

from __future__ import annotations

from datetime import datetime, tzinfo
from typing import Any

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from engine import Run, StepRun

from ..console import clock_time, duration, printable, status_style, status_text
from ..step_order import Row, own_tags, rail_rows, step_ms

BAR_WIDTH = 8
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


def step_line(
    step: StepRun,
    longest: float,
    now: datetime,
    tz: tzinfo | None,
    depth: int = 0,
    *,
    narrow: bool = False,
    typical: Text | None = None,
) -> Text:
    """One step on the rail. `narrow`: no bar and one badge at most (an 80-column terminal).
    `typical`: the step's usual duration over recent runs, shown after its own."""
    status = str(step.status)
    line = Text("  " * depth)
    line.append_text(status_text(status, steps=True, label=False))
    width = max(6, (NARROW_NAME_WIDTH if narrow else NAME_WIDTH) - 2 * depth)
    name = printable(step.name)
    line.append(f" {name:<{width}.{width}} ", style="bold" if status == "running" else "")
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


class StepRail(OptionList):
    DEFAULT_CSS = """
    StepRail, StepRail:focus { height: auto; max-height: 50%; border: none; padding: 0; }
    """

    # Until the operator moves the cursor, the rail follows the step that explains the run.
    moved_by_hand = False

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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rows: list[Row] = []

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
        keep = self.step_index()
        durations = [step_ms(s, now) or 0.0 for s in run.steps]
        longest = max(durations, default=0.0)
        rows = rail_rows(run)
        by_index = {s.index: s for s in run.steps}
        by_parent: dict[int | None, list[StepRun]] = {}
        for step in run.steps:
            by_parent.setdefault(step.parent, []).append(step)
        options = []
        for index, depth, label, parent in rows:
            if index is None:
                members = [s for s in by_parent.get(parent, []) if s.tags[:1] == [label]]
                options.append(Option(header_line(label, depth, members), disabled=True))
            else:
                step = by_index[index]
                options.append(
                    Option(
                        step_line(
                            step,
                            longest,
                            now,
                            tz,
                            depth,
                            narrow=narrow,
                            typical=None if narrow else typical.get(step.name),
                        )
                    )
                )
        if rows == self.rows:
            for n, option in enumerate(options):
                self.replace_option_prompt_at_index(n, option.prompt)
            return
        self.rows = rows
        self.set_options(options)
        if options:
            wanted = keep if keep is not None and keep in by_index else _focus_step(run)
            self.highlighted = self.option_of(wanted)

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
