"""The jobs a database queue claimed beyond what its claims were asked for, kept in this process
for the queue's next claims.

A SQLite or PostgreSQL claim takes up to four times what was asked (and the worker tops the
extra up while its slots are busy: `claim_ahead`), so a worker slot that frees up starts its
next job without a round trip. Those jobs are `active` under this process's worker in the
database, but nothing runs them yet: `stats` counts them waiting (in every process; those of a
top-up, which are marked handed, in this one), and so does `oldest_waiting` here. This process
keeps their leases with its renewals, and hands them back when their queue pauses or stops, or
once its slots have all been busy a while with none moving on to them (`AHEAD_KEPT_S`). One
whose lease ran out may be another worker's by now: it is never served, nor counted as waiting
here.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable

from ..models import JobState
from .base import Claim, JobUpdate, Transition


class Ahead:
    """Per queue, the claims kept ahead, oldest first."""

    def __init__(self) -> None:
        self._claims: dict[str, deque[Claim]] = {}

    def keep(self, queue: str, claims: Iterable[Claim]) -> None:
        self._claims.setdefault(queue, deque()).extend(claims)

    def take(self, queue: str, limit: int) -> list[Claim]:
        """Up to `limit` claims whose leases still hold (those that do not are dropped: their
        jobs are found again by the claims of whoever takes them over)."""
        kept = self._claims.get(queue)
        taken: list[Claim] = []
        while kept and len(taken) < limit:
            claim = kept.popleft()
            if not claim.lease_lost():
                taken.append(claim)
        return taken

    def take_one(self, queue: str) -> Claim | None:
        kept = self._claims.get(queue)
        while kept:
            claim = kept.popleft()
            if not claim.lease_lost():
                return claim
        return None

    def drop(self, queue: str, job_id: str) -> Claim | None:
        """The claim of the job, no longer kept; None if it is not kept here."""
        kept = self._claims.get(queue)
        if kept is None:
            return None
        for claim in kept:
            if claim.job.id == job_id:
                kept.remove(claim)
                return claim
        return None

    def count(self, queue: str) -> int:
        """How many claims `queue` keeps, lost leases included (the worker's top-up asks for
        the rest)."""
        return len(self._claims.get(queue) or ())

    def give_back(self, queue: str) -> list[Transition]:
        """Forget the queue's claims; the transitions that make their jobs waiting again, as
        they were before the claim (a stale one is refused by its fence)."""
        return [
            Transition(
                claim.job.id,
                claim.job.epoch,
                JobUpdate(
                    state=JobState.WAITING,
                    resume=claim.job.resume,
                    run_at=claim.job.run_at,
                    force=claim.job.force,
                    meta=claim.job.meta_not_delivered(),
                ),
            )
            for claim in self._claims.pop(queue, None) or ()
        ]

    def renewed(self, held: dict[str, int], asked: float) -> None:
        """A renewal asked at `asked` (time.monotonic) kept the leases of `held` (id → epoch)."""
        for kept in self._claims.values():
            for claim in kept:
                if held.get(claim.job.id) == claim.job.epoch:
                    claim.held_since = asked

    def handed(self, queue: str) -> int:
        """How many of the queue's jobs kept here were handed to a slot in the database (a
        top-up's: `claim_ahead`), which no slot runs yet: `stats` counts them waiting."""
        now = time.monotonic()
        kept = self._claims.get(queue) or ()
        return sum(1 for claim in kept if claim.job.handed and not claim.lease_lost(now))

    def oldest_due(self, queue: str, oldest: float | None) -> float | None:
        """`oldest` (the database's oldest waiting job's due time, epoch seconds, or None) or
        the earliest due time of a job kept ahead, whichever is earlier."""
        now = time.monotonic()
        for claim in self._claims.get(queue) or ():
            if claim.lease_lost(now):
                continue
            job = claim.job
            due = (max(job.created_at, job.run_at) if job.run_at else job.created_at).timestamp()
            if oldest is None or due < oldest:
                oldest = due
        return oldest
