"""A run's steps as the step rail, the timeline and `blok-tui show` read them: in order
(middleware first, then each step followed by its nested steps, grouped under their iteration,
case, try or catch arm), each with the tags shown beside it and how long it took. No Textual
here: the command line prints it too."""

from __future__ import annotations

from datetime import datetime

from engine import Run, StepRun

# A row of the rail: a step at a depth, or the header of a group of a parent's nested steps.
Row = tuple[int | None, int, str, int | None]  # (step index or None, depth, label, parent)


def rail_rows(run: Run) -> list[Row]:
    """The rail in reading order: middleware first, then the steps, each followed by its
    nested steps grouped by the first tag (iteration, case, try, catch)."""
    children: dict[int | None, list[StepRun]] = {}
    for step in run.steps:
        children.setdefault(step.parent, []).append(step)
    top = children.get(None, [])
    top = sorted(top, key=lambda s: (not (s.tags and s.tags[0].startswith("mw:")), s.index))
    rows: list[Row] = []
    seen: set[int] = set()

    def emit(step: StepRun, depth: int) -> None:
        if step.index in seen:  # a malformed parent chain must not loop forever
            return
        seen.add(step.index)
        rows.append((step.index, depth, "", step.parent))
        groups: dict[str, list[StepRun]] = {}
        for child in children.get(step.index, []):
            groups.setdefault(child.tags[0] if child.tags else "", []).append(child)
        for label, members in groups.items():
            inner = depth + 1
            if label:
                rows.append((None, depth + 1, label, step.index))
                inner = depth + 2
            for child in members:
                emit(child, inner)

    for step in top:
        emit(step, 0)
    # Steps whose parent is missing still show, at the end.
    for step in run.steps:
        if step.index not in seen:
            emit(step, 0)
    return rows


def own_tags(step: StepRun) -> list[str]:
    """The step's tags to show beside it: a nested step's first tag is the group it sits in
    (`rail_rows` puts it under that group's header), so it is left out."""
    return step.tags[1:] if step.parent is not None else step.tags


def step_ms(step: StepRun, now: datetime) -> float | None:
    """How long the step took, or has run until `now` (the engine's clock); None if it has
    not started."""
    if step.started_at is None:
        return None
    end = step.finished_at or now
    return max(0.0, (end - step.started_at).total_seconds() * 1000)
