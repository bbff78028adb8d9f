"""Where runs live: the `RunStore` interface and its in-memory implementation.

Writes are fire-and-forget calls (`save_run`, `add_log`, `cache_put`) so that the runner never
waits on storage; an implementation persists them in order and `flush()` waits until it has.
Reads are async. A PostgreSQL store would implement this same interface.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .models import (
    PENDING_RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
    LogLine,
    Run,
    RunStatus,
    WorkerInfo,
    utcnow,
)


@dataclass(frozen=True, slots=True)
class RunFilter:
    """What the console and the CLI ask for; every field narrows the set."""

    status: tuple[str, ...] | None = None
    workflow: str | None = None
    queue: str | None = None
    text: str | None = None  # matches id, workflow, queue or error
    job_id: str | None = None
    retrying: bool = False  # still going, with a failed attempt behind it
    # Running longer than `stuck` × the median duration of its workflow's completed runs. The
    # engine turns the factor into `stuck_cutoffs` (workflow, epoch seconds a run must have
    # started before) before it asks a store; a workflow with no completed run is never stuck.
    stuck: float | None = None
    stuck_cutoffs: tuple[tuple[str, float], ...] | None = None

    @classmethod
    def of(
        cls,
        status: str | list[str] | tuple[str, ...] | None = None,
        workflow: str | None = None,
        queue: str | None = None,
        text: str | None = None,
        job_id: str | None = None,
        retrying: bool = False,
        stuck: float | None = None,
    ) -> RunFilter:
        if isinstance(status, str):
            status = (status,)
        statuses = tuple(str(RunStatus(s)) for s in status) if status else None
        if stuck is not None and not stuck > 0:
            raise ValueError(f"stuck must be a factor above 0, not {stuck!r}")
        return cls(statuses, workflow, queue, text or None, job_id, retrying, stuck)

    def stuck_before(self) -> dict[str, float] | None:
        if self.stuck is None:
            return None
        if self.stuck_cutoffs is None:
            raise ValueError(
                "RunFilter(stuck=...) needs the medians the engine computes: ask through "
                "Engine.runs / count_runs, not the store directly"
            )
        return dict(self.stuck_cutoffs)

    def matches(self, run: Run) -> bool:
        if self.status and run.status not in self.status:
            return False
        if self.workflow and run.workflow_name != self.workflow:
            return False
        if self.queue and run.queue != self.queue:
            return False
        if self.job_id and run.job_id != self.job_id:
            return False
        if self.retrying and (
            run.terminal or not any(a.error for s in run.steps for a in s.attempts)
        ):
            return False
        cutoffs = self.stuck_before()
        if cutoffs is not None:
            cutoff = cutoffs.get(run.workflow_name)
            if (
                run.status is not RunStatus.RUNNING
                or run.started_at is None
                or cutoff is None
                or run.started_at.timestamp() >= cutoff
            ):
                return False
        if self.text:
            needle = self.text.lower()
            haystack = " ".join(
                (run.id, run.workflow_name, run.queue, run.status, run.error or "")
            ).lower()
            if needle not in haystack:
                return False
        return True


@dataclass(frozen=True, slots=True)
class CacheHit:
    output: Any
    run_id: str


@dataclass(frozen=True, slots=True)
class ControlRequest:
    """An operator's action written by another process (an attached console, the CLI)."""

    id: int
    action: str  # cancel | replay | enqueue | requeue
    run_id: str | None
    payload: dict[str, Any]


class RunStore(ABC):
    kind: str

    async def open(self) -> None:  # noqa: B027 - optional hook
        pass

    async def close(self) -> None:  # noqa: B027 - optional hook
        pass

    @abstractmethod
    def save_run(self, run: Run) -> None:
        """Persist the run as it is now, with its steps and attempts. Does not block."""

    @abstractmethod
    def add_log(self, run: Run, line: LogLine) -> None: ...

    @abstractmethod
    def cache_put(
        self, workflow: str, step: str, key: str, output: Any, run_id: str, ttl_ms: int
    ) -> None: ...

    @abstractmethod
    async def cache_get(self, workflow: str, step: str, key: str) -> CacheHit | None: ...

    async def flush(self) -> None:  # noqa: B027 - nothing buffered by default
        pass

    @abstractmethod
    async def get_run(self, run_id: str) -> Run | None:
        """The run with its steps, attempts and logs."""

    @abstractmethod
    async def list_runs(
        self, where: RunFilter | None = None, limit: int = 100, offset: int = 0
    ) -> list[Run]:
        """Newest first. Steps are included, logs are not."""

    @abstractmethod
    async def count_runs(self, where: RunFilter | None = None) -> int: ...

    @abstractmethod
    async def mark_crashed(self, reason: str, *, workers: list[str] | None = None) -> list[str]:
        """Flip runs left `running` (by these workers, or by anyone) to `crashed`."""

    @abstractmethod
    async def purge(self, finished_before: datetime, limit: int = 500) -> int:
        """Delete terminal runs that finished before the cut-off, and expired cache entries."""

    @abstractmethod
    async def pending_runs(self) -> list[Run]:
        """Runs that wait in a queue (queued, delayed, waiting): to re-enqueue after a restart."""

    # Workers, for boot recovery and the console's worker list.
    @abstractmethod
    def heartbeat(self, worker: WorkerInfo) -> None: ...

    @abstractmethod
    async def workers(self) -> list[WorkerInfo]: ...

    @abstractmethod
    async def forget_worker(self, worker_id: str) -> None: ...

    # Control requests from other processes; a store that cannot be shared needs none.
    async def post_control(
        self, action: str, run_id: str | None, payload: dict[str, Any], target: str | None = None
    ) -> int:
        """Ask the worker `target` (or any worker) to carry out an action; returns its id."""
        raise NotImplementedError("this store is not shared between processes")

    async def take_control(self, worker: str) -> list[ControlRequest]:
        """Requests for this worker (or for anyone) not yet taken, taken atomically."""
        return []

    async def finish_control(self, request_id: int, result: dict[str, Any]) -> None:  # noqa: B027
        pass

    async def control_result(self, request_id: int) -> dict[str, Any] | None:
        return None

    # Queue pauses survive restarts, so they are stored here too.
    @abstractmethod
    async def paused_queues(self) -> set[str]: ...

    @abstractmethod
    async def set_paused(self, queue: str, paused: bool) -> None: ...

    async def change_token(self) -> int:
        """A number that changes whenever another process wrote (attach mode polls it)."""
        return 0


