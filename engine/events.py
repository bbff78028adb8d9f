"""Typed events for a live UI, and the bus that fans them out without blocking the engine.

A subscriber that falls behind loses events rather than slowing the runs down; it is told so
with a `Lagged` event and should re-read what it shows from the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import time
from typing import TYPE_CHECKING

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

if TYPE_CHECKING:
    from .models import Run


@dataclass(frozen=True, slots=True)
class Event:
    ts: float = field(default_factory=time, kw_only=True)


@dataclass(frozen=True, slots=True)
class RunQueued(Event):
    run_id: str
    queue: str
    workflow_name: str
    status: str  # queued | delayed
    job_id: str | None = None  # the run's job: a change of the run is one of its job

    @classmethod
    def of(cls, run: Run) -> RunQueued:
        return cls(run.id, run.queue, run.workflow_name, str(run.status), job_id=run.job_id)


@dataclass(frozen=True, slots=True)
class RunStarted(Event):
    run_id: str
    queue: str
    workflow_name: str
    job_id: str | None = None

    @classmethod
    def of(cls, run: Run) -> RunStarted:
        return cls(run.id, run.queue, run.workflow_name, job_id=run.job_id)


@dataclass(frozen=True, slots=True)
class RunStatusChanged(Event):
    """Any status change that is neither a start nor an end: waiting, throttled, delayed…"""

    run_id: str
    queue: str
    status: str
    job_id: str | None = None

    @classmethod
    def of(cls, run: Run) -> RunStatusChanged:
        return cls(run.id, run.queue, str(run.status), job_id=run.job_id)


@dataclass(frozen=True, slots=True)
class RunFinished(Event):
    run_id: str
    queue: str
    workflow_name: str
    status: str
    error: str | None = None
    job_id: str | None = None

    @classmethod
    def of(cls, run: Run) -> RunFinished:
        status = str(run.status)
        return cls(run.id, run.queue, run.workflow_name, status, run.error, job_id=run.job_id)


@dataclass(frozen=True, slots=True)
class StepStarted(Event):
    run_id: str
    index: int
    name: str
    attempt: int


@dataclass(frozen=True, slots=True)
class StepFinished(Event):
    run_id: str
    index: int
    name: str
    status: str
    error: str | None = None


@dataclass(frozen=True, slots=True)
class AttemptFailed(Event):
    run_id: str
    index: int
    name: str
    attempt: int
    max_attempts: int
    error: str
    backoff_ms: int | None  # None when no attempt follows


@dataclass(frozen=True, slots=True)
class LogRecorded(Event):
    run_id: str
    step: int | None
    level: str
    message: str


@dataclass(frozen=True, slots=True)
class QueueChanged(Event):
    """A queue was added, removed, paused or re-configured (hot reload, pause)."""

    queue: str


@dataclass(frozen=True, slots=True)
class WorkflowReloaded(Event):
    path: str
    workflows: tuple[str, ...]
    versions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReloadFailed(Event):
    path: str
    message: str  # "file:line: message"


@dataclass(frozen=True, slots=True)
class ReloadErrorCleared(Event):
    path: str


@dataclass(frozen=True, slots=True)
class Lagged(Event):
    """This subscriber dropped events; re-read state from the store."""

    dropped: int


class EventBus:
    def __init__(self, buffer: int = 10_000) -> None:
        self._buffer = buffer
        self._subscribers: dict[MemoryObjectSendStream[Event], int] = {}

    @property
    def active(self) -> bool:
        """Publishers check this first so that nobody listening costs nothing."""
        return bool(self._subscribers)

    def publish(self, event: Event) -> None:
        for stream, dropped in list(self._subscribers.items()):
            try:
                if dropped:
                    stream.send_nowait(Lagged(dropped=dropped))
                    self._subscribers[stream] = 0
                stream.send_nowait(event)
            except anyio.WouldBlock:
                self._subscribers[stream] += 1
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._subscribers.pop(stream, None)

    def subscribe(self) -> Subscription:
        """Registered at once, so no event published after this call is missed."""
        send, receive = anyio.create_memory_object_stream[Event](self._buffer)
        self._subscribers[send] = 0
        return Subscription(self, send, receive)

    def _unsubscribe(self, send: MemoryObjectSendStream[Event]) -> None:
        self._subscribers.pop(send, None)
        send.close()

    def close(self) -> None:
        for stream in list(self._subscribers):
            stream.close()
        self._subscribers.clear()


class Subscription:
    """An async iterator of events; `aclose()` (or leaving `async with`) unsubscribes."""

    def __init__(
        self,
        bus: EventBus,
        send: MemoryObjectSendStream[Event],
        receive: MemoryObjectReceiveStream[Event],
    ) -> None:
        self._bus = bus
        self._send = send
        self._receive = receive

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self._bus._unsubscribe(self._send)
        self._receive.close()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        # An abandoned subscription must not keep receiving (and buffering) events.
        self._bus._subscribers.pop(self._send, None)
