"""A replay against the run it replays (D in the run view): input, status and duration, then
each step's status, duration and output side by side, with the steps the replay reused
(cached) marked, and what changed in each value key by key."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import VerticalScroll
from textual.widgets import Static

from engine import EngineError, Run, StepRun

from . import actions
from .base_screen import BlokScreen, Changes
from .console import duration, printable, status_text

SAME = Text("same", style="grey50")
CHANGES = 4  # key-level changes listed per value at most


def _short(value: Any) -> str:
    return printable(json.dumps(value, ensure_ascii=False, default=str))[:60]


def value_changes(before: Any, after: Any) -> Text:
    """ "same", or what changed: keys added, removed and changed (a few), or the two values."""
    if before == after:
        return SAME
    text = Text()
    if isinstance(before, dict) and isinstance(after, dict):
        lines = []
        for key in sorted(set(before) | set(after), key=str):
            if key not in after:
                lines.append((f"- {key}", "red1"))
            elif key not in before:
                lines.append((f"+ {key}: {_short(after[key])}", "green3"))
            elif before[key] != after[key]:
                lines.append((f"~ {key}: {_short(before[key])} → {_short(after[key])}", "khaki1"))
        for n, (line, style) in enumerate(lines[:CHANGES]):
            text.append(("\n" if n else "") + line, style=style)
        if len(lines) > CHANGES:
            text.append(f"\n… {len(lines) - CHANGES} more keys", style="grey50")
        return text
    text.append(f"{_short(before)} → {_short(after)}", style="khaki1")
    return text


def _ms(thing: Run | StepRun) -> float | None:
    if thing.started_at is None or thing.finished_at is None:
        return None
    return (thing.finished_at - thing.started_at).total_seconds() * 1000


def _took(before: float | None, after: float | None) -> Text:
    text = Text(f"{duration(before) if before is not None else '–'} → ")
    text.append(duration(after) if after is not None else "–")
    if before and after:
        change = (after - before) / before * 100
        if abs(change) >= 10:
            text.append(f"  {change:+.0f}%", style="red1" if change > 0 else "green3")
    return text


def _status(step: StepRun | None) -> Text:
    if step is None:
        return Text("absent", style="grey50")
    text = status_text(str(step.status), steps=True)
    if step.cached_from:
        text.append(" (reused)", style="medium_purple1")
    return text


def run_diff(source: Run, replay: Run) -> RenderableType:
    head = Table(box=None, padding=(0, 2, 0, 0), show_header=True, header_style="bold dim")
    head.add_column("", style="bold", no_wrap=True)
    head.add_column(f"source {source.id}", no_wrap=True)
    head.add_column(f"replay {replay.id}", no_wrap=True)
    head.add_row("status", status_text(str(source.status)), status_text(str(replay.status)))
    head.add_row("version", f"@{source.workflow_version[:8]}", f"@{replay.workflow_version[:8]}")
    source_ms, replay_ms = _ms(source), _ms(replay)
    took = _took(source_ms, replay_ms)
    head.add_row(
        "took",
        duration(source_ms) if source_ms is not None else "–",
        took[took.plain.index("→ ") + 2 :],
    )
    if replay.replay_from_step:
        head.add_row("from step", "", Text(replay.replay_from_step, style="medium_purple1"))
    parts: list[RenderableType] = [head, Text("\ninput", style="bold")]
    parts.append(value_changes(source.input, replay.input))
    steps = Table(box=None, padding=(0, 2, 0, 0), header_style="bold dim", expand=True)
    steps.add_column("step", style="bold", no_wrap=True)
    steps.add_column("source", no_wrap=True)
    steps.add_column("replay", no_wrap=True)
    steps.add_column("took", no_wrap=True)
    steps.add_column("output", ratio=1)
    by_name = {step.name: step for step in source.steps}
    seen = set()
    for step in replay.steps:
        source_step = by_name.get(step.name)
        seen.add(step.name)
        output = value_changes(source_step.output if source_step else None, step.output)
        steps.add_row(
            printable(step.name),
            _status(source_step),
            _status(step),
            _took(_ms(source_step) if source_step else None, _ms(step)),
            output,
        )
    for step in source.steps:
        if step.name not in seen:
            steps.add_row(printable(step.name), _status(step), _status(None), "", "")
    parts += [Text("\nsteps", style="bold"), steps]
    return Group(*parts)


class DiffScreen(BlokScreen):
    SCOPE: ClassVar[str] = actions.DIFF
    BINDINGS: ClassVar[list[BindingType]] = actions.bindings(actions.DIFF)

    def __init__(self, replay_id: str) -> None:
        super().__init__()
        self.replay_id = replay_id
        self.pair: tuple[Run, Run] | None = None
        self.missing: str | None = None

    @property
    def crumb(self) -> str:
        return "diff"

    def compose_body(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(id="diff", classes="log")

    async def load(self) -> None:
        try:
            replay = await self.engine.get_run(self.replay_id)
            if replay.replay_of is None:
                raise EngineError(f"run {replay.id} is not a replay: nothing to compare it with")
            source = await self.engine.get_run(replay.replay_of)
            self.pair, self.missing = (source, replay), None
        except EngineError as error:
            self.missing = str(error)
        shown = run_diff(*self.pair) if self.pair else Text(self.missing or "", style="red1")
        self.query_one("#diff", Static).update(shown)

    def engine_changed(self, changes: Changes) -> None:
        if self.replay_id in changes.runs or changes.everything:
            self.request_reload()