def _copy(run: Run, *, with_logs: bool = True) -> Run:
    copy = run.model_copy(deep=True)
    if not with_logs:
        copy.logs = []
        for step in copy.steps:
            step.logs = []
    return copy


class MemoryRunStore(RunStore):
    """Everything in dicts: fast, and gone when the process ends."""

    kind = "memory"

    def __init__(self) -> None:
        self._runs: dict[str, Run] = {}
        self._cache: dict[tuple[str, str, str], tuple[CacheHit, datetime]] = {}
        self._workers: dict[str, WorkerInfo] = {}
        self._paused: set[str] = set()

    def save_run(self, run: Run) -> None:
        # The engine mutates this very object, so it only needs recording once.
        self._runs[run.id] = run

    def add_log(self, run: Run, line: LogLine) -> None:
        pass  # the line is already on the run object

    def cache_put(
        self, workflow: str, step: str, key: str, output: Any, run_id: str, ttl_ms: int
    ) -> None:
        # Stored as JSON so a cached hit gives a copy, as the SQLite store does.
        frozen = json.loads(json.dumps(output))
        expires = utcnow() + timedelta(milliseconds=ttl_ms)
        self._cache[(workflow, step, key)] = (CacheHit(frozen, run_id), expires)

    async def cache_get(self, workflow: str, step: str, key: str) -> CacheHit | None:
        entry = self._cache.get((workflow, step, key))
        if entry is None or entry[1] <= utcnow():
            return None
        return CacheHit(json.loads(json.dumps(entry[0].output)), entry[0].run_id)

    async def get_run(self, run_id: str) -> Run | None:
        run = self._runs.get(run_id)
        return _copy(run) if run else None

    def _select(self, where: RunFilter | None) -> list[Run]:
        runs = list(self._runs.values())
        if where:
            runs = [run for run in runs if where.matches(run)]
        return runs

    async def list_runs(
        self, where: RunFilter | None = None, limit: int = 100, offset: int = 0
    ) -> list[Run]:
        runs = self._select(where)
        runs.sort(key=lambda run: run.created_at, reverse=True)
        return [_copy(run, with_logs=False) for run in runs[offset : offset + limit]]

    async def count_runs(self, where: RunFilter | None = None) -> int:
        return len(self._select(where)) if where else len(self._runs)

    async def mark_crashed(self, reason: str, *, workers: list[str] | None = None) -> list[str]:
        flipped = []
        now = utcnow()
        for run in self._runs.values():
            if run.status is RunStatus.RUNNING and (workers is None or run.worker in workers):
                run.status = RunStatus.CRASHED
                run.error = reason
                run.finished_at = now
                flipped.append(run.id)
        return flipped

    async def purge(self, finished_before: datetime, limit: int = 500) -> int:
        doomed = [
            run.id
            for run in self._runs.values()
            if run.status in TERMINAL_RUN_STATUSES
            and run.finished_at is not None
            and run.finished_at < finished_before
        ][:limit]
        for run_id in doomed:
            del self._runs[run_id]
        now = utcnow()
        for key in [k for k, (_, expires) in self._cache.items() if expires <= now]:
            del self._cache[key]
        return len(doomed)

    async def pending_runs(self) -> list[Run]:
        return [_copy(r) for r in self._runs.values() if r.status in PENDING_RUN_STATUSES]

    def heartbeat(self, worker: WorkerInfo) -> None:
        self._workers[worker.id] = worker

    async def workers(self) -> list[WorkerInfo]:
        return list(self._workers.values())

    async def forget_worker(self, worker_id: str) -> None:
        self._workers.pop(worker_id, None)

    async def paused_queues(self) -> set[str]:
        return set(self._paused)

    async def set_paused(self, queue: str, paused: bool) -> None:
        if paused:
            self._paused.add(queue)
        else:
            self._paused.discard(queue)
