"""What the SQLite and PostgreSQL backends share: the database's own queue, and a memory queue
opened on request (`provider="memory"` workflows) whose jobs live in this process while their
runs go to the database's run store."""

from __future__ import annotations

from typing import ClassVar

from .base import Backend, JobQueue, RunStore
from .memory import MemoryQueue
from .providers import provider_refusal


class DatabaseBackend(Backend):
    name: ClassVar[str]  # the database as a sentence names it: "SQLite", "PostgreSQL"
    runs: RunStore
    _durable: JobQueue
    _memory: MemoryQueue | None = None

    def queue(self, provider: str | None) -> JobQueue:
        if provider in (None, self.kind):
            return self._durable
        if provider == "memory":
            if self._memory is None:
                self._memory = MemoryQueue(self.runs, self.clock)
            return self._memory
        raise ValueError(provider_refusal(provider, self.kind))

    @property
    def queues(self) -> tuple[JobQueue, ...]:
        return (self._durable,) if self._memory is None else (self._durable, self._memory)
