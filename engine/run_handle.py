"""One run in flight in a worker: its claim, its queue, its record, the scope its code runs in,
and what stops it (an operator's cancel, a lease lost to another worker, a drain past its
grace), each a flag the slot reads when the code returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio
import anyio.lowlevel

from .backends.base import Claim, JobQueue
from .context import Context
from .models import Run


@dataclass
class RunHandle:
    """A run in flight in this worker."""

    claim: Claim
    queue: JobQueue
    run: Run
    ctx: Context | None = None
    scope: anyio.CancelScope | None = None
    cancel_requested: bool = False
    lost: bool = False  # the lease went to another worker
    stopping: bool = False  # the worker stops (past a drain's grace): the run goes on later
    held: bool = False  # stopped, but its code still runs: the job is not handed back
    seen: dict[str, float] = field(default_factory=dict)  # signals acted on
    ended: bool = False  # the slot is done with the run (recorded, handed back or lost)
    # Made by the first waiter only: almost no run is waited on while it runs (a stop, an
    # operator's cancel), and an event a run is a fifth of the slot's calls into anyio.
    _ended_event: anyio.Event | None = None

    def end(self) -> None:
        self.ended = True
        if self._ended_event is not None:
            self._ended_event.set()

    async def wait_ended(self) -> None:
        if self.ended:
            await anyio.lowlevel.checkpoint()  # as an event's wait does: callers loop on it
            return
        if self._ended_event is None:
            self._ended_event = anyio.Event()
        await self._ended_event.wait()

    def cancel(self) -> None:
        self.cancel_requested = True
        self._stop()

    def lose(self) -> None:
        self.lost = True
        self._stop()

    def interrupt(self) -> None:
        self.stopping = True
        self._stop()

    def open_scope(self, scope: anyio.CancelScope) -> bool:
        """The run's code is about to run in `scope`: False if it must not. A cancel, a lost
        lease or a stop that came while its start was being written found no scope to cancel;
        the code would have run on after it (and a drain taken it for code that does not
        stop). Nor may it begin: a cancelled scope stops code only at its first await."""
        self.scope = scope
        return not (self.cancel_requested or self.lost or self.stopping)

    def _stop(self) -> None:
        if self.ctx is not None:
            self.ctx.cancelled = True
        if self.scope is not None:
            self.scope.cancel()
