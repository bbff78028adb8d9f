"""The step rail: every step of a run in order, with status icon, a duration bar scaled to the
run's slowest step, attempt count and badges (cached, waiting until HH:MM:SS, timed out)."""

from __future__ import annotations

from datetime import datetime, tzinfo

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from engine import Run, StepRun

from ..console import clock_time, duration, status_style, status_text

BAR_WIDTH = 8


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


def step_line(step: StepRun, longest: float, now: datetime, tz: tzinfo | None) -> Text:
    status = str(step.status)
    line = Text()
    line.append_text(status_text(status, steps=True, label=False))
    line.append(f" {step.name:<15.15} ", style="bold" if status == "running" else "")
    ms = _step_ms(step, now)
    line.append_text(_bar(ms, longest, status_style(status, steps=True)))
    line.append(f" {duration(ms) if ms is not None else '':>7}")
    tries = len(step.attempts)
    if step.max_attempts > 1 or tries > 1:
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
    badges.extend((tag, "grey62") for tag in step.tags)
    for badge, style in badges:
        line.append("  ")
        line.append(f" {badge} ", style=f"{style} reverse")
    return line


def _step_ms(step: StepRun, now: datetime) -> float | None:
    if step.started_at is None:
        return None
    end = step.finished_at or now
    return max(0.0, (end - step.started_at).total_seconds() * 1000)


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

    def show(self, run: Run, now: datetime, tz: tzinfo | None) -> None:
        keep = self.highlighted
        durations = [_step_ms(s, now) or 0.0 for s in run.steps]
        longest = max(durations, default=0.0)
        options = [Option(step_line(s, longest, now, tz)) for s in run.steps]
        if len(options) == self.option_count:
            for index, option in enumerate(options):
                self.replace_option_prompt_at_index(index, option.prompt)
            return
        self.set_options(options)
        if options:
            self.highlighted = (
                keep if keep is not None and keep < len(options) else _focus_step(run)
            )


def _focus_step(run: Run) -> int:
    """The step that explains the run: the failed one, else the one in flight, else the
    last that ran."""
    for wanted in ("failed", "running", "waiting"):
        for position, step in enumerate(run.steps):
            if str(step.status) == wanted:
                return position
    ran = [n for n, step in enumerate(run.steps) if step.started_at is not None]
    return ran[-1] if ran else 0
