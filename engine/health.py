"""Is the system that serves a database healthy? (`engine.health()`, `blok-tui health`)

Healthy means: the database answers (`Backend.health`), at least one worker is alive on it, and
no queue's oldest waiting job (due now, not started) has waited longer than `max_age`. Paused
queues are left out: they hold their jobs on purpose. A memory queue of another process cannot
be seen from here and is left out too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from .backends.base import Backend
from .durations import format_duration
from .errors import EngineError
from .models import QueueInfo, WorkerInfo

DEFAULT_MAX_AGE_S = 300.0


@dataclass(frozen=True, slots=True)
class Health:
    """What a health check found. `reason`: what is wrong, one line (or, when `ok`, what was
    checked). `waiting`: per queue with waiting jobs, how many seconds its oldest has waited."""

    ok: bool
    reason: str
    database: dict[str, Any] = field(default_factory=dict)
    workers_alive: int = 0
    waiting: dict[str, float] = field(default_factory=dict)


class HealthReader(Protocol):
    """What a health check reads (the operator API)."""

    backend: Backend

    async def live_workers(self) -> list[WorkerInfo]: ...

    async def queues(self) -> list[QueueInfo]: ...

    async def oldest_waiting(self, queue: str) -> datetime | None: ...


def _seconds(value: float) -> str:
    return format_duration(round(value * 1000))


async def check(operator: HealthReader, max_age_s: float = DEFAULT_MAX_AGE_S) -> Health:
    backend = operator.backend
    where = backend.location
    try:
        database = await backend.health()
    except Exception as error:  # whatever the driver raises is the answer: it does not answer
        return Health(False, f"database {where} does not answer: {type(error).__name__}: {error}")
    if not database.get("ok"):
        return Health(False, f"database {where} is not sound: {database}", database)
    alive = await operator.live_workers()
    waiting = await _waiting(operator, [q for q in await operator.queues() if not q.paused])
    if not alive:
        return Health(False, f"no worker alive on {where}", database, 0, waiting)
    workers = f"{len(alive)} worker{'s' if len(alive) != 1 else ''} alive"
    if waiting:
        queue, age = max(waiting.items(), key=lambda item: item[1])
        if age > max_age_s:
            return Health(
                False,
                f"queue {queue}: its oldest waiting job has waited {_seconds(age)}, more than "
                f"{_seconds(max_age_s)} ({workers})",
                database,
                len(alive),
                waiting,
            )
        oldest = f"oldest waiting job {_seconds(age)} ({queue})"
    else:
        oldest = "no job waiting"
    return Health(True, f"database {where} ok, {workers}, {oldest}", database, len(alive), waiting)


async def _waiting(operator: HealthReader, queues: Sequence[QueueInfo]) -> dict[str, float]:
    now = operator.backend.clock.now()  # the clock a job's times are on
    waiting: dict[str, float] = {}
    for info in queues:
        try:
            since = await operator.oldest_waiting(info.name)
        except EngineError:  # a memory queue of another process: its jobs are not visible here
            continue
        if since is not None:
            waiting[info.name] = max((now - since).total_seconds(), 0.0)
    return waiting


__all__ = ["DEFAULT_MAX_AGE_S", "Health", "check"]
