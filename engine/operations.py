"""Operator tools that act on many runs at once: the bulk executor, its progress and result,
and the "stuck" medians.

The engine's `cancel_many`, `replay_many`, `requeue_many` and `requeue_dead` take a filter (or
the ids of marked rows), snapshot what matches, then act on each item through the same methods
a single action uses. Items go a few dozen at a time: their writes land in the same writer
batches, so 10,000 runs cost a few hundred transactions rather than 10,000.
"""

from __future__ import annotations

import inspect
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import anyio

from . import filters
from .backends.base import RunStore
from .errors import EngineError
from .filters import RunFilter
from .models import Run, RunStatus

Item = TypeVar("Item")

BULK_CONCURRENCY = 32
PROGRESS_EVERY = 50  # items between two progress reports (and one at the end)
STUCK_SAMPLE = 200  # completed runs per workflow that the median is taken over, newest first


class Skip(Exception):
    """An item the bulk action leaves alone; the message is the reason, shared by many items
    (so it names no id)."""


@dataclass(frozen=True, slots=True)
class BulkProgress:
    action: str
    total: int
    done: int
    touched: int
    skipped: int

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0


@dataclass(slots=True)
class BulkResult:
    """What a bulk action did. `ids` are what it touched: cancelled runs, requeued jobs, or
    for a replay the new runs (`replayed` maps source run → new run)."""

    action: str
    total: int = 0
    ids: list[str] = field(default_factory=list)
    skipped_ids: dict[str, str] = field(default_factory=dict)  # id → reason
    replayed: dict[str, str] = field(default_factory=dict)

    @property
    def touched(self) -> int:
        return len(self.ids)

    @property
    def skipped(self) -> int:
        return len(self.skipped_ids)

    @property
    def reasons(self) -> dict[str, int]:
        """How many items were skipped for each reason, most common first."""
        return dict(Counter(self.skipped_ids.values()).most_common())

    def summary(self) -> str:
        """One line for a status bar: "cancelled 12 of 15; skipped 3 (already ended: 3)"."""
        text = f"{self.action}: {self.touched} of {self.total}"
        if self.skipped:
            why = ", ".join(f"{reason}: {n}" for reason, n in self.reasons.items())
            text += f"; skipped {self.skipped} ({why})"
        return text


ProgressCallback = Callable[[BulkProgress], Awaitable[None] | None]


async def run_bulk(
    action: str,
    items: Sequence[Item],
    key: Callable[[Item], str],
    act: Callable[[Item], Awaitable[str | None]],
    progress: ProgressCallback | None = None,
    concurrency: int = BULK_CONCURRENCY,
) -> BulkResult:
    """Apply `act` to every item, `concurrency` at a time. `act` returns what it made (a new
    run id for a replay, else None) or raises Skip; other errors propagate."""
    result = BulkResult(action, total=len(items))
    limiter = anyio.CapacityLimiter(max(1, concurrency))
    counter = _Counter()

    async def report() -> None:
        if progress is None:
            return
        outcome = progress(
            BulkProgress(action, result.total, counter.done, result.touched, result.skipped)
        )
        if inspect.isawaitable(outcome):
            await outcome

    async def one(item: Item) -> None:
        async with limiter:
            ident = key(item)
            try:
                made = await act(item)
            except Skip as skip:
                result.skipped_ids[ident] = str(skip)
            else:
                result.ids.append(made or ident)
                if made is not None:
                    result.replayed[ident] = made
            counter.done += 1
            if counter.done % PROGRESS_EVERY == 0 and counter.done < result.total:
                await report()

    async with anyio.create_task_group() as tg:
        for item in items:
            tg.start_soon(one, item)
    await report()
    return result


@dataclass
class _Counter:
    done: int = 0


async def matching_runs(store: RunStore, where: RunFilter, page: int = 1000) -> list[Run]:
    """Every run the filter matches now (without steps and logs), newest first. Paged, and
    de-duplicated because new runs arriving meanwhile shift the pages."""
    seen: set[str] = set()
    runs: list[Run] = []
    offset = 0
    while True:
        chunk = await store.list_runs(where, limit=page, offset=offset)
        for run in chunk:
            if run.id not in seen:
                seen.add(run.id)
                runs.append(run)
        if len(chunk) < page:
            return runs
        offset += page


async def bulk_targets(store: RunStore, runs: RunFilter | Sequence[str]) -> list[Run | str]:
    """What a bulk action goes over: the runs the filter matches now, or the ids given (each
    once)."""
    if isinstance(runs, RunFilter):
        return list(await matching_runs(store, await resolve_stuck(store, runs)))
    if isinstance(runs, str):
        raise EngineError("pass a RunFilter or a list of run ids, not one id")
    return list(dict.fromkeys(runs))


async def bulk_run(store: RunStore, target: Run | str, *, full: bool = False) -> Run:
    """The run to act on: the filter's snapshot of it, or a fresh read (`full`: with its
    steps, which a snapshot from a list has not)."""
    if isinstance(target, Run) and not full:
        return target
    run = await store.get_run(target_id(target))
    if run is None:
        raise Skip("unknown run")
    return run


def target_id(target: Run | str) -> str:
    return target.id if isinstance(target, Run) else target


async def resolve_stuck(store: RunStore, where: RunFilter, sample: int = STUCK_SAMPLE) -> RunFilter:
    """The filter with `stuck_cutoffs` filled in from the current medians."""
    if where.stuck is None:
        return where
    running = await matching_runs(store, RunFilter(status=(str(RunStatus.RUNNING),)))
    floor = filters.min_stuck_s()
    now = time.time()
    cutoffs: list[tuple[str, float]] = []
    for workflow in sorted({run.workflow_name for run in running}):
        median = await median_duration(store, workflow, sample)
        limit = where.stuck * median if median is not None else filters.NO_BASELINE_S
        limit = max(limit, floor)
        cutoffs.append((workflow, now - limit))
    return replace(where, stuck_cutoffs=tuple(cutoffs))


async def median_duration(
    store: RunStore, workflow: str, sample: int = STUCK_SAMPLE
) -> float | None:
    """Median seconds from start to finish of the workflow's latest completed runs."""
    completed = await store.list_runs(
        RunFilter(status=(str(RunStatus.COMPLETED),), workflow=workflow), limit=sample
    )
    durations = [
        (run.finished_at - run.started_at).total_seconds()
        for run in completed
        if run.started_at is not None and run.finished_at is not None
    ]
    return statistics.median(durations) if durations else None
