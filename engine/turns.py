"""When a task whose awaits never wait gives the event loop away.

An await that finds what it wants at once (a job that has ended, a run read in the loop's own
thread from SQLite or from memory) returns without a turn of the loop. A task that makes such
calls in a loop (waiting for each of 100,000 jobs that have ended) holds the loop until its
loop is done: no other task of the process runs meanwhile (the worker's slots, the renewal of
its leases, the console), and the loop watchdog reports it blocked. Giving the loop away at
every such call would cost a turn each, about what the call itself costs; once a slice of time
costs about nothing (`TimeSlice`). And the other way round: whether a task's awaits did give the
loop a turn (`LoopTurn`).
"""

from __future__ import annotations

import asyncio
import time

# Long enough that the turns cost nothing next to the calls between them (one turn, some 10 µs,
# each 10 ms: 0.1 %); short enough that no other task of the process notices the wait (a lease
# is renewed seconds ahead, the console draws a frame each 16 ms at most).
SLICE_S = 0.01


class TimeSlice:
    """Whether the calls sharing this slice have held the event loop for `SLICE_S` since one of
    them last gave it away. The tasks making them never run at once (one event loop), so a task
    that holds the loop now began no earlier than that: none holds it much longer than a slice
    through these calls."""

    __slots__ = ("_until",)

    def __init__(self) -> None:
        self._until = 0.0

    async def share(self) -> None:
        """Give the event loop a turn if the slice is used up (a new one begins)."""
        now = time.monotonic()
        if now >= self._until:
            self._until = now + SLICE_S
            await asyncio.sleep(0)  # asyncio's own: anyio's is this behind three lookups


class LoopTurn:
    """Whether the event loop has gone round since this was made: a callback queued with
    `call_soon` runs once the loop has run what was ready before it, so a slot can tell a job
    that gave the rest of the engine its turn from one that never waited. (The engine runs on
    asyncio: aiosqlite and asyncpg do.)"""

    __slots__ = ("came",)

    def __init__(self) -> None:
        self.came = False
        asyncio.get_running_loop().call_soon(self._come)

    def _come(self) -> None:
        self.came = True
