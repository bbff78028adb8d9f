"""A place among `limit` (a concurrency slot, a start in a rate-limit window): the decision
every backend makes the same way, whatever keeps the places and locks them."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RateDecision:
    """What `SharedState.acquire_start` decided: `allowed`; the starts counted in the window
    (this one included when allowed); when the oldest of them leaves the window (epoch seconds,
    the earliest moment a denied run may start; 0.0 when allowed), on the clock the window is
    kept by, which read `decided_at` as it decided. On PostgreSQL that is the server's: a
    worker's own clock may be off, and `free_at - decided_at` is what it waits."""

    allowed: bool
    in_window: int
    free_at: float = 0.0
    decided_at: float = 0.0


def place_for(holders: Collection[str], run_id: str, limit: int) -> bool | None:
    """Whether a run gets one of `limit` places (a concurrency slot, a start in a rate window)
    whose `holders` are the runs holding one now (those whose place ran out dropped): True if it
    holds one already (a redelivery keeps its place and is not counted twice), False if every
    place is taken; None if it gets a place, which the backend records in the same transaction.
    The backends differ only in where the places are kept and how they are locked."""
    if run_id in holders:
        return True
    if len(holders) >= limit:
        return False
    return None


def decide_start(
    held: Mapping[str, float], run_id: str, limit: int, at: float
) -> RateDecision | None:
    """A rate window's answer to `run_id` at `at` (see `place_for`), from the starts it holds
    (run id → when that start leaves the window): None when the run gets in (it is then the
    window's len(held) + 1th start)."""
    verdict = place_for(held, run_id, limit)
    if verdict is None:
        return None
    return RateDecision(verdict, len(held), 0.0 if verdict else min(held.values()), at)
