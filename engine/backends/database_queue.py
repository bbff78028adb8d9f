"""What the SQLite and PostgreSQL queues share: the claim loop around a look in the database.

A claim there is a look: a write transaction on SQLite, one statement on a pooled connection
on PostgreSQL. Around it, both do the same:
- serve from the jobs claimed ahead first (`Ahead`, ahead.py), with no look at all;
- after a look that took all there was, let the next claim wait until something could have
  changed (`Drained`, drained.py);
- take up to `AHEAD` times what was asked and keep the extra ahead;
- between looks that find nothing, sleep on a wake-up signal registered before the look (a job
  added or handed back in this process; on PostgreSQL any process's NOTIFY), or until the
  queue's next delayed job falls due, or until it is time to look anyway.

Claims of a paused queue want only jobs an operator forced. A new job is never forced (a
transition makes it so), so an add does not wake them; a transition does.

A claim asleep for want of jobs is also offered to this process's adds (`Offer`), on a
dialect whose add takes offers (`hands_off`): the add writes its due jobs already claimed by
the sleeping claim's worker, in its own transaction, and the claim returns them without a look.
A claim that would go to sleep while adds of its queue wait in the writer joins them instead,
and the adds made while one such add waits join the claim it took (`PendingAdd`): when one job
is enqueued while the last one is claimed, the add comes first and the claim a moment after,
and it would otherwise look in the next transaction for the job the add has just written; and
several producers' adds come together. On the path users take (one `enqueue` a call, while the
worker runs the jobs) that is every job: a look is four statements on SQLite, one of them the
update that takes the job. Such jobs are `handed`, as a claim's jobs for free slots are.

The dialects say only how to look (`_look`) and how an add hands off: the database's part.
"""

from __future__ import annotations

import asyncio
import threading
import time
from abc import abstractmethod
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

import anyio

from ..models import Job, JobState, QueueStats
from .ahead import Ahead
from .base import Claim, JobQueue
from .drained import Drained

AHEAD = 4  # a claim takes up to this many times what was asked
# An idle claim looks at least this often. What else could have made a job claimable wakes it
# sooner: this process's adds and hand-backs, another process's commits (NOTIFY on PostgreSQL,
# the file's data_version on SQLite), the queue's next delayed job or lease falling due.
LOOK_ANYWAY_S = 5.0


@dataclass(eq=False)
class Offer:
    """A claim asleep on a queue for want of jobs, with `limit` free slots, offered to this
    process's adds until its wake-up `signal` is set. The adds that take it (`PendingAdd`) each
    add to `takes` what the claim awaits for the claims it handed over (none if it failed, or
    the queue turned out paused); more may join until the first of them runs (`sealed`)."""

    worker: str
    lease_s: float
    limit: int
    signal: asyncio.Event
    takes: list[Callable[[], Awaitable[list[Claim]]]] = field(default_factory=list)
    handed: int = 0  # jobs handed by the adds that ran, out of `limit`
    sealed: bool = False
    # The queue's wake-up signal from the moment the offer was taken: a claim that got jobs
    # leaves it as its drained mark, so a job added after the hand-off is not slept through.
    after: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class PendingAdd:
    """An add of this process queued for the database and not yet run, with due jobs for
    `queues`, and the claims it hands them to (`offers`, one a queue): one asleep when the add
    is made, one several adds made meanwhile share, or one that would have gone to sleep
    before the add runs. When it runs it hands its due jobs to them (`assign`); from then on
    it takes no claim, and its claims join no other add. The add may run in another thread (a
    heavy batch), hence the queue's `lock` around both."""

    queues: frozenset[str]
    taken: Callable[[Offer], Awaitable[list[Claim]]]  # the dialect's, what a claim awaits
    lock: threading.Lock
    offers: dict[str, Offer] = field(default_factory=dict)
    closed: bool = False
    assigned: dict[str, Offer] | None = None

    def join(self, queue: str, offer: Offer) -> bool:
        """The claim of `offer` is handed this add's due jobs of `queue`, if neither this add
        nor one the claim joined before has run, and no other claim has that queue here."""
        with self.lock:
            if self.closed or offer.sealed or queue in self.offers:
                return False
            self.offers[queue] = offer
            offer.takes.append(partial(self.taken, offer))
        return True

    def assign(self, jobs: list[Job]) -> dict[str, Offer]:
        """In the add's transaction: which jobs go to which claim, by job id (those due now,
        up to each claim's free slots, shared with the other adds it joined). The same answer
        if the transaction is run again."""
        with self.lock:
            if self.assigned is not None:
                return self.assigned
            self.closed = True
            assigned: dict[str, Offer] = {}
            for offer in self.offers.values():
                offer.sealed = True
            for job in jobs:
                claim = self.offers.get(job.queue)
                if claim is not None and claim.handed < claim.limit and _due(job):
                    claim.handed += 1
                    assigned[job.id] = claim
            self.assigned = assigned
            return assigned


