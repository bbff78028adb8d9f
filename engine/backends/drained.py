"""What a database queue remembers after a claim that took all the queue had, so that the next
claim does not ask the database again before anything could have changed.

A look that finds nothing is a write transaction on SQLite and a round trip on PostgreSQL. A
worker's claim loop claims again as soon as a claim returns, so a queue whose jobs come one at
a time paid one such look after every job. Now the claim that took all there was leaves the
wake-up signal it registered before its look, and when it would have looked again anyway (the
queue's next delayed job falling due, its usual poll). The next claim waits for the signal (a
job added or handed back in this process; on PostgreSQL any process's NOTIFY) or for that time,
then looks as before. A claim that will not wait (`timeout` 0) and a paused queue's claims
(forced jobs only) look at once.

A look that found nothing leaves the same mark: the claim waits out its timeout (a worker's
claim loop: `CLAIM_TIMEOUT_S`) and returns, and the loop's next claim waits on where it left
off instead of looking again. Before, every claim of an idle queue looked at least once, so an
engine serving many idle workflows asked the database a few times a second for each of them.
"""

from __future__ import annotations

import asyncio
import time


class Drained:
    """Per queue: the signal the last claim that took all there was left, and when it would
    have looked again."""

    def __init__(self) -> None:
        self._marks: dict[str, tuple[asyncio.Event, float]] = {}

    def mark(self, queue: str, signal: asyncio.Event, look_s: float) -> None:
        self.keep(queue, signal, time.monotonic() + look_s)

    def keep(self, queue: str, signal: asyncio.Event, look_at: float) -> None:
        """Until `look_at` (a monotonic time), nothing is new on `queue` unless `signal` is set."""
        self._marks[queue] = (signal, look_at)

    def pending(
        self, queue: str, deadline: float, *, forced_only: bool
    ) -> tuple[asyncio.Event, float] | None:
        """Before a claim's first look: the signal to wait on while nothing could have changed
        (see above), and until when (a monotonic time; the claim's own `deadline` may come
        first); None to look at once. The mark is used up (`keep` puts it back)."""
        mark = self._marks.pop(queue, None)
        now = time.monotonic()
        if mark is None or forced_only or deadline <= now:
            return None
        signal, look_at = mark
        if signal.is_set() or look_at <= now:
            return None
        return signal, look_at
