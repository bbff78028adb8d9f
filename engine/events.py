"""Typed events for a live UI, and the bus that fans them out without blocking the engine.

A subscriber that falls behind loses events rather than slowing the runs down; it is told so
with a `Lagged` event and should re-read what it shows from the store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from time import time

import anyio
from anyio.streams.memory import MemoryObjectSendStream


@dataclass(frozen=True, slots=True)
class Event:
    ts: float = field(default_factory=time, kw_only=True)


@dataclass(frozen=True, slots=True)
class RunQueued(Event):
    run_id: str
    queue: str
    workflow_name: str
    status: str  # queued | delayed


@dataclass(frozen=True, slots=True)
class RunStarted(Event):
    run_id: str
    queue: str
    workflow_name: str


@dataclass(frozen=True, slots=True)
class RunStatusChanged(Event):
    """Any status change that is neither a start nor an end: waiting, throttled, delayed…"""

    run_id: str
    queue: str
    status: str


@dataclass(frozen=True, slots=True)
class RunFinished(Event):
    run_id: str
    queue: str
    workflow_name: str
    status: str
    error: str | None = None


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

    async def subscribe(self) -> AsyncIterator[Event]:
        send, receive = anyio.create_memory_object_stream[Event](self._buffer)
        self._subscribers[send] = 0
        try:
            async with receive:
                async for event in receive:
                    yield event
        finally:
            self._subscribers.pop(send, None)
            send.close()

    def close(self) -> None:
        for stream in list(self._subscribers):
            stream.close()
        self._subscribers.clear()
