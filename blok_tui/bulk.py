"""Bulk actions from the console: what a confirmation promises (how many runs, chosen how) and
carrying it out with progress.

The engine takes a filter, not a list of 10,000 ids, and reports progress as it goes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from engine import RunFilter
from engine.api import EngineAPI
from engine.operations import BulkProgress, BulkResult

Progress = Callable[[BulkProgress], Awaitable[None] | None]

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


async def execute(
    engine: EngineAPI, plan: BulkPlan, progress: Progress | None = None
) -> BulkResult:
    """Carry out the plan through the engine's bulk API (the same for a local engine and an
    attached one)."""
    if plan.dead_of is not None:
        return await engine.requeue_dead(plan.dead_of, progress=progress)
    target: RunFilter | list[str] = (
        plan.target if isinstance(plan.target, RunFilter) else list(plan.target)
    )
    if plan.action == "cancel":
        return await engine.cancel_many(target, progress=progress)
    if plan.action == "replay":
        return await engine.replay_many(target, progress=progress)
    return await engine.requeue_many(target, progress=progress)
