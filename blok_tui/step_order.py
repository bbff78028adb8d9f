"""A run's steps as the step rail, the timeline and `blok-tui show` read them: in order
(middleware first, then each step followed by its nested steps, grouped under their iteration,
case, try or catch arm), each with the tags shown beside it and how long it took; and how long a
run took, the same way in the console and in `blok-tui runs`. No Textual here: the command line
prints it too."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from engine import Orphan, Run, StepRun, StepStatus

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


# A run or a step in these statuses goes on now: its time runs to the clock's now.
GOING = frozenset({"running", "waiting"})


def step_end(step: StepRun, now: datetime) -> datetime | None:
    """Where the step's time stops: its end; `now` while it runs or waits; for one that
    started and went back to pending (a worker's stop interrupted it: it goes on at the next
    delivery), the end of its last attempt. None if it has not started, or stopped with no
    attempt ended."""
    if step.started_at is None:
        return None
    if step.finished_at is None and str(step.status) in GOING:
        return now
    return _stopped_at(step)


def _stopped_at(step: StepRun) -> datetime | None:
    """The step's end, else the end of its last attempt that ended."""
    if step.finished_at is not None:
        return step.finished_at
    return max((a.finished_at for a in step.attempts if a.finished_at is not None), default=None)


def step_ms(step: StepRun, now: datetime) -> float | None:
    """How long the step took, or has run until `now` (the engine's clock), or ran before it
    was stopped; None if it has not started."""
    end = step_end(step, now)
    if step.started_at is None or end is None:
        return None
    return max(0.0, (end - step.started_at).total_seconds() * 1000)


def time_runs_to(run: Run, now: datetime, orphan: Orphan | None) -> datetime:
    """The moment a run's time, and its steps', runs to: `now`; but nobody runs an orphan, so
    its time stops at the last sign it ran: its worker's last heartbeat, or the latest moment
    its record names (heartbeats are seconds apart: a run may start after the last one)."""
    if orphan is None or orphan.since is None:
        return now
    signs = [orphan.since, *_moments(run)]
    return min(now, max(signs))


def _moments(run: Run) -> Iterator[datetime]:
    """The moments a running run's record names: its start, its steps' and attempts' starts
    and ends, its log lines'."""
    if run.started_at is not None:
        yield run.started_at
    for line in run.logs:
        yield line.ts
    for step in run.steps:
        for moment in (step.started_at, step.finished_at):
            if moment is not None:
                yield moment
        for attempt in step.attempts:
            for moment in (attempt.started_at, attempt.finished_at):
                if moment is not None:
                    yield moment
        for line in step.logs:
            yield line.ts


def run_end(run: Run, now: datetime) -> datetime | None:
    """Where the run's time stops: its end; `now` while it runs or waits. A run that started
    and is neither (a worker's stop sent it back to the queue: its record says queued, still
    naming that worker) stopped when its last step attempt did: its time does not run on
    while nobody runs it. None when that is not known: not started, or no steps read (a
    listing's runs carry none)."""
    if run.started_at is None:
        return None
    if run.finished_at is not None:
        return run.finished_at
    if str(run.status) in GOING:
        return now
    ends = (_stopped_at(step) for step in run.steps if step.started_at is not None)
    return max((end for end in ends if end is not None), default=None)


def run_ms(run: Run, now: datetime) -> float | None:
    """How long the run took, has run until `now`, or ran before it was stopped (`run_end`);
    None when not known."""
    end = run_end(run, now)
    if run.started_at is None or end is None:
        return None
    return max(0.0, (end - run.started_at).total_seconds() * 1000)


GROUPS_KEPT = (3, 2)  # of a long list of iterations: the first and the last ones shown
_ENDED_WELL = frozenset({StepStatus.COMPLETED, StepStatus.CACHED, StepStatus.SKIPPED})


def folded_groups(run: Run, rows: list[Row]) -> list[Row]:
    """`rows` with a long run of a parent's groups (a for_each of 2,000 items: 4,000 lines)
    cut to its first and last ones and those where a step did not end well, each stretch
    left out said in one row ("… 1,995 more", completed, "iteration 4 to iteration 1998")."""
    out: list[Row] = []
    i = 0
    while i < len(rows):
        index, depth, _, parent = rows[i]
        if index is not None:
            out.append(rows[i])
            i += 1
            continue
        groups: list[list[Row]] = []
        while i < len(rows) and rows[i][0] is None and (rows[i][1], rows[i][3]) == (depth, parent):
            end = i + 1
            while end < len(rows) and rows[end][1] > depth:
                end += 1
            groups.append([rows[i], *folded_groups(run, rows[i + 1 : end])])
            i = end
        out += _kept_groups(run, groups, depth, parent)
    return out


def _kept_groups(run: Run, groups: list[list[Row]], depth: int, parent: int | None) -> list[Row]:
    first, last = GROUPS_KEPT
    if len(groups) <= first + last + 1:
        return [row for group in groups for row in group]
    kept: list[Row] = []
    left: list[Row] = []  # the group rows of a stretch left out
    ended: dict[str, None] = {}  # the statuses its steps ended in
    for n, group in enumerate(groups):
        statuses = {run.steps[row[0]].status for row in group if row[0] is not None}
        if first <= n < len(groups) - last and statuses <= _ENDED_WELL:
            left.append(group[0])
            ended.update(dict.fromkeys(sorted(map(str, statuses))))
            continue
        if left:
            span = f"{left[0][2]} to {left[-1][2]}" if len(left) > 1 else left[0][2]
            said = f"… {len(left):,} more\t{' or '.join(ended) or 'empty'}\t{span}"
            kept.append((None, depth, said, parent))  # read back by `fold_parts`
            left, ended = [], {}
        kept += group
    return kept


def is_fold(label: str) -> bool:
    """Whether a row's label is a stretch of groups `folded_groups` left out."""
    return label.startswith("… ")


def fold_parts(label: str) -> tuple[str, str, str]:
    """A stretch's label as `folded_groups` made it: how many ("… 35 more"), the statuses
    they ended in, and their span ("iteration 4 to iteration 38")."""
    more, statuses, span = label.split("\t")
    return more, statuses, span


def fold_said(label: str) -> str:
    """A stretch's label as the rail and the timeline show it: "… 35 more completed"."""
    more, statuses, _ = fold_parts(label)
    return f"{more} {statuses}"


def step_path(run: Run, step: StepRun, by_index: dict[int, StepRun] | None = None) -> str:
    """ "charge", or "pages › iteration 2 › fetch" for a nested step (its name alone named
    any of a for_each's 2,000 fetches). `by_index`: the run's steps by index, if made."""
    by_index = by_index if by_index is not None else {s.index: s for s in run.steps}
    parts = [step.name]
    seen: set[int] = set()
    while step.parent is not None and step.parent not in seen:
        seen.add(step.index)
        if step.tags:
            parts.append(step.tags[0])
        parent = by_index.get(step.parent)
        if parent is None:
            break
        parts.append(parent.name)
        step = parent
    return " › ".join(reversed(parts))
