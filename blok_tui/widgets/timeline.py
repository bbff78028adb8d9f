"""A run on one time axis: the queue delay before it started, then every step and each of its
attempts as a bar, with the backoff gaps between attempts and the waits drawn as such."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from rich.cells import cell_len
from rich.text import Text

from engine import Run, StepRun

from ..console import duration, printable, status_style
from ..step_order import Row, fold_said, folded_groups, is_fold, rail_rows, step_end, step_ms
from .step_rail import cut

LABEL = 18  # columns for the step names at least; as many as the longest takes, up to half
TOOK = 8  # columns for the durations
ATTEMPT = "█"
GAP = "╌"  # waiting between attempts (backoff)
WAIT = "┄"  # a wait step holding no worker
QUEUED = "░"
FOLDED = "─"  # a stretch of iterations left out: from the first start to the last end


class Axis:
    def __init__(self, start: datetime, end: datetime, width: int) -> None:
        self.start = start
        self.span = max((end - start).total_seconds(), 0.001)
        self.width = max(10, width)

    def at(self, moment: datetime) -> int:
        offset = (moment - self.start).total_seconds() / self.span
        return max(0, min(self.width - 1, int(offset * (self.width - 1))))

    def scale(self) -> Text:
        """The axis: 0 at the left, the run's whole span at the right, the middle between."""
        line = [" "] * self.width
        marks = {0: "0", self.width // 2: duration(self.span * 500), self.width - 1: None}
        for col, label in marks.items():
            text = label if label is not None else duration(self.span * 1000)
            start = col if col < self.width - len(text) else self.width - len(text)
            for n, char in enumerate(text):
                line[start + n] = char
        return Text("".join(line), style="grey50")


def _paint(cells: list[tuple[str, str]], start: int, end: int, char: str, style: str) -> None:
    for col in range(start, max(start, end) + 1):
        if 0 <= col < len(cells):
            cells[col] = (char, style)


def _bar(cells: list[tuple[str, str]]) -> Text:
    text = Text()
    for char, style in cells:
        text.append(char, style=style)
    return text


def step_bar(step: StepRun, axis: Axis, now: datetime) -> Text:
    cells: list[tuple[str, str]] = [(" ", "")] * axis.width
    end = step_end(step, now)  # not now for a step a worker's stop interrupted
    if step.started_at is None or end is None:
        return _bar(cells)
    style = status_style(str(step.status), steps=True)
    if step.kind == "wait" or (not step.attempts and str(step.status) == "waiting"):
        _paint(cells, axis.at(step.started_at), axis.at(end), WAIT, "khaki1")
        return _bar(cells)
    if not step.attempts:  # a container (for_each, try_catch…) or a cached step
        char = "◆" if str(step.status) == "cached" else "─"
        _paint(cells, axis.at(step.started_at), axis.at(end), char, style)
        return _bar(cells)
    for n, attempt in enumerate(step.attempts):
        finished = attempt.finished_at or end
        if n + 1 < len(step.attempts):  # the backoff until the next attempt started
            _paint(
                cells, axis.at(finished), axis.at(step.attempts[n + 1].started_at), GAP, "khaki3"
            )
        elif attempt.backoff_ms is not None and step.finished_at is None:
            _paint(cells, axis.at(finished), axis.at(end), GAP, "khaki3")
        attempt_style = status_style(str(attempt.status), steps=True)
        if str(attempt.status) == "timed_out":
            attempt_style = "bold dark_orange"
        _paint(cells, axis.at(attempt.started_at), axis.at(finished), ATTEMPT, attempt_style)
    return _bar(cells)


@dataclass(frozen=True)
class TimelineRows:
    """The rows the timeline draws, and the steps each stretch left out spans (by the fold
    row's position): found once a read, not at every redraw."""

    rows: list[Row]
    left_out: dict[int, list[StepRun]] = field(default_factory=dict)


def timeline_rows(run: Run, *, every: bool = False) -> TimelineRows:
    """The rail's rows, a long for_each folded as the rail folds it (its first and last
    iterations, and those that did not end well) unless `every`."""
    rows = rail_rows(run)
    if every:
        return TimelineRows(rows)
    shown = folded_groups(run, rows)
    if len(shown) == len(rows):
        return TimelineRows(rows)
    return TimelineRows(shown, _left_out(run, rows, shown))


def _left_out(run: Run, every: list[Row], shown: list[Row]) -> dict[int, list[StepRun]]:
    """The steps each fold row of `shown` (by position) leaves out: the rows of `every`
    between the rows kept around it."""
    left: dict[int, list[StepRun]] = {}
    i = 0
    for n, row in enumerate(shown):
        if not is_fold(row[2]):
            while i < len(every) and every[i] != row:
                i += 1
            i += 1
            continue
        following = shown[n + 1] if n + 1 < len(shown) else None
        members = left.setdefault(n, [])
        while i < len(every) and every[i] != following:
            index = every[i][0]
            if index is not None:
                members.append(run.steps[index])
            i += 1
    return left


def fold_bar(steps: list[StepRun], axis: Axis, now: datetime) -> tuple[Text, float | None]:
    """The time a stretch of left-out steps spans, first start to last end, and how long
    that is (ms)."""
    cells: list[tuple[str, str]] = [(" ", "")] * axis.width
    starts = [step.started_at for step in steps if step.started_at is not None]
    ends = [end for step in steps if (end := step_end(step, now)) is not None]
    if not (starts and ends):
        return _bar(cells), None
    first, last = min(starts), max(ends)
    _paint(cells, axis.at(first), axis.at(last), FOLDED, "grey50")
    return _bar(cells), (last - first).total_seconds() * 1000


def label_width(run: Run, width: int, rows: list[Row] | None = None) -> int:
    """The names' column: the longest step name (with its indent), in at most half the room
    beside the durations; LABEL at least."""
    rows = rail_rows(run) if rows is None else rows
    names = {step.index: printable(step.name) for step in run.steps}

    def shown(index: int | None, label: str) -> str:
        if index is not None:
            return names[index]
        if is_fold(label):
            return fold_said(label)
        return f"▾ {label}"

    longest = max(
        (2 * depth + cell_len(shown(index, label)) for index, depth, label, _ in rows), default=0
    )
    return max(LABEL, min(longest, (width - TOOK - 6) // 2))


def timeline(run: Run, now: datetime, width: int, drawn: TimelineRows | None = None) -> Text:
    """The whole run in `width` columns; `drawn`: what `timeline_rows` gave (every row by
    default)."""
    drawn = TimelineRows(rail_rows(run)) if drawn is None else drawn
    rows = drawn.rows
    end = run.finished_at or now
    label = label_width(run, width, rows)
    axis = Axis(run.created_at, end, width - label - TOOK - 6)
    text = Text()
    text.append(" " * (label + 1))
    text.append_text(axis.scale())
    text.append("\n")
    # The queue delay: from the run's creation to its start.
    started = run.started_at or (None if run.terminal else now)
    text.append(f"{'queued':<{label}} ", style="grey62")
    cells: list[tuple[str, str]] = [(" ", "")] * axis.width
    if started is not None:
        _paint(cells, 0, axis.at(started), QUEUED, "grey50")
    text.append_text(_bar(cells))
    if started is not None:
        delay = (started - run.created_at).total_seconds() * 1000
        text.append(f" {duration(max(delay, 0)):>{TOOK}}", style="grey62")
    by_index = {step.index: step for step in run.steps}
    for n, (index, depth, group, _) in enumerate(rows):
        text.append("\n")
        indent = "  " * depth
        if n in drawn.left_out:  # "… 1,995 more completed", over the time they took
            text.append(f"{cut(indent + fold_said(group), label)} ", style="grey70")
            bar, spanned = fold_bar(drawn.left_out[n], axis, now)
            text.append_text(bar)
            if spanned is not None:
                text.append(f" {duration(spanned):>{TOOK}}", style="grey70")
            continue
        if index is None:
            text.append(cut(f"{indent}▾ {group}", label).rstrip(), style="grey50")
            continue
        step = by_index[index]
        name = f"{indent}{printable(step.name)}"
        text.append(f"{cut(name, label)} ", style="bold" if step.attempts else "")
        text.append_text(step_bar(step, axis, now))
        ms = step_ms(step, now)
        if ms is not None:
            text.append(f" {duration(ms):>{TOOK}}")
            if len(step.attempts) > 1:
                text.append(f" ×{len(step.attempts)}", style="red1")
    text.append("\n\n")
    text.append(f"{QUEUED} queued  ", style="grey50")
    text.append(f"{ATTEMPT} attempt  ", style="green3")
    text.append(f"{ATTEMPT} failed  ", style="red1")
    text.append(f"{GAP} backoff  ", style="khaki3")
    text.append(f"{WAIT} wait  ", style="khaki1")
    text.append("◆ cached", style="medium_purple1")
    return text