def _due(job: Job) -> bool:
    return job.state is JobState.WAITING and job.run_at is None


class DatabaseQueue(JobQueue):
    """A queue whose jobs are rows of a database, claimed by looking there."""

    claims_ahead: ClassVar[bool] = True
    hands_off: ClassVar[bool] = False  # the dialect's add takes offers (`_pending_add`)

    def __init__(self) -> None:
        # Wake-up signals are asyncio's events: a few are made and set a job, and anyio's costs
        # six calls to make and two to set. (These queues' drivers run on asyncio.)
        self._signals: dict[str, asyncio.Event] = {}
        self._forced_signals: dict[str, asyncio.Event] = {}  # claims of a paused queue
        self._ahead = Ahead()  # claimed beyond what claims asked for (ahead.py)
        self._drained = Drained()  # after a claim that took all there was (drained.py)
        self._offers: dict[str, deque[Offer]] = {}  # sleeping claims, by queue, oldest first
        # Adds not yet run, and a claim some of them took that takes more, by queue; and the
        # lock around handing jobs over (`PendingAdd`).
        self._pending_adds: dict[str, list[PendingAdd]] = {}
        self._open_offers: dict[str, Offer] = {}
        self._handing = threading.Lock()
        self._claimed: set[str] = set()  # the queues this process's claims have looked at

    def claimed_here(self, queues: Iterable[str]) -> bool:
        """Whether a claim of this process has looked at one of these queues: its add may
        hand it its jobs if the add waits for it (`_pending_add`)."""
        return not self._claimed.isdisjoint(queues)

    @abstractmethod
    async def _look(
        self,
        queue: str,
        asking: int,
        worker: str,
        lease_s: float,
        *,
        forced_only: bool,
        handing: int,
        deadline: float,
    ) -> tuple[list[Claim], float] | None:
        """One look in the database: up to `asking` claims in priority order (the first
        `handing` go straight to worker slots), and how many seconds a claim that found them
        all waits, unless woken, before it looks again. None if the database could not be
        reached by `deadline` (a monotonic time): the claim then returns nothing."""

    # ---- wake-ups --------------------------------------------------------------------------
    def wake(self, queue: str) -> None:
        for signals in (self._signals, self._forced_signals):
            signal = signals.pop(queue, None)
            if signal is not None:
                signal.set()

    def sleeping(self) -> bool:
        """Whether a claim waits for jobs (asleep, or about to look)."""
        return bool(self._signals or self._forced_signals)

    def wake_all(self) -> None:
        for queue in {*self._signals, *self._forced_signals}:
            self.wake(queue)

    def _wake_added(self, queues: set[str]) -> None:
        """Jobs were added to these queues: wake their claims (not a paused queue's)."""
        for queue in queues:
            signal = self._signals.pop(queue, None)
            if signal is not None:
                signal.set()

    # ---- handing off -----------------------------------------------------------------------
    def _take_offer(self, queue: str) -> Offer | None:
        """For an add about to write due jobs of `queue`: the longest-asleep claim on it, if
        any, taken off the offers. Its claim is woken now and awaits its `takes`, which the
        caller fills before its next checkpoint."""
        offers = self._offers.get(queue)
        while offers:
            offer = offers.popleft()
            if offer.signal.is_set():  # woken already: it looks anyway
                continue
            # Its signal is the queue's current one (a set one is popped as it is set).
            self._signals[queue] = offer.after
            offer.signal.set()
            return offer
        return None

    def _pending_add(
        self, jobs: list[Job], taken: Callable[[Offer], Awaitable[list[Claim]]]
    ) -> PendingAdd | None:
        """For a dialect's add just queued with these jobs (none where it has no due job): the
        claims it hands them to, by queue: the one an add made before it and not yet run took
        or was joined by, else the longest-asleep one (`_take_offer`); and a claim about to
        sleep on one of its queues before it runs joins it (`_join`). `taken`: what such a
        claim awaits. The dialect calls `_added` once the add is over."""
        if not self.hands_off:
            return None
        queues = frozenset(job.queue for job in jobs if _due(job))
        if not queues:
            return None
        pending = PendingAdd(queues, taken, self._handing)
        for queue in queues:
            shared = self._open_offers.get(queue)
            if shared is None or not pending.join(queue, shared):
                offer = self._take_offer(queue)
                if offer is not None and pending.join(queue, offer):
                    self._open_offers[queue] = offer
            self._pending_adds.setdefault(queue, []).append(pending)
        return pending

    def _added(self, pending: PendingAdd | None) -> None:
        """The add of `pending` is over (committed or failed): no claim joins it any more."""
        if pending is None:
            return
        for queue in pending.queues:
            waiting = self._pending_adds.get(queue)
            if waiting is not None and pending in waiting:
                waiting.remove(pending)
                if not waiting:
                    del self._pending_adds[queue]
            offer = self._open_offers.get(queue)
            if offer is not None and offer.sealed:
                del self._open_offers[queue]

    def _join(self, queue: str, offer: Offer) -> bool:
        """Instead of sleeping: the claim of `offer` joins the adds of `queue` not yet run, as
        if it had been asleep when the first was made (`_take_offer`)."""
        joined = False
        for pending in self._pending_adds.get(queue, ()):
            joined = pending.join(queue, offer) or joined
        if not joined:
            return False
        self._open_offers[queue] = offer
        self._signals[queue] = offer.after
        offer.signal.set()  # as if taken from its sleep: other claims asleep on it look
        return True

    async def _sleep(
        self, queue: str, signal: asyncio.Event, until: float, offer: Offer | None
    ) -> list[Claim]:
        """Sleep on `signal` until the monotonic time `until` at most, offered to adds if
        `offer` (or join the adds not yet run, `_join`); the claims the adds that took the
        offer handed over."""
        if offer is None:
            with anyio.move_on_after(max(until - time.monotonic(), 0.0)):
                await signal.wait()
            return []
        if not self._join(queue, offer):
            offers = self._offers.setdefault(queue, deque())
            offers.append(offer)
            try:
                with anyio.move_on_after(max(until - time.monotonic(), 0.0)):
                    await signal.wait()
            finally:
                if not offer.takes and offer in offers:  # (one woken may be gone already)
                    offers.remove(offer)
        claims: list[Claim] = []
        try:
            for take in offer.takes:  # (complete by the time the first is over: `sealed`)
                claims += await take()
        finally:
            with self._handing:  # an add that failed before it ran did not seal it
                offer.sealed = True
                # Done with: each take holds its add's call, whose result holds this offer,
                # a reference cycle a hand-off that only the cyclic collector would free.
                offer.takes.clear()
        if claims:
            # Asleep until the add: nothing else was due, as after a look that took all.
            self._drained.mark(queue, offer.after, max(until - time.monotonic(), 0.0))
        return claims

    # ---- reads -----------------------------------------------------------------------------
    def _stats(self, queue: str, rows: Iterable[Any]) -> QueueStats:
        """The queue's stats from its jobs counted by (state, due later, count): a waiting job
        not due yet counts as delayed, and a job kept ahead here as waiting (rows.STATS counts
        those not handed to a slot so; those of a top-up are handed: ahead.py)."""
        counts = dict.fromkeys(JobState, 0)
        for state, later, count in rows:
            job_state = JobState(state)
            if job_state in (JobState.WAITING, JobState.DELAYED):
                job_state = JobState.DELAYED if later else JobState.WAITING
            counts[job_state] += count
        handed = self._ahead.handed(queue)
        counts[JobState.ACTIVE] -= handed
        counts[JobState.WAITING] += handed
        return QueueStats.of(queue, counts)

    # ---- claiming --------------------------------------------------------------------------
    def claim_nowait(self, queue: str, worker: str, lease_s: float) -> Claim | None:
        return self._ahead.take_one(queue)

    def return_ahead(self, queue: str) -> None:
        for transition in self._ahead.give_back(queue):
            self.submit(transition)

    def ahead(self, queue: str) -> int:
        return self._ahead.count(queue)

    def drop_ahead(self, queue: str, job_id: str) -> Claim | None:
        return self._ahead.drop(queue, job_id)

    async def claim_ahead(self, queue: str, limit: int, worker: str, lease_s: float) -> int:
        # One try: a top-up is a spare, and must not hold the claim loop (and with it a stop)
        # through an outage; the next claim for a free slot waits for the database.
        # Its jobs are `handed`: a worker tops up only while its jobs are short (`short_of_
        # ahead`), so they start within moments, and their starts then need no commit of their
        # own before their code runs. That wait, a writer's commit or two, was most of the gap
        # between two 10 ms jobs on PostgreSQL (2.3 ms of a 12.9 ms cycle). The price: a worker
        # that dies holding top-ups leaves runs recorded crashed ("may have begun") that never
        # began, up to about one and a half times its concurrency; each job runs again in a
        # new run, with no retry spent.
        looked = await self._look(
            queue, limit, worker, lease_s, forced_only=False, handing=limit, deadline=0.0
        )
        if looked is None:
            return 0
        claims, _ = looked
        self._ahead.keep(queue, claims)
        return len(claims)

    async def claim(
        self,
        queue: str,
        limit: int,
        worker: str,
        lease_s: float,
        *,
        forced_only: bool = False,
        timeout: float = 0.0,
        interrupted: Callable[[], bool] | None = None,
    ) -> list[Claim]:
        self._claimed.add(queue)
        if not forced_only:
            taken = self._ahead.take(queue, limit)
            if taken:
                return taken
        deadline = time.monotonic() + timeout
        signals = self._forced_signals if forced_only else self._signals
        asking = limit if forced_only else AHEAD * limit
        offering = self.hands_off and not forced_only
        drained = self._drained.pending(queue, deadline, forced_only=forced_only)
        if drained is not None:
            signal, look_at = drained
            offer = Offer(worker, lease_s, limit, signal) if offering else None
            handed = await self._sleep(queue, signal, min(look_at, deadline), offer)
            if handed:
                return handed
            if interrupted is not None and interrupted():
                return []
            if not signal.is_set() and time.monotonic() < look_at:
                # Out of time before anything could have changed: the next claim waits on.
                self._drained.keep(queue, signal, look_at)
                return []
        while True:
            # Registered before the look: a wake-up while it runs is not missed.
            signal = _registered(signals, queue)
            looked = await self._look(
                queue,
                asking,
                worker,
                lease_s,
                forced_only=forced_only,
                handing=limit,
                deadline=deadline,
            )
            if looked is None:
                return []
            claims, look_s = looked
            if claims:
                if len(claims) < asking and not forced_only:  # all there was (drained.py)
                    self._drained.mark(queue, signal, look_s)
                if len(claims) > limit:
                    self._ahead.keep(queue, claims[limit:])
                return claims[:limit]
            if not forced_only:
                # Found nothing: so is the next claim told, if this one runs out of time first
                # (a worker's claim loop claims again at once), when to look again.
                self._drained.mark(queue, signal, look_s)
            now = time.monotonic()
            if deadline <= now:
                return []
            until = now + max(min(deadline - now, look_s), 0.001)
            offer = Offer(worker, lease_s, limit, signal) if offering else None
            handed = await self._sleep(queue, signal, until, offer)
            if handed:
                return handed
            if interrupted is not None and interrupted():
                return []
            if not signal.is_set() and until < now + look_s:
                return []  # out of time before the next look: the mark above stands


def _registered(signals: dict[str, asyncio.Event], queue: str) -> asyncio.Event:
    """The queue's wake-up signal, made if it has none yet. (Not `setdefault`: that makes an
    event, about 2 µs, at every look, only to drop it.)"""
    signal = signals.get(queue)
    if signal is None:
        signal = signals[queue] = asyncio.Event()
    return signal
