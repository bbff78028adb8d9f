"""The clock a backend's moments are on: when a job is due, when a wait, a lease or a ttl ends,
when a schedule ticks, when a worker last beat, and when a run and its steps began and ended.

Processes that share a database compare each other's moments, so they must read them on one
clock. On one machine (memory, SQLite) that is the machine's own. Machines that share a
PostgreSQL server keep theirs as they are (a clock a minute off is common on an unsynchronised
VM) and read the server's: the backend measures how far the server's clock is from this
process's (`skew`) and keeps measuring it. A user reads the same moments on it too
(`Engine.now()`), so that a run another machine started reads "3s ago" everywhere.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

AGREE_S = 0.001  # clocks this close agree: finer than anything the engine schedules


class Clock:
    """This process's clock, moved by `skew` seconds onto the clock of the backend."""

    def __init__(self) -> None:
        self._skew = 0.0
        self._shift: timedelta | None = None  # the skew, None until measured (one machine)

    @property
    def skew(self) -> float:
        """The backend's clock minus this process's, in seconds."""
        return self._skew

    def time(self) -> float:
        """Now, in epoch seconds, on the backend's clock."""
        return time.time() + self._skew

    def now(self) -> datetime:
        """Now, on the backend's clock, as an aware UTC datetime."""
        now = datetime.now(UTC)  # a run's every step reads it: kept to one call without skew
        return now if self._shift is None else now + self._shift

    def measured(self, sent: float, server: float, received: float) -> None:
        """Take a reading of the server's clock (`server`, epoch seconds) made between `sent` and
        `received` on this process's: the server read it half way, give or take half the round
        trip. Within that, and AGREE_S, the two clocks agree (a server on this machine, or a
        synchronised one): this process's own is kept, unmoved by the noise of readings."""
        skew = server - (sent + received) / 2
        if abs(skew) <= (received - sent) / 2 + AGREE_S:
            self._skew, self._shift = 0.0, None
        else:
            self._skew, self._shift = skew, timedelta(seconds=skew)
