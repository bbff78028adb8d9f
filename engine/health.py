"""Is the system that serves a database healthy? (`engine.health()`, `blok-tui health`)

Healthy means: the database answers (`Backend.health`), at least one worker serves it (alive,
its heartbeat recent: `liveness.worker_state`), and no queue's oldest waiting job (due now, not
started) has waited longer than `max_age`. Paused queues are left out: they hold their jobs on
purpose. A memory queue of another process cannot be seen from here and is left out too.

A worker of this machine whose process is alive but whose heartbeat is older than
`liveness.STALE_HEARTBEAT_S` (suspended by SIGSTOP, or its event loop blocked) is not counted:
it claims nothing. It is named in the reason. Recovery judges it otherwise (it keeps its jobs
until their leases run out) and is not changed by what health says. Workflows served at more
than one version (a rolling deploy, or a worker left behind with old files) are named in a
healthy answer's reason too: otherwise only the workers' logs said so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from .backends.base import Backend, WorkerCatalog
from .durations import format_duration
from .errors import EngineError
from .liveness import GONE, SERVING, LiveWorkers, why_not_serving, worker_state
from .models import QueueInfo, QueueStats, WorkerInfo
from .schedules import overruled_line, overruled_workers
from .versions import shared_queue_line, shared_queues_in, split_line, splits_in

DEFAULT_MAX_AGE_S = 300.0


@dataclass(frozen=True, slots=True)
class Health:
    """What a health check found. `reason`: what is wrong, one line (or, when `ok`, what was
    checked). `waiting`: per queue with waiting jobs, how many seconds its oldest has waited.
    `not_serving`: per worker whose process is alive but serves nothing (suspended or stalled),
    what it is (`liveness.worker_state`); those are not in `workers_alive`."""

    ok: bool
    reason: str
    database: dict[str, Any] = field(default_factory=dict)
    workers_alive: int = 0
    waiting: dict[str, float] = field(default_factory=dict)
    not_serving: dict[str, str] = field(default_factory=dict)
    # Workflows the live workers serve at more than one version (`versions.version_splits`):
    # healthy, but their runs go to whichever worker claims them. Named in the reason.
    version_splits: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # Workflow → the live workers whose own schedules for it do not fire (another version of
    # its file declared last: `schedules.overruled_workers`): healthy, named in the reason.
    schedules_overruled: dict[str, tuple[str, ...]] = field(default_factory=dict)


class HealthReader(Protocol):
    """What a health check reads (the operator API)."""

    backend: Backend

    async def workers(self) -> list[WorkerInfo]: ...

    async def queues(self) -> list[QueueInfo]: ...

    async def oldest_waiting(self, queue: str) -> datetime | None: ...

    async def queue_stats(self, queue: str) -> QueueStats: ...


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
    now = backend.clock.now()  # the clock heartbeats are on
    judged = [(w, worker_state(w, now)) for w in await operator.workers()]
    alive = [w for w, state in judged if state == SERVING]
    frozen = [(w, state) for w, state in judged if state not in (SERVING, GONE)]
    not_serving = {w.id: state for w, state in frozen}
    # Named in the reason, healthy or not: a worker that keeps its jobs and serves none of them.
    silent = "".join(f"; {why_not_serving(w, state, now)}" for w, state in frozen)
    queues = await operator.queues()
    waiting = await _waiting(operator, [q for q in queues if not q.paused])
    if not alive:
        reason = f"no worker alive on {where}{silent}"
        return Health(False, reason, database, 0, waiting, not_serving)
    workers = f"{len(alive)} worker{'s' if len(alive) != 1 else ''} alive"
    if waiting:
        queue, age = max(waiting.items(), key=lambda item: item[1])
        if age > max_age_s:
            return Health(
                False,
                f"queue {queue}: its oldest waiting job has waited {_seconds(age)}, more than "
                f"{_seconds(max_age_s)} ({workers}){silent}",
                database,
                len(alive),
                waiting,
                not_serving,
            )
        oldest = f"oldest waiting job {_seconds(age)} ({queue})"
    else:
        oldest = "no job waiting"
    catalogs = (await LiveWorkers.read(backend)).catalogs  # read once, for both notes
    splits = splits_in(catalogs)
    split = "".join(f"; {split_line(name, v)}" for name, v in sorted(splits.items()))
    shared = "".join(
        f"; {shared_queue_line(queue, names)}"
        for queue, names in sorted(shared_queues_in(catalogs).items())
    )
    failing = _load_errors(catalogs)
    held = await _held(operator, queues)
    states = await backend.shared.schedules()
    overruled = overruled_workers(catalogs, states)
    kept = {state.spec.workflow for state in states}
    schedules = "".join(
        f"; {overruled_line(name, who, any_kept=name in kept)} (blok-tui schedules)"
        for name, who in overruled.items()
    )
    notes = f"{held}{silent}{split}{shared}{schedules}{failing}"
    reason = f"database {where} ok, {workers}, {oldest}{notes}"
    return Health(True, reason, database, len(alive), waiting, not_serving, splits, overruled)


def _load_errors(catalogs: Sequence[WorkerCatalog]) -> str:
    """The workflow files that fail to load on live workers, as a note: the last good version
    of each serves (if there was one), and only the workers' logs and an attached console said
    so. The first is quoted."""
    errors: dict[str, str] = {}
    for catalog in catalogs:
        errors.update(catalog.reload_errors)
    if not errors:
        return ""
    files = f"{len(errors)} workflow file{'s' if len(errors) > 1 else ''} failed to load"
    return f"; {files} on live workers: {sorted(errors.values())[0]}"


async def _held(operator: HealthReader, queues: Sequence[QueueInfo]) -> str:
    """What a healthy answer would hide, as notes: the paused queues that hold jobs (their
    age is not judged: "no job waiting" was said of a paused queue holding 16), and the
    dead letters (a total outage read "healthy" while every job went there)."""
    notes = []
    dead = 0
    for info in queues:
        try:
            stats = await operator.queue_stats(info.name)
        except EngineError:  # removed by a reload meanwhile, or another process's memory
            continue
        dead += stats.dead
        pending = stats.waiting + stats.delayed
        if info.paused and pending:
            notes.append(f"queue {info.name} is paused with {pending:,} job(s) waiting")
        elif not info.served and pending + stats.active:
            # Its queue renamed, its workflow file removed: "no job waiting" had been said.
            notes.append(
                f"queue {info.name} has {pending + stats.active:,} job(s) not ended and no live "
                "worker serves it (was its workflow file removed, or its queue renamed?)"
            )
    if dead:
        notes.append(f"{dead:,} dead letter(s) (blok-tui dead QUEUE)")
    return "".join(f"; {note}" for note in notes)


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
