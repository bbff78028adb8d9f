"""Bulk actions from the console: what a confirmation promises (how many runs, chosen how) and
carrying it out with progress.

The engine takes a filter, not a list of 10,000 ids, and reports progress as it goes. An
attached client that has no bulk API yet gets the same result one run at a time, through its
single-run actions, so that the console behaves the same either way (and says which it did).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engine import EngineError, RunFilter
from engine.operations import BulkProgress, BulkResult

Progress = Callable[[BulkProgress], Awaitable[None] | None]
FALLBACK_PAGE = 500

# action → (engine method taking the target, the single-run method a fallback uses)
METHODS = {
    "cancel": ("cancel_many", "cancel"),
    "replay": ("replay_many", "replay"),
    "requeue": ("requeue_many", "requeue"),
}
VERBS = {"cancel": "Cancel", "replay": "Replay", "requeue": "Requeue"}


@dataclass(frozen=True, slots=True)
class BulkPlan:
    """One bulk action, as the confirmation states it."""

    action: str  # cancel | replay | requeue
    target: RunFilter | tuple[str, ...]  # a filter, or ids (run ids; job ids for requeue)
    count: int  # runs it touches at most (what the confirmation says)
    chosen: str  # how the runs were chosen, in words: "the 3 marked runs", "every failed run"
    item: str = "run"  # what the ids are, in words: "run", or "dead letter" (job ids)
    # Requeue every dead letter of this queue (the engine's requeue_dead, not a list of ids).
    dead_of: str | None = None

    @property
    def question(self) -> str:
        noun = self.item if self.count == 1 else f"{self.item}s"
        if self.action == "requeue" and self.item == "run":
            return f"Requeue the dead jobs of {self.count:,} {noun}?"
        return f"{VERBS[self.action]} {self.count:,} {noun}?"


def supports_bulk(engine: Any, action: str) -> bool:
    return callable(getattr(engine, METHODS[action][0], None))


async def execute(engine: Any, plan: BulkPlan, progress: Progress | None = None) -> BulkResult:
    """Carry out the plan: through the engine's bulk API, or one run at a time without it."""
    many, _ = METHODS[plan.action]
    target: RunFilter | list[str] = (
        plan.target if isinstance(plan.target, RunFilter) else list(plan.target)
    )
    if plan.dead_of is not None and callable(getattr(engine, "requeue_dead", None)):
        result: BulkResult = await engine.requeue_dead(plan.dead_of, progress=progress)
        return result
    if supports_bulk(engine, plan.action):
        done: BulkResult = await getattr(engine, many)(target, progress=progress)
        return done
    return await _one_by_one(engine, plan, target, progress)


async def _one_by_one(
    engine: Any, plan: BulkPlan, target: RunFilter | list[str], progress: Progress | None
) -> BulkResult:
    ids = await _ids(engine, plan.action, target)
    _, single = METHODS[plan.action]
    act = getattr(engine, single)
    result = BulkResult(plan.action, total=len(ids))
    for n, ident in enumerate(ids, start=1):
        try:
            made = await act(ident)
        except EngineError as error:
            result.skipped_ids[ident] = str(error).replace(f" {ident}", "")
        else:
            result.ids.append(made if isinstance(made, str) else ident)
            if plan.action == "replay" and isinstance(made, str):
                result.replayed[ident] = made
        if progress is not None and (n % 20 == 0 or n == len(ids)):
            outcome = progress(
                BulkProgress(plan.action, result.total, n, result.touched, result.skipped)
            )
            if inspect.isawaitable(outcome):
                await outcome
    return result


async def _ids(engine: Any, action: str, target: RunFilter | Sequence[str]) -> list[str]:
    if not isinstance(target, RunFilter):
        return list(dict.fromkeys(target))
    found: list[str] = []
    offset = 0
    while True:
        chunk = await engine.runs(
            status=list(target.status) if target.status else None,
            workflow=target.workflow,
            queue=target.queue,
            text=target.text,
            limit=FALLBACK_PAGE,
            offset=offset,
            **({"retrying": True} if target.retrying else {}),
            **({"stuck": target.stuck} if target.stuck is not None else {}),
        )
        found.extend(run.job_id if action == "requeue" else run.id for run in chunk)
        if len(chunk) < FALLBACK_PAGE:
            return list(dict.fromkeys(found))
        offset += FALLBACK_PAGE
