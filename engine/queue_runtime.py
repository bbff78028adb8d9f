"""A queue as one worker serves it: its slots, its claim loop's wake-ups, the slots parked
for the next claim, and when to claim more ahead (engine/worker.py runs them)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from .backends.base import Claim, JobQueue
from .workflow import Workflow

# While a queue's slots are all busy, the worker claims more ahead only if its slots finished
# as many jobs as it has slots within this long: jobs it keeps ahead then start within about
# that long, rather than waiting here behind long jobs that another worker could run now.
AHEAD_HORIZON_S = 0.05
# Jobs kept ahead go back to the queue once every slot has been busy this long with no slot
# moving on to one of them: behind long or hung jobs they would wait here (for an hour, behind
# hung slots) while other workers idle.
AHEAD_KEPT_S = 1.0


@dataclass
class QueueRuntime:
    """A queue as this worker serves it right now."""

    name: str
    workflow: Workflow
    queue: JobQueue
    concurrency: int
    active: int = 0
    paused: bool = False
    stopped: bool = False
    loop_done: anyio.Event = field(default_factory=anyio.Event)
    # asyncio's event: one is made a job (see `nudge`), and anyio's costs six calls to make.
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    completed_times: list[float] = field(default_factory=list)
    parked: list[asyncio.Future[Claim | None]] = field(default_factory=list)
    pokes: int = 0  # news for the claim loop's claim (`poked_since`)
    # time.monotonic since when every slot has been busy with no slot moving on to a job kept
    # ahead (None: one did, or a slot is free)
    full_since: float | None = None

    def poke(self) -> None:
        """News for the claim loop (a stop, a pause, a new concurrency): its claim, asleep in
        the queue, returns at once."""
        self.pokes += 1
        self.nudge()
        self.queue.wake(self.name)

    def poked_since(self, pokes: int) -> Callable[[], bool]:
        """For a claim begun when `pokes` was this: whether the runtime was poked since."""
        return lambda: self.pokes != pokes

    def nudge(self) -> None:
        """Wake the claim loop (to look again at its slots and the jobs kept ahead)."""
        self.changed.set()
        self.changed = asyncio.Event()

    def short_of_ahead(self) -> bool:
        """True while the queue keeps few jobs claimed ahead and its jobs are short (its slots
        finished `concurrency` jobs within AHEAD_HORIZON_S): time to claim more ahead, so that
        a slot that frees up finds its next job at hand rather than waiting for a claim."""
        queue = self.queue
        if not queue.claims_ahead or self.paused or self.stopped:
            return False
        if queue.ahead(self.name) >= (self.concurrency + 1) // 2:
            return False
        done = self.completed_times
        return (
            len(done) >= self.concurrency
            and time.monotonic() - done[-self.concurrency] <= AHEAD_HORIZON_S
        )

    def full_for(self) -> float:
        """How much longer the jobs kept ahead stay, every slot busy (AHEAD_KEPT_S in all,
        from the first call since a slot was free or moved on to one of them: `full_since`)."""
        now = time.monotonic()
        if self.full_since is None:
            self.full_since = now
        return max(0.0, self.full_since + AHEAD_KEPT_S - now)

    def stop(self) -> None:
        """Stop claiming: the claim loop ends once its claim returns (at once if it waits for
        jobs), parked slots at once."""
        self.stopped = True
        self.poke()
        self.unpark()

    # A slot with no job at hand parks here for the claim loop's next claim instead of
    # ending: handing a claim to a parked slot (a future's result) costs a fraction of a task
    # started for it, and a queue whose jobs come one at a time (each enqueue a claim of one)
    # started a task per job. Parked slots are not `active`; they end when the queue stops.
    def park(self) -> asyncio.Future[Claim | None]:
        parked: asyncio.Future[Claim | None] = asyncio.get_running_loop().create_future()
        self.parked.append(parked)
        return parked

    def hand(self, claim: Claim) -> bool:
        """Give `claim` to a parked slot, if one is waiting (counted `active` by the caller)."""
        while self.parked:
            parked = self.parked.pop()
            if not parked.done():  # not cancelled with its task
                parked.set_result(claim)
                return True
        return False

    def unpark(self) -> None:
        """End every parked slot: the queue stops (a drain, a reload that drops it)."""
        parked, self.parked = self.parked, []
        for slot in parked:
            if not slot.done():
                slot.set_result(None)
